#pragma once

#include "daemon/backends/cuda/spare_memory.hpp"
#include "daemon/core/pool_backend.hpp"

#include <rmm/mr/cuda_async_memory_resource.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace rmmd::backends::cuda {

/// The streams a device's pools allocate and free on: one for frees and
/// trims, and a few for allocations, so that one thread's synchronisation
/// seldom waits for another's allocation. Shared by every tenant's pool of a
/// device (making nine streams per tenant's pool cost a third of its first
/// session's set-up). Thread-safe, as CUDA streams are.
class cuda_streams {
 public:
  /// As many as the daemon has threads that allocate at once (the session
  /// listener's four call threads), and a few more for gRPC's.
  static constexpr std::size_t allocation_stream_count = 8;

  /// Throws std::runtime_error naming what failed.
  explicit cuda_streams(int device);
  cuda_streams(cuda_streams const&)            = delete;
  cuda_streams& operator=(cuda_streams const&) = delete;
  ~cuda_streams();

  [[nodiscard]] cudaStream_t free_stream() const noexcept
  {
    return free_;
  }
  /// The next allocation stream in turn.
  [[nodiscard]] cudaStream_t next_allocation_stream() noexcept
  {
    return allocation_[next_.fetch_add(1, std::memory_order_relaxed) % allocation_.size()];
  }

 private:
  void destroy() noexcept;

  int device_{};
  cudaStream_t free_{};
  std::array<cudaStream_t, allocation_stream_count> allocation_{};
  std::atomic<std::size_t> next_{0};
};

struct cuda_pool_options {
  int device{0};
  std::size_t capacity{};           ///< most bytes the pool may lend
  std::size_t release_threshold{};  ///< bytes the pool keeps reserved when idle
  std::size_t initial_size{};       ///< bytes reserved from the driver at creation; 0: none
  /// Also export a fabric handle. REQUIRES: probe_fabric() said it works on
  /// this device (a failed fabric export makes the pool's destruction crash).
  bool fabric{false};
  /// Shared buffers as allocations of their own (allocate_shared), not
  /// pointers of the pool (--cuda-shared-buffer-memory=own). Buffers
  /// larger than largest_pool_pointer are their own either way.
  bool vmm_buffers{false};
  /// The device's streams, shared with its other pools; null: the pool
  /// makes its own.
  std::shared_ptr<cuda_streams> streams{};
  /// Where address-stable memory given back waits for its uid's next
  /// allocation (the device's, shared with its other pools); null: it goes
  /// back to the driver at once.
  std::shared_ptr<spare_memory> spares{};
};

/// The largest shared buffer served as a pointer of the pool: the driver of
/// CUDA 13.0 kills a process that imports a pool pointer of about 5.5 GiB or
/// more (bench/experiments/large_pool_import.cu; 5 GiB works), so a larger
/// buffer is an allocation of its own whatever --cuda-shared-buffer-memory
/// says (as ipc_resource_options::own_allocation_above does for leases).
inline constexpr std::size_t largest_pool_pointer = std::size_t{4} << 30;

/// One CUDA memory pool: an RMM cuda_async_memory_resource created with the
/// posix-fd export handle type (and fabric, where proven). The pool is exported once (its fd goes
/// to every session, which imports it once) and every allocation is exported as
/// cudaMemPoolPtrExportData for the client to import.
///
/// Allocation happens on the backend's own stream, which is synchronised
/// before the export: the memory is ready on any stream of any process once
/// the client has the reply. allocate() runs on several threads at once, each
/// call on the next of a few allocation streams in turn (so one thread's
/// synchronisation seldom waits for another's allocation); the other calls
/// come under the core's lock and free on the backend's main stream.
class cuda_backend final : public core::pool_backend {
 public:
  /// Throws rmm::cuda_error / std::runtime_error naming what failed.
  explicit cuda_backend(cuda_pool_options options);
  ~cuda_backend() override;

  /// Device memory; small leases packed into blocks a session imports once.
  static constexpr core::backend_traits kind_traits{.name  = "cuda",
                                                    .space = core::memory_space::device,
                                                    .packs_small_leases = true,
                                                    .stable_memory      = true};
  [[nodiscard]] core::backend_traits traits() const noexcept override
  {
    return kind_traits;
  }
  [[nodiscard]] std::size_t capacity() const noexcept override
  {
    return options_.capacity;
  }
  absl::StatusOr<core::backend_allocation> allocate(std::size_t bytes,
                                                    std::size_t alignment) override;
  void deallocate(core::backend_allocation const& block) noexcept override;
  /// deallocate() of each block, with the device made current once.
  void deallocate_many(std::span<core::backend_allocation const> blocks) noexcept override;
  /// A shared buffer: one allocation of its own (cuMemCreate), exported by
  /// its own posix fd (and fabric handle where the pool has one), which
  /// importers map in a fraction of a pool pointer's import time
  /// (common/vmm.hpp says why). Rounded up to the driver's granularity.
  absl::StatusOr<core::shared_allocation> allocate_shared(std::size_t bytes,
                                                          std::size_t alignment) override;
  void deallocate_shared(core::shared_allocation const& memory) noexcept override;
  /// Allocations of their own (cuMemCreate, posix fd), whatever
  /// vmm_buffers says: the owner's spares where they serve (spare_memory.hpp),
  /// and one new allocation for the rest. See pool_backend::allocate_stable().
  absl::StatusOr<core::stable_memory> allocate_stable(std::size_t bytes,
                                                      core::stable_request const& who) override;
  /// Kept as the owner's spares where the pool keeps them and `how` allows;
  /// else released.
  void deallocate_stable(core::stable_memory const& memory,
                         uid_t owner,
                         core::stable_return how) noexcept override;
  [[nodiscard]] std::size_t spare_bytes() const noexcept override
  {
    return options_.spares ? options_.spares->bytes() : 0;
  }
  /// `bytes` rounded up to 256.
  [[nodiscard]] std::size_t reserved_size(std::size_t bytes) const noexcept override
  {
    return (bytes + 255) / 256 * 256;
  }
  [[nodiscard]] int shareable_fd() const noexcept override
  {
    return fd_;
  }
  [[nodiscard]] std::optional<core::backend_usage> usage() const override;
  /// Waits for the pool's stream (frees queued on it return their memory to
  /// the pool), then cudaMemPoolTrimTo(pool, 0): what no allocation uses goes
  /// back to the driver, and so do the device's spares.
  absl::StatusOr<std::size_t> trim() override;
  /// The pool's cudaMemPoolAttrReleaseThreshold.
  [[nodiscard]] std::optional<std::size_t> release_threshold() const override;
  [[nodiscard]] std::vector<std::byte> fabric_handle() const override
  {
    return fabric_;
  }

 private:
  /// cuMemCreate of `bytes` rounded to the driver's granularity, exported
  /// by a posix fd (and a fabric handle with `fabric`).
  absl::StatusOr<core::shared_allocation> allocate_own(std::size_t bytes,
                                                       std::size_t alignment,
                                                       bool fabric);
  /// The driver's granularity for this pool's allocations of their own.
  absl::StatusOr<std::size_t> own_granularity(bool fabric) const;
  /// After an allocation found the device full: gives the spares back and
  /// says whether any came back to the driver since `released_before`
  /// (spare_memory::released()), by this or by their expiry.
  bool spares_came_back(std::uint64_t released_before) noexcept;

  cuda_pool_options options_;
  std::unique_ptr<rmm::mr::cuda_async_memory_resource> mr_;  // never null once built
  std::shared_ptr<cuda_streams> streams_;                    // never null once built
  int fd_{-1};
  std::vector<std::byte> fabric_;
};

/// Number of CUDA devices; 0 when there is no GPU or no driver.
int device_count() noexcept;

/// Bytes the driver counts as used on `device` (cudaMemGetInfo's total
/// minus free: every process's), or nullopt if it cannot say.
std::optional<std::size_t> driver_used_bytes(int device) noexcept;

}  // namespace rmmd::backends::cuda
