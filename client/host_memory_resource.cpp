#include <rmmd/host_memory_resource.hpp>

#include "client/detail/process_exit.hpp"
#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "client/detail/stderr_line.hpp"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <exception>
#include <string>

namespace rmmd::detail {

host_memory_resource_impl::host_memory_resource_impl(session s,
                                                     std::string_view pool_name,
                                                     bool pinned)
    : session_(std::move(s)),
      pool_(pool_name.empty() ? session_.host_pool() : session_.pool(pool_name)),
      pinned_(pinned)
{
  if (pool_.backend != backend_kind::host) {
    throw rmmd::logic_error("rmmd: pool '" + std::string(pool_name) +
                            "' is not a host pool; use rmmd::ipc_memory_resource for device pools");
  }
  auto& mappings    = detail::impl_of(session_).mappings();
  auto const latest = mappings.latest();
  base_.store(pinned ? mappings.pinned_host_pool_base(pool_.id, latest)
                     : mappings.host_pool_base(pool_.id, latest));
  base_generation_ = latest;
  // Page-locking the pool started CUDA; a plain mapping did not.
  if (pinned) {
    watch_process_exit();
  } else {
    watch_process_exit_before_cuda();
  }
}

host_memory_resource_impl::~host_memory_resource_impl()
{
  if (process_is_exiting()) { return; }  // the daemon reclaims at session close
  for (auto const& [ptr, id] : leases_.take_all()) { free_lease(id); }
}

void host_memory_resource_impl::free_lease(std::uint64_t id) noexcept
{
  // Once the session is over (the daemon died, or closed it), no free can
  // reach it, and a restarted daemon knows nothing of these leases: say so
  // once, not once per allocation.
  if (session_over_.load(std::memory_order_relaxed)) { return; }
  try {
    session_.free(id);
  } catch (rmmd::session_error const& e) {
    if (!session_over_.exchange(true)) {
      rmmd::detail::stderr_line(
          "%s; the memory stays mapped in this process, and this resource sends no "
          "more frees\n",
          e.what());
    }
  } catch (std::exception const& e) {
    // Not fatal: the daemon frees the allocation when the session closes.
    rmmd::detail::stderr_line("%s\n", e.what());
  }
}

void* host_memory_resource_impl::allocate_sync(std::size_t bytes, std::size_t alignment)
{
  // RMM's contract: zero bytes is no memory and no error (and asks nothing of
  // the daemon, which refuses size 0 on the wire).
  if (bytes == 0) { return nullptr; }
  // More than the pool holds can never be had: out of memory, as RMM's own
  // resources say for a request no pool can hold (the daemon would call the
  // size invalid).
  if (bytes > pool_.capacity_bytes) {
    throw rmm::out_of_memory("rmmd: allocate " + std::to_string(bytes) + " bytes from pool '" +
                             pool_.name + "': larger than the pool's capacity of " +
                             std::to_string(pool_.capacity_bytes) +
                             " bytes; ask for less, or have the operator give the pool more");
  }
  auto granted = detail::impl_of(session_).lease_memory(pool_.id, bytes, alignment, false);
  auto& lease  = granted.granted;
  std::byte* base{};
  try {
    base = base_of(granted.generation);
  } catch (...) {
    free_lease(lease.id);
    throw;
  }
  void* ptr = base + lease.host_offset;
  leases_.add(ptr, lease.id);
  return ptr;
}

std::byte* host_memory_resource_impl::base_of(std::uint32_t generation)
{
  // Each allocation makes a round trip: a lock here costs nothing that shows.
  std::lock_guard lock(base_mutex_);
  if (generation == base_generation_) { return base_.load(std::memory_order_relaxed); }
  // A lease of a daemon the session reconnected to: its pool's mapping.
  auto& mappings = detail::impl_of(session_).mappings();
  auto* base     = pinned_ ? mappings.pinned_host_pool_base(pool_.id, generation)
                           : mappings.host_pool_base(pool_.id, generation);
  base_.store(base, std::memory_order_release);
  base_generation_ = generation;
  return base;
}

void host_memory_resource_impl::deallocate_sync(void* ptr, std::size_t, std::size_t) noexcept
{
  if (ptr == nullptr || process_is_exiting()) { return; }
  if (auto id = leases_.take(ptr)) { free_lease(*id); }
}

void* host_memory_resource_impl::allocate(cuda::stream_ref,
                                          std::size_t bytes,
                                          std::size_t alignment)
{
  // Host memory is ready on every stream as soon as it exists.
  return allocate_sync(bytes, alignment);
}

void host_memory_resource_impl::deallocate(cuda::stream_ref stream,
                                           void* ptr,
                                           std::size_t bytes,
                                           std::size_t alignment) noexcept
{
  if (ptr == nullptr || process_is_exiting()) { return; }
  // Work queued on `stream` may still read or write the memory: wait for it
  // before the daemon can lend these bytes to anyone else. Without a GPU no
  // work can be queued, so "no device" is not an error here.
  auto err = ::cudaStreamSynchronize(stream.get());
  if (cuda_is_unloading(err)) { return; }  // exiting after all: the daemon reclaims
  if (err != cudaSuccess) {
    ::cudaGetLastError();  // ours, not the caller's: clear it
    if (err != cudaErrorNoDevice && err != cudaErrorInsufficientDriver) {
      std::fprintf(
          stderr, "rmmd: deallocate: cudaStreamSynchronize: %s\n", ::cudaGetErrorName(err));
    }
  }
  deallocate_sync(ptr, bytes, alignment);
}

}  // namespace rmmd::detail
