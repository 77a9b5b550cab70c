#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/stable_memory_resource.hpp>

#include "client/detail/cuda_state.hpp"
#include "client/detail/device_scope.hpp"
#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "client/detail/stderr_line.hpp"
#include "client/detail/stream_capture.hpp"
#include "client/slab_carver.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>

namespace rmmd {

int ipc_memory_resource::current_device()
{
  int device = 0;
  if (auto err = cudaGetDevice(&device); err != cudaSuccess) {
    throw rmm::bad_alloc(std::string("rmmd: cudaGetDevice: ") + cudaGetErrorName(err));
  }
  return device;
}

namespace detail {
namespace {

/// Marks a packed lease's id in the lease table (the daemon's ids never come
/// near it): its memory is part of a block the session imported once, so
/// there is no import of its own to free.
constexpr std::uint64_t packed_lease = std::uint64_t{1} << 63;

/// allocate()'s refusal of more than the pool holds, out of line: the fast
/// path then sets up no frame for building its message.
[[noreturn, gnu::cold, gnu::noinline]] void refuse_beyond_capacity(std::size_t bytes,
                                                                   pool_info const& pool)
{
  throw rmm::out_of_memory("rmmd: allocate " + std::to_string(bytes) + " bytes from pool '" +
                           pool.name + "': larger than the pool's capacity of " +
                           std::to_string(pool.capacity_bytes) + " bytes");
}

/// What a host function needs to send one Free: it may run after the
/// resource (at exit, after the session too), so it holds shares of both
/// queues rather than pointers to their owners.
struct release_job {
  std::shared_ptr<session_impl::release_queue> queue;
  std::shared_ptr<pending_releases> pending;
  std::uint64_t id{};

  static void CUDART_CB run(void* self) noexcept
  {
    std::unique_ptr<release_job> job(static_cast<release_job*>(self));
    session_impl::free_when_reached(*job->queue, job->id);
    std::lock_guard lock(job->pending->mutex);
    if (--job->pending->count == 0) { job->pending->done.notify_all(); }
  }
};

}  // namespace

ipc_memory_resource_impl::ipc_memory_resource_impl(session s,
                                                   pool_info const& pool,
                                                   ipc_resource_options options)
    : session_(std::move(s)),
      pool_(pool),
      options_(options),
      checks_every_call_(options.mode == allocation_mode::direct ||
                         options.capture == capture_checks::every_call),
      graph_held_(std::make_shared<graph_held_frees>())
{
  if (pool_.backend != backend_kind::cuda) {
    throw rmmd::logic_error("rmmd: pool '" + pool_.name +
                            "' is not a CUDA pool; use rmmd::host_memory_resource for host pools");
  }
  if (pool_.device < 0) {
    char const* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw rmmd::logic_error(
        "rmmd: pool '" + pool_.name + "' is on GPU " + pool_.gpu_uuid + " (PCI " +
        pool_.pci_bus_id + "), which this process cannot see" +
        (visible != nullptr ? " (CUDA_VISIBLE_DEVICES=" + std::string(visible) + ")" : "") +
        "; use the pool of a GPU it sees (rmmctl pools lists each pool's GPU)");
  }
  if (options_.mode == allocation_mode::slab &&
      options_.slab_bytes > options_.own_allocation_above) {
    throw rmmd::logic_error("rmmd: slab_bytes (" + std::to_string(options_.slab_bytes) +
                            ") is larger than own_allocation_above (" +
                            std::to_string(options_.own_allocation_above) +
                            "): no slab may be larger than a pool pointer can safely be");
  }
  imported_generation_ = detail::impl_of(session_).mappings().latest();
  imported_ = detail::impl_of(session_).mappings().cuda_pool(pool_.id, imported_generation_);
  watch_process_exit();
  if (options_.mode == allocation_mode::slab) { carver_ = std::make_unique<slab_carver>(*this); }
}

ipc_memory_resource_impl::~ipc_memory_resource_impl()
{
  if (leave_everything()) {
    if (carver_) { carver_->abandon(); }
    return;
  }
  // What graphs held and let go of goes back first (carved memory to its
  // slab). What graphs still hold stays leased: they may still be launched,
  // and the daemon reclaims it with the session.
  release_graph_held();
  carver_.reset();  // gives its slabs back through the direct path below
  for (auto const& [ptr, id] : leases_.take_all()) { release(cudaStreamLegacy, ptr, id); }
  for (auto const& [ptr, id] : captured_.take_all()) { release(cudaStreamLegacy, ptr, id); }
  // The host functions of our frees hold no pointer to us, but they must have
  // sent their Frees before the session (which we may hold last) closes: the
  // daemon would free a lease whose import a stream still uses. Streams
  // always reach them, unless CUDA is going away (then the session's end
  // frees it all).
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) { return; }
  if (previous != pool_.device && cudaSetDevice(pool_.device) != cudaSuccess) { return; }
  auto const err = cudaDeviceSynchronize();
  if (previous != pool_.device) { cudaSetDevice(previous); }
  if (err != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  wait_for_releases(std::chrono::steady_clock::now() +
                    detail::impl_of(session_).options.call_timeout);
  if (own_stream_ != nullptr) { cudaStreamDestroy(own_stream_); }
}

void* ipc_memory_resource_impl::allocate(cuda::stream_ref stream,
                                         std::size_t bytes,
                                         std::size_t alignment)
{
  if (bytes == 0) { return nullptr; }  // as RMM's resources do: no request
  // Nothing could hold it: no request (and no slab leased for it).
  if (bytes > pool_.capacity_bytes) [[unlikely]] { refuse_beyond_capacity(bytes, pool_); }
  if (bytes > options_.own_allocation_above) [[unlikely]] { return allocate_own(bytes); }
  // Unless every call checks, the carver asks where it would lease a slab.
  if (checks_every_call_ && capturing_graph(stream.get()) != nullptr) [[unlikely]] {
    return allocate_captured(bytes, alignment);
  }
  release_graph_held();
  return carver_ ? carver_->allocate(stream, bytes, alignment) : lease(stream, bytes, alignment);
}

void* ipc_memory_resource_impl::allocate_own(std::size_t bytes)
{
  std::call_once(own_made_, [&] {
    own_ = std::make_unique<stable_memory_resource_impl>(session_, pool_, "large-allocation");
  });
  // Its calls are ones the global capture mode forbids, as a lease's import.
  relaxed_capture_scope relaxed;
  return own_->allocate_tagged(own_->default_tag(), bytes);
}

void* ipc_memory_resource_impl::allocate_captured(std::size_t bytes, std::size_t alignment)
{
  // lease_into() relaxes the thread's capture mode for the import.
  if (!carver_) { return lease_into(leases_, bytes, alignment); }
  void* ptr = lease_into(captured_, bytes, alignment);
  captured_count_.fetch_add(1, std::memory_order_release);
  return ptr;
}

void ipc_memory_resource_impl::deallocate(cuda::stream_ref stream,
                                          void* ptr,
                                          std::size_t bytes,
                                          std::size_t alignment) noexcept
{
  // The constructor ran watch_process_exit(): our own flag is enough.
  if (ptr == nullptr || exit_marked()) { return; }
  if (bytes > options_.own_allocation_above) [[unlikely]] {
    // Its unmapping waits for the stream, which a capturing stream refuses.
    if (auto graph = capturing_graph(stream.get()); graph != nullptr) {
      return hold_for_graph(graph, ptr, bytes, alignment);
    }
    release_graph_held();
    if (own_) { own_->deallocate(stream, ptr, bytes, alignment); }
    return;
  }
  // Captured, the free and its host function would run at every replay:
  // the graph keeps the memory instead, until it is destroyed. Unless every
  // call checks, carved memory goes back to its slab as RMM's pool does
  // (deallocate_now() still asks for a lease of its own).
  if (checks_every_call_) {
    if (auto graph = capturing_graph(stream.get()); graph != nullptr) [[unlikely]] {
      return hold_for_graph(graph, ptr, bytes, alignment);
    }
  }
  release_graph_held();
  deallocate_now(stream, ptr, bytes, alignment);
}

void ipc_memory_resource_impl::deallocate_now(cuda::stream_ref stream,
                                              void* ptr,
                                              std::size_t bytes,
                                              std::size_t alignment) noexcept
{
  if (!carver_) { return unlease(stream, ptr); }
  if (captured_count_.load(std::memory_order_acquire) != 0) [[unlikely]] {
    if (auto id = captured_.take_if_held(ptr)) {
      captured_count_.fetch_sub(1, std::memory_order_relaxed);
      // Its free and Free would be captured (sent at every replay): asked
      // here when deallocate() did not, at the cost of a lease of its own.
      if (!checks_every_call_) {
        if (auto graph = capturing_graph(stream.get()); graph != nullptr) {
          return hold_for_graph(graph, ptr, bytes, alignment, id);
        }
      }
      return release(stream.get(), ptr, *id);
    }
  }
  carver_->deallocate(stream, ptr, bytes, alignment);
}

void ipc_memory_resource_impl::hold_for_graph(cudaGraph_t graph,
                                              void* ptr,
                                              std::size_t bytes,
                                              std::size_t alignment,
                                              std::optional<std::uint64_t> taken) noexcept
{
  graph_held_frees::entry e{.ptr = ptr, .bytes = bytes, .alignment = alignment};
  // A lease of its own leaves its table now: the resource's destructor must
  // not free it under a graph that may still be launched.
  // An allocation of its own has no lease: release_graph_held() knows it by
  // its size.
  std::optional<std::uint64_t> id = taken;
  bool const leased               = bytes <= options_.own_allocation_above;
  if (leased && !id && !carver_) {
    id = leases_.take(ptr);
    if (!id) { return; }  // not ours: take() said so
  } else if (leased && !id && captured_count_.load(std::memory_order_acquire) != 0) {
    if ((id = captured_.take_if_held(ptr))) {
      captured_count_.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (id) { e.lease_id = *id; }
  if (!hold_until_graph_destroyed(graph, graph_held_, e)) {
    rmmd::detail::stderr_line(
        "rmmd: a free of %p (pool '%s') during stream capture could not be tied to the "
        "graph; the memory stays this process's until the session closes\n",
        ptr,
        pool_.name.c_str());
  }
}

void ipc_memory_resource_impl::release_graph_held() noexcept
{
  // Every allocate and free asks: one load here, no call, while no graph
  // has let go of anything.
  if (!graph_held_->any_released.load(std::memory_order_acquire)) [[likely]] { return; }
  auto released = graph_held_->take();
  if (released.empty()) [[likely]] { return; }
  // Frees on a stream of our own: the graphs are done with the memory, and
  // the stream that freed it may be gone (or capturing again). The calling
  // thread may be inside a capture of its own: relaxed mode, and a stream
  // that no capture uses.
  relaxed_capture_scope relaxed;
  std::call_once(own_stream_made_, [&] {
    device_scope on_pool_device(pool_.device);
    if (cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking) != cudaSuccess) {
      cudaGetLastError();
      own_stream_ = nullptr;
    }
  });
  if (own_stream_ == nullptr) {
    rmmd::detail::stderr_line(
        "rmmd: freeing memory that CUDA graphs held (pool '%s'): no stream could be "
        "made; it stays this process's until the session closes\n",
        pool_.name.c_str());
    return;
  }
  cuda::stream_ref stream{own_stream_};
  for (auto const& e : released) {
    if (e.lease_id != 0) {
      release(own_stream_, e.ptr, e.lease_id);
    } else if (e.bytes > options_.own_allocation_above) {
      if (own_) { own_->deallocate(stream, e.ptr, e.bytes, e.alignment); }
    } else if (carver_) {
      carver_->deallocate(stream, e.ptr, e.bytes, e.alignment);
    }
  }
}

std::size_t ipc_memory_resource_impl::trim() noexcept
{
  release_graph_held();
  return carver_ ? carver_->trim() : 0;
}

void* ipc_memory_resource_impl::lease_into(lease_table& table,
                                           std::size_t bytes,
                                           std::size_t alignment,
                                           std::uint32_t* generation)
{
  // Not on the carving path: the first slab, like every direct allocation,
  // is leased here.
  std::call_once(exit_watched_, watch_process_exit);
  // The import (and a packed block's) is a call that the global capture
  // mode forbids while any capture of the process is under way: a slab may
  // be leased then (a carving thread's, or under slow_path_only a capture's
  // own). Two thread-local exchanges, on a path that makes a round trip.
  relaxed_capture_scope relaxed;
  // The daemon completed the allocation before replying: it is ready on
  // every stream, `stream` included.
  auto& impl = detail::impl_of(session_);
  auto lease = [&] {
    try {
      return impl.lease_memory(pool_.id, bytes, alignment, true);
    } catch (rmm::out_of_memory const&) {
      // Our own frees that wait for their streams may be what is missing:
      // once they reached the daemon, ask once more.
      auto const deadline =
          std::chrono::steady_clock::now() + detail::impl_of(session_).options.call_timeout;
      bool had_pending = false;
      {
        std::lock_guard lock(pending_->mutex);
        had_pending = pending_->count != 0;
      }
      if (!had_pending || !wait_for_releases(deadline)) { throw; }
      return impl.lease_memory(pool_.id, bytes, alignment, true);
    }
  }();
  if (generation != nullptr) { *generation = lease.generation; }
  if (lease.block_id != 0) {
    // Carved by the daemon out of a block of this session's: the block is
    // imported once, and this allocation is a place in it.
    try {
      auto* base = static_cast<std::byte*>(
          impl.packed().base(pool_.id, lease.block_id, lease.granted.cuda_export.data()));
      void* ptr = base + lease.block_offset;
      table.add(ptr, lease.granted.id | packed_lease);
      return ptr;
    } catch (...) {
      try {
        session_.free(lease.granted.id);
      } catch (std::exception const&) {
        // The daemon reclaims it with the session at the latest.
      }
      throw;
    }
  }
  void* ptr = nullptr;
  auto data = reinterpret_cast<cudaMemPoolPtrExportData*>(lease.granted.cuda_export.data());
  // A daemon the session reconnected to: its pool, imported once.
  cudaMemPool_t pool = imported_;
  if (lease.generation != imported_generation_) {
    try {
      pool = impl.mappings().cuda_pool(pool_.id, lease.generation);
    } catch (...) {
      try {
        session_.free(lease.granted.id);
      } catch (std::exception const&) {
        // The daemon reclaims it with the session at the latest.
      }
      throw;
    }
  }
  if (auto err = cudaMemPoolImportPointer(&ptr, pool, data); err != cudaSuccess) {
    cudaGetLastError();
    try {
      session_.free(lease.granted.id);
    } catch (std::exception const&) {
      // The daemon reclaims it with the session at the latest.
    }
    throw rmm::bad_alloc("rmmd: importing allocation " + std::to_string(lease.granted.id) +
                         " of pool '" + pool_.name + "' failed: " + cudaGetErrorName(err));
  }
  table.add(ptr, lease.granted.id);
  return ptr;
}

void ipc_memory_resource_impl::unlease(cuda::stream_ref stream, void* ptr) noexcept
{
  // Reached from deallocate() or from the carver's pool giving a slab back:
  // either way the constructor ran watch_process_exit().
  if (exit_marked()) { return; }
  if (auto id = leases_.take(ptr)) { release(stream.get(), ptr, *id); }
}

void* ipc_memory_resource_impl::lease_slab(cuda::stream_ref,
                                           std::size_t bytes,
                                           std::size_t alignment)
{
  std::uint32_t generation{};
  void* ptr = lease_into(leases_, bytes, alignment, &generation);
  try {
    std::lock_guard lock(slabs_mutex_);
    slabs_[ptr] = {generation, bytes};
  } catch (std::bad_alloc const&) {
    // Uncounted: a report after a reconnect may count it as the new daemon's.
  }
  return ptr;
}

void ipc_memory_resource_impl::unlease_slab(cuda::stream_ref stream, void* ptr) noexcept
{
  {
    std::lock_guard lock(slabs_mutex_);
    slabs_.erase(ptr);
  }
  unlease(stream, ptr);
}

std::size_t ipc_memory_resource_impl::slab_bytes_not_lent_by(
    std::uint32_t generation) const noexcept
{
  std::size_t bytes{};
  std::lock_guard lock(slabs_mutex_);
  for (auto const& [ptr, slab] : slabs_) {
    if (slab.first != generation) { bytes += slab.second; }
  }
  return bytes;
}

bool ipc_memory_resource_impl::wait_for_releases(
    std::chrono::steady_clock::time_point deadline) noexcept
{
  std::unique_lock lock(pending_->mutex);
  return pending_->done.wait_until(lock, deadline, [&] { return pending_->count == 0; });
}

void ipc_memory_resource_impl::release(cudaStream_t stream, void* ptr, std::uint64_t id) noexcept
{
  // A packed lease has no import of its own: only the Free waits for the stream.
  bool const packed = (id & packed_lease) != 0;
  id &= ~packed_lease;
  // CUDA's rule: every importer frees its import before the exporter frees the
  // allocation. The import is freed in `stream`'s order, and the daemon frees
  // only once the stream has passed that point (docs/protocol.md, section 3):
  // a host function after the free sends the Free when the stream reaches it.
  // The import may still be in use when a CUDA call fails: keeping the lease
  // (the daemon frees it when the session closes) is safer than freeing under
  // a running kernel.
  auto keep_leased = [&](cudaError_t err) {
    cudaGetLastError();
    if (cuda_is_going(err)) { return; }
    rmmd::detail::stderr_line(
        "rmmd: freeing allocation %llu of pool '%s' failed (%s); it stays leased until "
        "the session closes\n",
        static_cast<unsigned long long>(id),
        pool_.name.c_str(),
        cudaGetErrorName(err));
  };
  if (!packed) {
    if (auto err = cudaFreeAsync(ptr, stream); err != cudaSuccess) { return keep_leased(err); }
  }
  std::unique_ptr<release_job> job;
  try {
    job = std::make_unique<release_job>(
        release_job{.queue = detail::impl_of(session_).releases(), .pending = pending_, .id = id});
  } catch (std::bad_alloc const&) {
  }
  if (job) {
    {
      std::lock_guard lock(pending_->mutex);
      ++pending_->count;
    }
    auto err = cudaLaunchHostFunc(stream, &release_job::run, job.get());
    if (err == cudaSuccess) {
      static_cast<void>(job.release());  // run() owns it now
      return;
    }
    cudaGetLastError();
    std::lock_guard lock(pending_->mutex);
    if (--pending_->count == 0) { pending_->done.notify_all(); }
  }
  // No host function (out of memory, or the stream cannot take one): wait
  // for the stream here instead.
  if (auto err = cudaStreamSynchronize(stream); err != cudaSuccess) { return keep_leased(err); }
  try {
    session_.free(id);
  } catch (rmmd::session_error const&) {
    // The daemon is gone, and with it the lease.
  } catch (std::exception const& e) {
    rmmd::detail::stderr_line("%s\n", e.what());
  }
}

void* ipc_memory_resource_impl::allocate_sync(std::size_t bytes, std::size_t alignment)
{
  return allocate(cuda::stream_ref{cudaStreamLegacy}, bytes, alignment);
}

void ipc_memory_resource_impl::deallocate_sync(void* ptr,
                                               std::size_t bytes,
                                               std::size_t alignment) noexcept
{
  deallocate(cuda::stream_ref{cudaStreamLegacy}, ptr, bytes, alignment);
}

}  // namespace detail
}  // namespace rmmd
