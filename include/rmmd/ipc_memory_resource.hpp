#pragma once

#include <rmmd/detail/ipc_memory_resource_impl.hpp>
#include <rmmd/session.hpp>

#include <cuda/memory_resource>

#include <string_view>

namespace rmmd {

/// Device memory lent by the node's rmmd from one of its CUDA pools: the
/// daemon allocates and exports the memory, this process imports it through
/// the pool it imported once per session. By default (allocation_mode::slab)
/// the resource leases large slabs and carves allocations out of them
/// in-process with RMM's pool_memory_resource, which is about as fast as an
/// in-process RMM pool; allocation_mode::direct makes one daemon allocation
/// per allocate() (docs/benchmarks.md has the numbers behind that choice).
///
/// A copyable handle over shared state, like RMM's own resources: pass it to
/// rmm::device_uvector, rmm::device_buffer, any RMM adaptor, or
/// rmm::mr::set_current_device_resource.
///
/// allocate(stream, ...) returns memory ready for use on `stream` (and on any
/// other: the daemon completes the allocation before it replies);
/// allocate(0) returns nullptr without a request, as RMM's resources do.
/// deallocate(stream, ptr, ...) returns the memory to the slab in stream order
/// (slab mode), or frees the import in stream order and enqueues a host
/// function that sends the daemon its Free once the stream has passed that
/// point (direct mode). It does not wait for the GPU, never throws, ignores
/// nullptr, and does nothing while the process exits (the daemon reclaims
/// what a closed session held). trim() and the destructor synchronise the
/// pool's device before slabs go back.
///
/// Stream capture (CUDA graphs, torch.cuda.graphs): ipc_resource_options::
/// capture says whether allocate() and deallocate() ask CUDA if their stream
/// is capturing (cuStreamIsCapturing, about 30 ns a call).
///
/// Where they ask on every call (direct mode, always; slab mode with
/// capture_checks::every_call, the graph-safe setting): an allocate() on a
/// capturing stream is a daemon allocation of its own (never carved; a round
/// trip, made once at capture and not per replay), made with the thread's
/// capture mode relaxed, so it works under cudaStreamCaptureModeGlobal too.
/// A deallocate() on a capturing stream frees nothing then: the graph keeps
/// the memory (a CUDA user object the graph holds), since every replay still
/// uses it, and once the graph and every executable graph made from it are
/// destroyed and their launches are done, the next allocate(), deallocate()
/// or trim() of this resource frees it, once, on a stream of the resource's
/// own. Nothing is sent per replay. So memory freed during a capture is not
/// reused by later allocations of the same capture, nor by any other until
/// the graph is gone. Destroy graphs before the resource: what a graph still
/// holds then stays leased until the session closes.
///
/// Slab mode by default (capture_checks::automatic, or slow_path_only): the
/// fast path asks nothing, and carving under capture is RMM's
/// pool_memory_resource's: a free during a capture is RMM's pool's free,
/// whose event record on the capturing stream invalidates a global-mode
/// capture (cudaStreamEndCapture: cudaErrorStreamCaptureInvalidated, on an
/// H100 with CUDA 13.0, as with RMM's pool itself: graph_capture_test.cpp
/// compares the two), and where a capture survives it, the memory is the
/// slab's again at once, for allocations outside the graph while its
/// replays still use it. And RMM's pool, asked on a capturing stream
/// for a block that only blocks freed on other streams can give, makes the
/// stream wait on events recorded outside the capture, which CUDA refuses
/// and which invalidates the capture. Only where a lane's slabs cannot hold
/// the request does the carver ask (the pool would lease a slab): on a
/// capturing stream that allocation is a lease of its own, as above, and
/// freed during capture it is the graph's until the graph is destroyed.
/// Slab leases relax the thread's capture mode for their import. Use the
/// graph-safe setting or direct mode when a graph allocates or frees
/// through this resource, or allocate a graph's memory before the capture
/// and keep it alive until the graph is destroyed. (The Python allocators
/// for PyTorch and CuPy are graph-safe.)
///
/// The pool is found by its GPU's UUID, so the device ordinal is this
/// process's own, whatever CUDA_VISIBLE_DEVICES says.
///
/// Throws (allocate): rmm::out_of_memory (quota, pool limit, device memory, a
/// request larger than the pool),
/// rmmd::logic_error (bad size or alignment), rmmd::session_error (daemon
/// gone), rmm::bad_alloc (a CUDA error, named).
///
/// Thread safety: every member may be called from any thread.
class ipc_memory_resource final
    : public cuda::mr::shared_resource<detail::ipc_memory_resource_impl> {
  using shared_base = cuda::mr::shared_resource<detail::ipc_memory_resource_impl>;

 public:
  /// The pool on the calling thread's current CUDA device.
  explicit ipc_memory_resource(session s, ipc_resource_options options = {})
      : ipc_memory_resource(s, current_device(), options)
  {
  }

  /// The pool on CUDA device `device`.
  ipc_memory_resource(session s, int device, ipc_resource_options options = {})
      : shared_base(cuda::std::in_place_type<detail::ipc_memory_resource_impl>,
                    s,
                    s.device_pool(device),
                    options)
  {
  }

  /// The CUDA pool named `pool_name` (as `rmmctl stats` shows it).
  ipc_memory_resource(session s, std::string_view pool_name, ipc_resource_options options = {})
      : shared_base(cuda::std::in_place_type<detail::ipc_memory_resource_impl>,
                    s,
                    s.pool(pool_name),
                    options)
  {
  }

  /// Frees what destroyed CUDA graphs held (see "Stream capture" above);
  /// slab mode: gives the slabs back to the daemon now if nothing is carved
  /// from them; returns the slab bytes given back.
  std::size_t trim() noexcept
  {
    return get().trim();
  }

  [[nodiscard]] session const& get_session() const noexcept
  {
    return get().get_session();
  }
  [[nodiscard]] pool_info const& pool() const noexcept
  {
    return get().pool();
  }

  friend void get_property(ipc_memory_resource const&, cuda::mr::device_accessible) noexcept {}

 private:
  static int current_device();
};

static_assert(
    cuda::mr::synchronous_resource_with<ipc_memory_resource, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<ipc_memory_resource, cuda::mr::device_accessible>);

}  // namespace rmmd
