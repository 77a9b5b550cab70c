#pragma once

// The one stand-in for a pool_backend in the core's tests: it counts what the
// core asks of it, and can be told to fail, to report a reservation that trim
// gives back, or to stop one call at a gate until the test opens it (a slow
// CUDA export, a free waiting for the driver, a trim waiting for its stream).
// Thread-safe: the core calls it with and without its lock, from several
// threads.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/pool_backend.hpp"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>

namespace rmmd::core {

/// The traits of the two kinds a test's fake stands in for.
inline constexpr backend_traits host_like_traits{.name = "host", .space = memory_space::host};
inline constexpr backend_traits device_like_traits{.name               = "cuda",
                                                   .space              = memory_space::device,
                                                   .packs_small_leases = true,
                                                   .stable_memory      = true};

class fake_pool_backend final : public pool_backend {
 public:
  /// Where its memory comes from.
  enum class memory : std::uint8_t {
    /// A real host_backend (memfd) underneath: real offsets and a pool fd.
    host,
    /// Addresses of its own, far apart, each block with 64 bytes of export
    /// data and rounded to 256 bytes: what a CUDA pool's allocations look
    /// like to the core. Nothing is mapped.
    made_up,
  };

  struct options {
    std::size_t capacity{std::size_t{64} << 20};
    backend_traits traits{host_like_traits};
    memory source{memory::host};
    /// What release_threshold() says; nullopt: it has none.
    std::optional<std::size_t> release_threshold{};
    /// Pieces allocate_stable() makes where the caller takes that many (as
    /// the cuda backend does from spares of the uid).
    std::size_t stable_pieces{1};
    /// Where set, counts each deallocate_stable() by how the memory came
    /// back (it outlives the backend, which a tenant's last session takes).
    std::shared_ptr<std::map<stable_return, int>> stable_returns{};
  };

  /// The call a gate can stop (see hold_next()).
  enum class call : std::uint8_t { allocate, deallocate, trim };

  explicit fake_pool_backend(options o)
      : options_(o), host_("fake", o.source == memory::host ? o.capacity : 256)
  {
  }

  [[nodiscard]] backend_traits traits() const noexcept override
  {
    return options_.traits;
  }
  [[nodiscard]] std::size_t capacity() const noexcept override
  {
    return options_.source == memory::host ? host_.capacity() : options_.capacity;
  }
  [[nodiscard]] int shareable_fd() const noexcept override
  {
    return options_.source == memory::host ? host_.shareable_fd() : -1;
  }

  absl::StatusOr<backend_allocation> allocate(std::size_t bytes, std::size_t alignment) override
  {
    wait_at_gate(call::allocate);
    std::lock_guard lock(mutex_);
    ++allocate_calls_;
    if (failures_ > 0) {
      --failures_;
      return failure_;
    }
    auto block = options_.source == memory::host ? host_.allocate(bytes, alignment)
                                                 : made_up_allocation(bytes);
    if (block.ok()) {
      ++allocations_;
      ++live_blocks_;
      live_bytes_ += block->bytes;
    }
    return block;
  }

  void deallocate(backend_allocation const& block) noexcept override
  {
    wait_at_gate(call::deallocate);
    std::lock_guard lock(mutex_);
    ++deallocations_;
    give_back_locked(block);
  }

  void deallocate_many(std::span<backend_allocation const> blocks) noexcept override
  {
    std::lock_guard lock(mutex_);
    ++batches_;
    deallocations_ += blocks.size();
    if (options_.source == memory::host) {
      for (auto const& block : blocks) {
        --live_blocks_;
        live_bytes_ -= block.bytes;
      }
      host_.deallocate_many(blocks);
      return;
    }
    for (auto const& block : blocks) { give_back_locked(block); }
  }

  /// Address-stable memory (traits with stable_memory, as the cuda backend): rounded
  /// to 2 MiB, counted against the device limit with the blocks, with an
  /// empty memfd as its fd. Fails as allocate() does (fail_next()).
  absl::StatusOr<stable_memory> allocate_stable(std::size_t bytes,
                                                stable_request const& who) override
  {
    if (!options_.traits.stable_memory) { return pool_backend::allocate_stable(bytes, who); }
    wait_at_gate(call::allocate);
    std::lock_guard lock(mutex_);
    ++allocate_calls_;
    if (failures_ > 0) {
      --failures_;
      return failure_;
    }
    auto const size   = (bytes + stable_granularity - 1) / stable_granularity * stable_granularity;
    auto const device = std::min(options_.capacity, device_limit_);
    if (size > device - std::min(device, live_bytes_)) {
      return absl::ResourceExhaustedError("cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (fake)");
    }
    // Pieces of whole granules, the last one taking what is left.
    auto const granules = size / stable_granularity;
    auto const count =
        std::min({options_.stable_pieces, std::max<std::size_t>(who.max_pieces, 1), granules});
    stable_memory out;
    for (std::size_t i = 0; i < count; ++i) {
      auto const bytes = i + 1 < count
                             ? granules / count * stable_granularity
                             : size - (count - 1) * (granules / count) * stable_granularity;
      int const fd     = ::memfd_create("fake-stable", MFD_CLOEXEC);
      if (fd < 0) {
        for (auto const& p : out.pieces) { ::close(p.fd); }
        return absl::InternalError("memfd_create");
      }
      out.pieces.push_back(
          shared_allocation{.block = {.bytes = bytes}, .fd = fd, .driver_handle = ++next_handle_});
    }
    ++allocations_;
    ++live_stable_;
    live_bytes_ += size;
    return out;
  }
  void deallocate_stable(stable_memory const& memory,
                         uid_t /*owner*/,
                         stable_return how) noexcept override
  {
    std::lock_guard lock(mutex_);
    if (options_.stable_returns) { ++(*options_.stable_returns)[how]; }
    ++deallocations_;
    --live_stable_;
    for (auto const& piece : memory.pieces) {
      live_bytes_ -= piece.block.bytes;
      ::close(piece.fd);
    }
  }
  /// Address-stable allocations made and not freed.
  [[nodiscard]] std::size_t live_stable() const
  {
    std::lock_guard lock(mutex_);
    return live_stable_;
  }
  static constexpr std::size_t stable_granularity = std::size_t{2} << 20;

  [[nodiscard]] std::optional<backend_usage> usage() const override
  {
    std::lock_guard lock(mutex_);
    if (!reserved_) { return std::nullopt; }
    return backend_usage{.reserved_bytes = *reserved_, .used_bytes = 0};
  }

  /// Gives back what set_reserved() called releasable, or fails as
  /// fail_trim() said.
  absl::StatusOr<std::size_t> trim() override
  {
    wait_at_gate(call::trim);
    std::lock_guard lock(mutex_);
    ++trim_calls_;
    if (!trim_failure_.ok()) { return trim_failure_; }
    auto const released = releasable_;
    if (reserved_) { *reserved_ -= released; }
    releasable_ = 0;
    return static_cast<std::size_t>(released);
  }

  [[nodiscard]] std::optional<std::size_t> release_threshold() const override
  {
    return options_.release_threshold;
  }

  // What the core asked of it.
  [[nodiscard]] std::size_t live_blocks() const
  {
    std::lock_guard lock(mutex_);
    return live_blocks_;
  }
  [[nodiscard]] std::size_t live_bytes() const
  {
    std::lock_guard lock(mutex_);
    return live_bytes_;
  }
  [[nodiscard]] std::size_t allocate_calls() const
  {
    std::lock_guard lock(mutex_);
    return allocate_calls_;
  }
  /// allocate() calls that succeeded.
  [[nodiscard]] std::size_t allocations() const
  {
    std::lock_guard lock(mutex_);
    return allocations_;
  }
  /// Blocks given back, by deallocate() or deallocate_many().
  [[nodiscard]] std::size_t deallocations() const
  {
    std::lock_guard lock(mutex_);
    return deallocations_;
  }
  /// deallocate_many() calls.
  [[nodiscard]] std::size_t batches() const
  {
    std::lock_guard lock(mutex_);
    return batches_;
  }
  [[nodiscard]] int trim_calls() const
  {
    std::lock_guard lock(mutex_);
    return trim_calls_;
  }

  /// The next `times` allocate() calls answer `status` instead.
  void fail_next(absl::Status status, int times = 1)
  {
    std::lock_guard lock(mutex_);
    failure_  = std::move(status);
    failures_ = times;
  }
  /// Made-up memory: less device memory than the capacity the core counts
  /// with, as when other processes took some of the GPU.
  void set_device_limit(std::size_t bytes)
  {
    std::lock_guard lock(mutex_);
    device_limit_ = bytes;
  }
  /// usage() reports `reserved` bytes from the system; trim() gives
  /// `releasable` of them back.
  void set_reserved(std::uint64_t reserved, std::uint64_t releasable)
  {
    std::lock_guard lock(mutex_);
    reserved_   = reserved;
    releasable_ = releasable;
  }
  void fail_trim(absl::Status status)
  {
    std::lock_guard lock(mutex_);
    trim_failure_ = std::move(status);
  }

  /// The next call `c` stops at the gate until open_gate(); returns a future
  /// that is ready once it has stopped there.
  std::future<void> hold_next(call c)
  {
    std::lock_guard lock(mutex_);
    entered_   = {};
    opened_    = {};
    gate_      = opened_.get_future().share();
    gate_open_ = false;
    armed_     = c;
    return entered_.get_future();
  }
  /// Lets the held call go on (once; later calls do nothing).
  void open_gate()
  {
    std::lock_guard lock(mutex_);
    if (!gate_open_) {
      gate_open_ = true;
      opened_.set_value();
    }
  }
  /// Opens the gate when it goes out of scope, so that a failed assertion
  /// cannot leave a thread waiting at it (and the test hanging).
  class gate_opener {
   public:
    explicit gate_opener(fake_pool_backend* backend) : backend_(backend) {}
    gate_opener(gate_opener const&)            = delete;
    gate_opener& operator=(gate_opener const&) = delete;
    ~gate_opener()
    {
      backend_->open_gate();
    }

   private:
    fake_pool_backend* backend_;
  };

 private:
  void wait_at_gate(call c)
  {
    std::shared_future<void> gate;
    {
      std::lock_guard lock(mutex_);
      if (armed_ != c) { return; }
      armed_.reset();
      gate = gate_;
      entered_.set_value();
    }
    gate.wait();
  }

  absl::StatusOr<backend_allocation> made_up_allocation(std::size_t bytes)
  {
    auto const size   = (bytes + 255) / 256 * 256;
    auto const device = std::min(options_.capacity, device_limit_);
    if (size > device - std::min(device, live_bytes_)) {
      return absl::ResourceExhaustedError("out of device memory");
    }
    next_ += std::size_t{64} << 20;  // far apart: no two blocks overlap
    backend_allocation out{.bytes = size, .address = reinterpret_cast<void*>(next_)};
    out.export_data.assign(64, std::byte{static_cast<unsigned char>(allocate_calls_)});
    made_up_.insert(next_);
    return out;
  }

  void give_back_locked(backend_allocation const& block) noexcept
  {
    --live_blocks_;
    live_bytes_ -= block.bytes;
    if (options_.source == memory::host) {
      host_.deallocate(block);
      return;
    }
    EXPECT_EQ(made_up_.erase(reinterpret_cast<std::uintptr_t>(block.address)), 1u) << "freed twice";
  }

  options const options_;
  backends::host::host_backend host_;
  mutable std::mutex mutex_;
  std::size_t live_blocks_{};
  std::size_t live_bytes_{};
  std::size_t allocate_calls_{};
  std::size_t allocations_{};
  std::size_t deallocations_{};
  std::size_t batches_{};
  int trim_calls_{};
  absl::Status failure_{};
  int failures_{};
  std::size_t device_limit_{SIZE_MAX};
  std::uintptr_t next_{0x7f0000000000};
  std::size_t live_stable_{};
  std::uint64_t next_handle_{};
  std::set<std::uintptr_t> made_up_;
  std::optional<std::uint64_t> reserved_{};
  std::uint64_t releasable_{};
  absl::Status trim_failure_{};
  std::optional<call> armed_{};
  std::promise<void> entered_;
  std::promise<void> opened_;
  std::shared_future<void> gate_;
  bool gate_open_{true};
};

}  // namespace rmmd::core
