#pragma once

#include <rmmd/detail/lease_table.hpp>
#include <rmmd/session.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string_view>

namespace rmmd::detail {

/// The shared state behind rmmd::host_memory_resource. Not copyable.
class host_memory_resource_impl {
 public:
  /// `pinned`: page-lock the session's mapping for CUDA (see
  /// session::pinned_host_pool_base).
  host_memory_resource_impl(session s, std::string_view pool_name, bool pinned = false);
  host_memory_resource_impl(host_memory_resource_impl const&)            = delete;
  host_memory_resource_impl& operator=(host_memory_resource_impl const&) = delete;
  /// Frees what is still allocated through it (never throws; nothing while
  /// the process exits).
  ~host_memory_resource_impl();

  /// nullptr for 0 bytes, without a request.
  [[nodiscard]] void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment);
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment) noexcept;
  [[nodiscard]] void* allocate_sync(std::size_t bytes, std::size_t alignment);
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept;

  [[nodiscard]] bool operator==(host_memory_resource_impl const& other) const noexcept
  {
    return this == &other;
  }

  [[nodiscard]] session const& get_session() const noexcept
  {
    return session_;
  }
  [[nodiscard]] std::uint64_t offset_of(void const* ptr) const noexcept
  {
    return static_cast<std::uint64_t>(static_cast<std::byte const*>(ptr) -
                                      base_.load(std::memory_order_acquire));
  }

  friend void get_property(host_memory_resource_impl const&, cuda::mr::host_accessible) noexcept {}

 private:
  /// Has the daemon free lease `id`; never throws.
  void free_lease(std::uint64_t id) noexcept;
  /// This process's mapping of the pool at the daemon of `generation` (a
  /// new one after each reconnect: the new daemon's pool is a new memfd).
  [[nodiscard]] std::byte* base_of(std::uint32_t generation);

  session session_;
  pool_info pool_;
  bool const pinned_;
  /// The mapping of the last lease's daemon (offset_of() reads it), and its generation.
  std::mutex base_mutex_;
  std::atomic<std::byte*> base_{};
  std::uint32_t base_generation_{0};  // guarded by base_mutex_
  lease_table leases_;
  std::atomic<bool> session_over_{false};  // a free failed with session_error
};

}  // namespace rmmd::detail
