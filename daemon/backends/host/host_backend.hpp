#pragma once

#include "daemon/core/offset_allocator.hpp"
#include "daemon/core/pool_backend.hpp"

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>

namespace rmmd::backends::host {

/// Shared host memory: one memfd of a fixed size, sealed against shrinking
/// (F_SEAL_SHRINK | F_SEAL_SEAL) so a client that maps it can never be handed a
/// SIGBUS by someone truncating it. The daemon never maps it; clients map the
/// fd once and address allocations by offset. Pages that a release leaves
/// entirely free are given back to the kernel (fallocate PUNCH_HOLE), so an
/// idle pool costs no RAM; the freed bytes on pages still shared with a live
/// neighbour are overwritten with zeros, so every allocation starts out as
/// zeros (provided its previous holder stopped writing before freeing it).
///
/// A pinnable pool is different: clients page-lock their mapping
/// (cudaHostRegister) to use it from the GPU, and a page punched out under a
/// pinned mapping is silently replaced by a fresh page for everyone else while
/// the GPU keeps the old one (measured on an H100: the device read stale data).
/// So a pinnable pool never punches and never writes: freed bytes keep their
/// contents, as with RMM's pinned host resources, and the RAM stays committed.
///
/// Allocations start and end on multiples of 256 bytes; a capacity that is not
/// a multiple of 256 is rounded down. Thread-safe: allocate() runs beside a
/// deallocate(), which holds the pool until its pages are punched or zeroed
/// (no one may be lent a range before it reads as zeros).
class host_backend final : public core::pool_backend {
 public:
  /// Throws std::system_error, naming the pool, when the memfd cannot be
  /// created, sized or sealed, or when capacity is below 256 bytes (EINVAL).
  /// `tenant` ("uid 1000") goes into the memfd's name, for /proc/PID/maps.
  explicit host_backend(std::string const& name,
                        std::size_t capacity,
                        bool pinnable             = false,
                        std::string const& tenant = {});
  ~host_backend() override;

  /// Shared host memory, lent at offsets of one memfd.
  static constexpr core::backend_traits kind_traits{.name  = "host",
                                                    .space = core::memory_space::host};
  [[nodiscard]] core::backend_traits traits() const noexcept override
  {
    return kind_traits;
  }
  [[nodiscard]] std::size_t capacity() const noexcept override;
  absl::StatusOr<core::backend_allocation> allocate(std::size_t bytes,
                                                    std::size_t alignment) override;
  void deallocate(core::backend_allocation const& block) noexcept override;
  /// Sorts the blocks, gives each run of adjacent ones back as one range and
  /// clears each free range they end up in once (see deallocate()).
  void deallocate_many(std::span<core::backend_allocation const> blocks) noexcept override;
  /// `bytes` rounded up to 256.
  [[nodiscard]] std::size_t reserved_size(std::size_t bytes) const noexcept override
  {
    return (bytes + 255) / 256 * 256;
  }
  [[nodiscard]] int shareable_fd() const noexcept override
  {
    return fd_;
  }
  /// From now on frees neither punch nor zero: the daemon is stopping, and
  /// the clients that reconnect to the next one still map what their
  /// sessions held here.
  void stop_lending() noexcept override;
  /// A shared buffer: a memfd of its own (sized to whole pages and sealed
  /// against resizing), so that a process of another tenant that opens it
  /// maps that buffer and nothing else of the pool. Counted against the
  /// pool's capacity like a lease.
  absl::StatusOr<core::shared_allocation> allocate_shared(std::size_t bytes,
                                                          std::size_t alignment) override;
  void deallocate_shared(core::shared_allocation const& memory) noexcept override;

 private:
  /// Punches the pages of [begin, end) that lie wholly in `now_free` (the
  /// free range that now holds it) and writes zeros over the rest of it.
  /// REQUIRES: mutex_ held; [begin, end) inside `now_free`; not pinnable.
  void clear_locked(std::uint64_t begin,
                    std::uint64_t end,
                    core::offset_allocator::range now_free) noexcept;

  std::string name_;  // for messages
  int fd_{-1};
  std::mutex mutex_;  // guards ranges_ and the file's free pages
  core::offset_allocator ranges_;
  bool pinnable_{false};
  bool lending_{true};  // guarded by mutex_; false once the daemon stops: frees clear nothing
};

}  // namespace rmmd::backends::host
