#pragma once

// The narrow interface between the daemon's core and a memory backend (host
// memfd, CUDA pool). The core owns policy (quotas, ownership, the ledger); a
// backend only hands out and takes back memory.

#include "daemon/core/types.hpp"

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

namespace rmmd::core {

/// One block handed out by a backend.
struct backend_allocation {
  std::size_t bytes{};                   ///< bytes reserved, >= bytes requested
  std::uint64_t offset{};                ///< host backend: offset into the shared fd
  void* address{};                       ///< cuda backend: the pointer in the daemon
  std::vector<std::byte> export_data{};  ///< cuda backend: pointer export data
};

/// A named shared buffer's memory: a block, and, where the backend gives a
/// buffer an allocation of its own (the cuda backend with
/// --cuda-shared-buffer-memory=own), that allocation's handles. Apart from
/// backend_allocation so that the ledger's leases, of which there may be
/// millions, do not carry them.
struct shared_allocation {
  backend_allocation block{};
  int fd{-1};                              ///< its own posix fd (owned by the backend), or -1
  std::vector<std::byte> fabric_handle{};  ///< its own fabric handle, or empty
  std::uint64_t driver_handle{};           ///< the driver's handle of it, or 0
  bool host_memfd{false};                  ///< `fd` is a memfd of its own (host pools)
};

/// Address-stable memory: one or more allocations of their own, which the
/// client maps one after another at the addresses it keeps (several only
/// where memory another allocation of its uid gave back serves it, and the
/// client said it maps several).
struct stable_memory {
  std::vector<shared_allocation> pieces{};

  /// Their bytes together: what the client maps and the pool is charged.
  [[nodiscard]] std::size_t bytes() const noexcept
  {
    std::size_t all = 0;
    for (auto const& p : pieces) { all += p.block.bytes; }
    return all;
  }
};

/// How address-stable memory comes back: memory no client maps any more
/// (a free, a sleep, a failed allocation or wake) may serve its uid again;
/// memory of a session that ended may still be mapped by its process (it
/// is dying, or reconnects keeping its mappings), so it goes to the driver.
enum class stable_return : std::uint8_t { reusable, to_driver };

/// Who asks for address-stable memory, and in how many pieces it may come.
struct stable_request {
  uid_t owner{};
  std::size_t max_pieces{1};
};

/// What the backend itself reports (CUDA's own pool attributes), beside the
/// core's ledger.
struct backend_usage {
  std::uint64_t reserved_bytes{};  ///< memory the backend holds from the system
  std::uint64_t used_bytes{};      ///< memory of that in allocations
};

/// A source of memory. allocate(), deallocate(), trim() and usage() must be
/// thread-safe: the core calls them without its lock, from several threads at
/// once and beside any other call (trim() never beside another trim()). The
/// core serialises every other call.
class pool_backend {
 public:
  pool_backend()                               = default;
  pool_backend(pool_backend const&)            = delete;
  pool_backend& operator=(pool_backend const&) = delete;
  virtual ~pool_backend()                      = default;

  /// What kind of backend this is (the same for every backend of a kind).
  [[nodiscard]] virtual backend_traits traits() const noexcept = 0;

  /// Most bytes this backend can ever hold at once.
  [[nodiscard]] virtual std::size_t capacity() const noexcept = 0;

  /// REQUIRES: bytes > 0, alignment a power of two (the core checks both).
  /// Returns RESOURCE_EXHAUSTED when no block fits, INTERNAL on a system error.
  virtual absl::StatusOr<backend_allocation> allocate(std::size_t bytes, std::size_t alignment) = 0;

  /// REQUIRES: `block` came from allocate() on this backend and was not freed.
  virtual void deallocate(backend_allocation const& block) noexcept = 0;

  /// The daemon is stopping: nothing will be lent from this backend again,
  /// and what is freed from now on is left as it is instead of being made
  /// ready for a next holder. Clients that ride through the restart
  /// (reconnect) still map that memory and keep reading and writing it; a
  /// backend that clears freed memory (the host backend zeroes and punches
  /// it) must stop doing so. REQUIRES: no allocate() after it.
  virtual void stop_lending() noexcept {}

  /// Frees every block of `blocks` (a closing session's leases of this pool,
  /// maybe 100,000), as deallocate() on each would, but at once where the
  /// backend can (the host backend gives adjacent blocks back as one range,
  /// with one hole punched per range). Called like deallocate().
  /// REQUIRES: as for deallocate(), for each block.
  virtual void deallocate_many(std::span<backend_allocation const> blocks) noexcept
  {
    for (auto const& block : blocks) { deallocate(block); }
  }

  /// The memory of a named shared buffer: what allocate() gives unless the
  /// backend has a better way for memory that many processes import (the
  /// cuda backend: an allocation of its own, exported by its own fd).
  virtual absl::StatusOr<shared_allocation> allocate_shared(std::size_t bytes,
                                                            std::size_t alignment)
  {
    auto block = allocate(bytes, alignment);
    if (!block.ok()) { return block.status(); }
    return shared_allocation{.block = *std::move(block)};
  }
  /// REQUIRES: `memory` came from allocate_shared() and was not freed.
  virtual void deallocate_shared(shared_allocation const& memory) noexcept
  {
    deallocate(memory.block);
  }

  /// Address-stable memory of `bytes` (stable_registry.hpp) for
  /// `who.owner`: allocations of their own that the client maps at
  /// addresses it reserved, each exported by a posix fd of its own (`fd`,
  /// owned by the backend), at most `who.max_pieces` of them. FAILED_PRECONDITION where the
  /// backend cannot make such memory (the default: host pools), and
  /// RESOURCE_EXHAUSTED when the device is out of memory. Thread-safe like
  /// allocate().
  virtual absl::StatusOr<stable_memory> allocate_stable(std::size_t /*bytes*/,
                                                        stable_request const& /*who*/)
  {
    return absl::FailedPreconditionError(
        "its pool cannot make address-stable memory (it needs a CUDA pool: an allocation of its "
        "own the client maps at addresses it keeps); use a CUDA pool");
  }
  /// Takes back what allocate_stable() gave `owner`; where `how` is
  /// reusable, the backend may keep it for that uid's next one. REQUIRES:
  /// not freed before. Thread-safe like deallocate().
  virtual void deallocate_stable(stable_memory const& memory,
                                 uid_t /*owner*/,
                                 stable_return /*how*/) noexcept
  {
    for (auto const& piece : memory.pieces) { deallocate_shared(piece); }
  }
  /// Bytes of address-stable memory given back and kept for its uid's next
  /// allocation on this device (the same figure from every pool of it).
  [[nodiscard]] virtual std::size_t spare_bytes() const noexcept
  {
    return 0;
  }

  /// What allocate(bytes) reserves when it succeeds (its rounding), so that
  /// the core can charge that while the backend works. `bytes` if unknown.
  [[nodiscard]] virtual std::size_t reserved_size(std::size_t bytes) const noexcept
  {
    return bytes;
  }

  /// The fd every session receives for this pool (owned by the backend), or -1.
  [[nodiscard]] virtual int shareable_fd() const noexcept
  {
    return -1;
  }

  /// The backend's own view of its usage, where it has one.
  [[nodiscard]] virtual std::optional<backend_usage> usage() const
  {
    return std::nullopt;
  }

  /// The pool's fabric handle when it exports one, else empty.
  [[nodiscard]] virtual std::vector<std::byte> fabric_handle() const
  {
    return {};
  }

  /// Gives the memory the backend holds but does not lend back to the system
  /// (the driver, the kernel) and returns how many bytes it gave back.
  /// INTERNAL on a system error. It may wait (the CUDA pool waits for its
  /// stream) and is called without the core's lock. The default has nothing
  /// to give: the host backend already punches freed pages out of its memfd
  /// on every free.
  virtual absl::StatusOr<std::size_t> trim()
  {
    return std::size_t{0};
  }

  /// Bytes the backend keeps reserved when idle, where it has such a setting
  /// (CUDA pools: cudaMemPoolAttrReleaseThreshold).
  [[nodiscard]] virtual std::optional<std::size_t> release_threshold() const
  {
    return std::nullopt;
  }
};

}  // namespace rmmd::core
