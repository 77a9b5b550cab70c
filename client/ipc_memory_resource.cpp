#include <rmmd/ipc_memory_resource.hpp>

#include "client/detail/session_impl.hpp"
#include "client/slab_carver.hpp"

#include <rmm/process_is_exiting.hpp>

#include <cstdio>
#include <exception>
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

ipc_memory_resource_impl::ipc_memory_resource_impl(session s,
                                                   pool_info const& pool,
                                                   ipc_resource_options options)
    : session_(std::move(s)), pool_(pool), options_(options)
{
  if (pool_.backend != backend_kind::cuda) {
    throw rmmd::logic_error("rmmd: pool '" + pool_.name +
                            "' is not a CUDA pool; use rmmd::host_memory_resource for host pools");
  }
  imported_ = session_.cuda_pool(pool_.id);
  if (options_.mode == allocation_mode::slab) { carver_ = std::make_unique<slab_carver>(*this); }
}

ipc_memory_resource_impl::~ipc_memory_resource_impl()
{
  carver_.reset();  // gives its slabs back through the direct path below
  if (rmm::process_is_exiting()) { return; }
  for (auto const& [ptr, id] : leases_.take_all()) { release(cudaStreamLegacy, ptr, id); }
  // When the session closes, the daemon frees whatever still waits on an
  // event without looking at it: every recorded free must have happened by then.
  std::lock_guard lock(events_mutex_);
  for (auto const& e : events_) {
    cudaEventSynchronize(e.event);
    cudaEventDestroy(e.event);
  }
}

void* ipc_memory_resource_impl::allocate(cuda::stream_ref stream,
                                         std::size_t bytes,
                                         std::size_t alignment)
{
  return carver_ ? carver_->allocate(stream, bytes, alignment) : lease(stream, bytes, alignment);
}

void ipc_memory_resource_impl::deallocate(cuda::stream_ref stream,
                                          void* ptr,
                                          std::size_t bytes,
                                          std::size_t alignment) noexcept
{
  if (rmm::process_is_exiting()) { return; }
  if (carver_) {
    carver_->deallocate(stream, ptr, bytes, alignment);
  } else {
    unlease(stream, ptr);
  }
}

std::size_t ipc_memory_resource_impl::trim() noexcept
{
  return carver_ ? carver_->trim() : 0;
}

void* ipc_memory_resource_impl::lease(cuda::stream_ref, std::size_t bytes, std::size_t alignment)
{
  // The daemon completed the allocation before replying: it is ready on
  // every stream, `stream` included.
  auto lease = session_.allocate(pool_.id, bytes, alignment);
  void* ptr  = nullptr;
  auto data  = reinterpret_cast<cudaMemPoolPtrExportData*>(lease.cuda_export.data());
  if (auto err = cudaMemPoolImportPointer(&ptr, imported_, data); err != cudaSuccess) {
    try {
      session_.free(lease.id);
    } catch (std::exception const&) {
      // The daemon reclaims it with the session at the latest.
    }
    throw rmm::bad_alloc("rmmd: importing allocation " + std::to_string(lease.id) + " of pool '" +
                         pool_.name + "' failed: " + cudaGetErrorName(err));
  }
  leases_.add(ptr, lease.id);
  return ptr;
}

void ipc_memory_resource_impl::unlease(cuda::stream_ref stream, void* ptr) noexcept
{
  if (rmm::process_is_exiting()) { return; }
  if (auto id = leases_.take(ptr)) { release(stream.get(), ptr, *id); }
}

void ipc_memory_resource_impl::release(cudaStream_t stream, void* ptr, std::uint64_t id) noexcept
{
  // CUDA's rule: every importer frees its import before the exporter frees the
  // allocation. The import is freed in `stream`'s order, and the daemon frees
  // only once the stream has passed that point (docs/protocol.md, section 3).
  // The import may still be in use when a CUDA call fails: keeping the lease
  // (the daemon frees it when the session closes) is safer than freeing under
  // a running kernel.
  auto keep_leased = [&](cudaError_t err) {
    std::fprintf(stderr,
                 "rmmd: freeing allocation %llu of pool '%s' failed (%s); it stays leased until "
                 "the session closes\n",
                 static_cast<unsigned long long>(id),
                 pool_.name.c_str(),
                 cudaGetErrorName(err));
  };
  auto err = cudaFreeAsync(ptr, stream);
  cudaIpcEventHandle_t after{};
  cudaEvent_t event{};
  bool const fenced = err == cudaSuccess && record_release_event(stream, after, event);
  if (err == cudaSuccess && !fenced) { err = cudaStreamSynchronize(stream); }
  if (err != cudaSuccess) { return keep_leased(err); }
  try {
    // Once the daemon has taken one of our events, a Free needs no reply: the
    // daemon frees after the event, and reports a failure later.
    if (fenced && (session_.impl().free_later(id, after) || session_.free(id, after))) { return; }
    if (fenced) {
      // The daemon cannot open this process's events (e.g. a container with
      // its own /dev/shm): wait here instead, now and from now on.
      std::fprintf(stderr,
                   "rmmd: the daemon cannot use this process's CUDA events; waiting for the "
                   "stream before each free instead\n");
      events_refused_.store(true);
      if (err = cudaEventSynchronize(event); err != cudaSuccess) { return keep_leased(err); }
    }
    session_.free(id);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

bool ipc_memory_resource_impl::record_release_event(cudaStream_t stream,
                                                    cudaIpcEventHandle_t& handle,
                                                    cudaEvent_t& event) noexcept
{
  if (events_refused_.load()) { return false; }
  std::lock_guard lock(events_mutex_);
  // Reuse an event only once its last record has completed: the daemon may
  // still be polling that record, and a later one only makes it wait longer.
  for (std::size_t n = 0; n < events_.size(); ++n) {
    auto& e = events_[(next_event_ + n) % events_.size()];
    if (cudaEventQuery(e.event) != cudaSuccess) { continue; }
    if (cudaEventRecord(e.event, stream) != cudaSuccess) {
      cudaGetLastError();  // ours, not the caller's: clear it
      return false;
    }
    next_event_ = (next_event_ + n + 1) % events_.size();
    handle      = e.handle;
    event       = e.event;
    return true;
  }
  if (events_.size() == max_release_events) { return false; }
  // A new event costs about 0.3 ms once (measured on an H100); recording one is
  // about 1.3 us.
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) { return false; }
  if (previous != pool_.device && cudaSetDevice(pool_.device) != cudaSuccess) { return false; }
  release_event e;
  auto err = cudaEventCreateWithFlags(&e.event, cudaEventInterprocess | cudaEventDisableTiming);
  if (err == cudaSuccess) {
    err = cudaIpcGetEventHandle(&e.handle, e.event);
    if (err != cudaSuccess) { cudaEventDestroy(e.event); }
  }
  if (previous != pool_.device) { cudaSetDevice(previous); }
  if (err != cudaSuccess) { return false; }
  if (cudaEventRecord(e.event, stream) != cudaSuccess) {
    // `stream` belongs to another device: keep the event for later frees.
    cudaGetLastError();
    events_.push_back(e);
    return false;
  }
  events_.push_back(e);
  handle = e.handle;
  event  = e.event;
  return true;
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
