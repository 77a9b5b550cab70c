#pragma once

// This process's views of the shared buffers its session holds: each is
// imported (CUDA) or mapped (host) once per session however often it is
// opened, and counted per open.
//
// Owns: the views, and for a buffer's own allocation (VMM) its mapping here
// (released by unmap_allocation(), after the streams that used it).
//
// Locks: buffers_mutex_ guards buffers_ and is held across an import (once
// per buffer); it is taken before the pool mappings' lock and the channel's
// call_mutex_ (a BufferFd call), never under either.

#include <rmmd/session.hpp>

#include "rmmd/v1/rmmd.pb.h"

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace rmmd::detail {

class pool_mappings;
class session_channel;

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

  struct view {
    void* data{};
    std::uint32_t pool_id{};
    std::size_t refs{};  ///< opens not closed
    /// A CUDA buffer's own allocation, mapped here (0: a pool pointer or
    /// host memory): the driver's handle and the mapped bytes.
    std::uint64_t vmm_handle{};
    std::size_t mapped_bytes{};
    /// A host buffer's own memfd, mapped here (mapped_bytes long), and
    /// whether that mapping is page-locked.
    bool host_mapping{false};
    bool pinned{false};
  };
  /// The view of `grant`'s buffer: the existing one (one more ref), or a new
  /// import. Throws as error.hpp says (the caller closes the open then).
  void* attach(v1::BufferGrant const& grant);
  /// Drops one ref; returns the view when it was the last (the caller then
  /// lets go of a CUDA import, in stream order, before the close goes out).
  std::optional<view> detach(std::uint64_t id) noexcept;
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
  /// attach() of a host pool's buffer: a place in the pool's mapping.
  void* attach_host(v1::BufferGrant const& grant, pool_info const& pool);
  /// attach() of a host buffer's own memfd: mapped (and page-locked in a
  /// pinnable pool, where this process has a GPU). Holds buffers_mutex_.
  void* attach_host_memfd(v1::BufferGrant const& grant, pool_info const& pool);
  /// attach() of a pool pointer: imported into the session's pool import.
  void* attach_pool_pointer(v1::BufferGrant const& grant, pool_info const& pool);
  /// attach() of a buffer's own allocation. Holds buffers_mutex_.
  void* attach_allocation(v1::BufferGrant const& grant, pool_info const& pool);

  session_channel& channel_;
  pool_mappings& pools_;
  bool const import_by_fabric_;
  std::mutex buffers_mutex_;
  std::unordered_map<std::uint64_t, view> buffers_;  // by buffer id
};

}  // namespace rmmd::detail
