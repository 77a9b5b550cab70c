#pragma once

// This process's views of the shared buffers its session holds: each is
// imported (CUDA) or mapped (host) once per session and access however often
// it is opened, and counted per open.
//
// Access: an open for reading of a buffer of its own allocation (a CUDA
// buffer's VMM allocation, by fd or fabric handle, or a host buffer's memfd)
// is mapped read-only: cuMemSetAccess with CU_MEM_ACCESS_FLAGS_PROT_READ, or
// mmap with PROT_READ (page-locked with cudaHostRegisterReadOnly where the
// pool is pinnable, the open's pinning asks for it and the device supports
// it, else not page-locked). The
// creator's and READ_WRITE opens map it read-write. A process that holds the
// same buffer both ways has two views of it, one of each access, at two
// addresses (a second import of the same memory): upgrading one mapping in
// place would let the reader's pointer write, and taking the upgrade back
// while streams may still use it is not safe. Buffers served as pool
// pointers (--cuda-shared-buffer-memory=pool) and host buffers placed in the
// pool's own mapping (older daemons) cannot be mapped read-only: they have
// one read-write view whatever the access, and READ is the API's contract
// only there.
//
// A standby open (docs/failover.md) has a view of its own, mapped read-only
// where the memory allows until upgrade() makes that same mapping
// read-write in place at the grant (cuMemSetAccess on the same range;
// mprotect of a host mapping, whose memfd the daemon handed over
// read-write): its address never changes, so graphs captured against it
// stay valid. A reader's view is never upgraded.
//
// Owns: the views, and for a buffer's own allocation (VMM) its mapping here
// (released by unmap_allocation(), after the streams that used it); the
// peer anchors' mappings (released when it goes).
//
// Locks: buffers_mutex_ guards buffers_ and is held across an import (once
// per buffer); it is taken before the pool mappings' lock and the channel's
// call_mutex_ (a BufferFd call), never under either.

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include "rmmd/v1/rmmd.pb.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rmmd::detail {

class pool_mappings;
class session_channel;

/// Which view of a buffer an open has.
enum class view_mode : std::uint8_t {
  read_write,
  read_only,  ///< where the memory can be mapped so; else the read-write view
  standby,    ///< its own view: read-only where it can be until upgrade()
};

class buffer_views {
 public:
  /// Both outlive this object. `import_by_fabric`: a buffer's own allocation
  /// is imported by its fabric handle where it has one.
  buffer_views(session_channel& channel, pool_mappings& pools, bool import_by_fabric) noexcept
      : channel_(channel), pools_(pools), import_by_fabric_(import_by_fabric)
  {
  }
  buffer_views(buffer_views const&)            = delete;
  buffer_views& operator=(buffer_views const&) = delete;
  /// Lets go of the peer anchors (no CUDA call while the process exits).
  ~buffer_views();

  struct view {
    void* data{};
    bool read_only{false};  ///< mapped for reading only
    std::uint32_t pool_id{};
    std::size_t refs{};  ///< opens not closed
    /// A CUDA buffer's own allocation, mapped here (0: a pool pointer or
    /// host memory): the driver's handle and the mapped bytes.
    std::uint64_t vmm_handle{};
    std::size_t mapped_bytes{};
    /// A host buffer's own memfd, mapped here (mapped_bytes long).
    bool host_mapping{false};
    /// A host buffer's mapping (its memfd's, or its pool's) page-locked.
    bool pinned{false};
    int device{-1};  ///< where a VMM allocation is mapped
  };
  /// The view of `grant`'s buffer for `mode` (read-only where the buffer's
  /// memory can be mapped so; else the read-write one): the existing one
  /// (one more ref), or a new import. A standby view is read-only where it
  /// can be unless `holds_lease`. A host buffer's view is page-locked as
  /// `pin` says (an existing one, unlocked, is page-locked for
  /// pinning::required). Throws as error.hpp says (the caller closes the
  /// open then).
  void* attach(v1::BufferGrant const& grant,
               view_mode mode,
               bool holds_lease = false,
               pinning pin      = pinning::automatic);
  /// Whether the view of buffer `id` that an open of `mode` got is a
  /// page-locked host mapping.
  [[nodiscard]] bool pinned(std::uint64_t id, view_mode mode);
  /// Makes the standby view of buffer `id` read-write in place (nothing
  /// where it is read-write already). Throws rmm::bad_alloc naming the
  /// CUDA or mprotect error; the view stays read-only then.
  void upgrade(std::uint64_t id);
  /// attach() of a buffer of another node (grant.peer() set): its fabric
  /// handle imported, whatever import_by_fabric says (it has no fd here),
  /// and mapped on this process's CUDA device `device`, read-only where
  /// `read_only`. Throws as error.hpp says (no usable VMM driver API, an
  /// import the IMEX channel refuses, named). Maps the grant's peer anchor
  /// too, the first time for its GPU and `device` (peer_anchors()).
  void* attach_remote(v1::BufferGrant const& grant, bool read_only, int device);

  /// A granule of another node's GPU (BufferGrant.peer_anchor) this session
  /// keeps mapped on one of this process's devices until it ends, whatever
  /// it opens and closes meanwhile: the driver keeps its mapping between the
  /// two GPUs only while some memory of the one is mapped on the other, and
  /// making that mapping is most of a first remote open (about 9 ms).
  struct peer_anchor {
    std::string gpu_uuid;
    int device{-1};
  };
  /// The anchors kept, by GPU and device.
  [[nodiscard]] std::vector<peer_anchor> peer_anchors();
  /// Drops one ref of the view an open of `mode` got; returns the view when
  /// it was the last (the caller then lets go of a CUDA import, in stream
  /// order, before the close goes out).
  std::optional<view> detach(std::uint64_t id, view_mode mode) noexcept;
  /// Unmaps and releases a view of a buffer's own allocation (vmm_handle set).
  /// REQUIRES: the work of every stream that used it is done.
  static void unmap_allocation(view const& v) noexcept;
  /// Unpins and unmaps a view of a host buffer's own memfd (host_mapping
  /// set). REQUIRES: nothing uses it any more (streams included).
  static void unmap_host(view const& v) noexcept;
  /// The fd of a buffer's own allocation (BufferFd, on the session socket
  /// whatever transport the other calls take: only it carries fds). The
  /// caller owns it. Throws as error.hpp says.
  int buffer_fd(std::uint64_t id);

 private:
  /// attach() of a host pool's buffer: a place in the pool's mapping,
  /// which `pin` may page-lock (the whole pool, once per session).
  view attach_host(v1::BufferGrant const& grant, pool_info const& pool, pinning pin);
  /// attach() of a host buffer's own memfd: mapped, and page-locked as
  /// `pin` says. Holds buffers_mutex_.
  void* attach_host_memfd(v1::BufferGrant const& grant,
                          pool_info const& pool,
                          view_mode mode,
                          bool read_only,
                          pinning pin);
  /// An existing host view `v` page-locked for pinning::required (nothing
  /// where it is already). Throws as attach() does; `v` is unchanged then.
  void pin_view(view& v, v1::BufferGrant const& grant, pool_info const& pool);
  /// attach() of a pool pointer: imported into the session's pool import.
  void* attach_pool_pointer(v1::BufferGrant const& grant, pool_info const& pool);
  /// attach() of a buffer's own allocation. Holds buffers_mutex_.
  void* attach_allocation(v1::BufferGrant const& grant,
                          pool_info const& pool,
                          view_mode mode,
                          bool read_only);
  /// Imports grant's own allocation (by fabric handle where `by_fabric` and
  /// it has one, else by its fd) and maps it on `device`; the new view is
  /// kept. Holds buffers_mutex_.
  void* map_allocation(
      v1::BufferGrant const& grant, int device, view_mode mode, bool read_only, bool by_fabric);

  /// Maps grant's peer anchor on `device`, read-only, unless one of its GPU
  /// is kept there already (or failed: not tried again). Never throws: the
  /// open goes on without it. REQUIRES: buffers_mutex_ held.
  void keep_peer_anchor(v1::BufferGrant const& grant, int device) noexcept;

  /// A kept anchor's mapping (0s: its mapping failed).
  struct anchor_mapping {
    std::uint64_t vmm_handle{};
    std::uint64_t address{};
    std::size_t bytes{};
  };

  session_channel& channel_;
  pool_mappings& pools_;
  bool const import_by_fabric_;
  std::mutex buffers_mutex_;
  /// By buffer id and mode (read_write for memory that cannot be mapped
  /// read-only, whatever the access).
  std::map<std::pair<std::uint64_t, view_mode>, view> buffers_;
  /// By the peer GPU's UUID and this process's device; guarded by
  /// buffers_mutex_.
  std::map<std::pair<std::string, int>, anchor_mapping> anchors_;
};

}  // namespace rmmd::detail
