#pragma once

#include "daemon/backends/host/offset_allocator.hpp"
#include "daemon/core/pool_backend.hpp"

#include <cstddef>
#include <string>

namespace rmmd::backends::host {

/// Shared host memory: one memfd of a fixed size, sealed against shrinking
/// (F_SEAL_SHRINK | F_SEAL_SEAL) so a client that maps it can never be handed a
/// SIGBUS by someone truncating it. The daemon never maps it; clients map the
/// fd once and address allocations by offset. Freed ranges are given back to
/// the kernel (fallocate PUNCH_HOLE on whole pages) so an idle pool costs no
/// RAM and the next holder of those pages reads zeros.
class host_backend final : public core::pool_backend {
 public:
  /// Throws std::system_error when the memfd cannot be created or sized.
  explicit host_backend(std::string const& name, std::size_t capacity);
  ~host_backend() override;

  [[nodiscard]] core::backend_kind kind() const noexcept override
  {
    return core::backend_kind::host;
  }
  [[nodiscard]] std::size_t capacity() const noexcept override;
  absl::StatusOr<core::backend_allocation> allocate(std::size_t bytes,
                                                    std::size_t alignment) override;
  void deallocate(core::backend_allocation const& block) noexcept override;
  [[nodiscard]] int shareable_fd() const noexcept override
  {
    return fd_;
  }

 private:
  int fd_{-1};
  offset_allocator ranges_;
};

}  // namespace rmmd::backends::host
