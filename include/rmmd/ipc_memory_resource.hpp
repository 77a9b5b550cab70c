#pragma once

#include <rmmd/detail/ipc_memory_resource_impl.hpp>
#include <rmmd/session.hpp>

#include <cuda/memory_resource>

#include <string_view>

namespace rmmd {

/// Device memory lent by the node's rmmd from one of its CUDA pools: the
/// daemon allocates and exports each allocation, this process imports it
/// through the pool it imported once per session.
///
/// A copyable handle over shared state, like RMM's own resources: pass it to
/// rmm::device_uvector, rmm::device_buffer, any RMM adaptor, or
/// rmm::mr::set_current_device_resource.
///
/// allocate(stream, ...) returns memory ready for use on `stream` (and on any
/// other: the daemon completes the allocation before it replies).
/// deallocate(stream, ptr, ...) frees the import in stream order, waits for
/// `stream` to reach that point, then tells the daemon, which frees its own
/// allocation only then. It never throws, and does nothing while the process
/// exits (the daemon reclaims what a closed session held).
///
/// Throws (allocate): rmm::out_of_memory (quota, pool limit, device memory),
/// rmmd::logic_error (bad size or alignment), rmmd::session_error (daemon
/// gone), rmm::bad_alloc (a CUDA error, named).
///
/// Thread safety: every member may be called from any thread.
class ipc_memory_resource final
    : public cuda::mr::shared_resource<detail::ipc_memory_resource_impl> {
  using shared_base = cuda::mr::shared_resource<detail::ipc_memory_resource_impl>;

 public:
  /// The pool on the calling thread's current CUDA device.
  explicit ipc_memory_resource(session s) : ipc_memory_resource(s, current_device()) {}

  /// The pool on CUDA device `device`.
  ipc_memory_resource(session s, int device)
      : shared_base(
            cuda::std::in_place_type<detail::ipc_memory_resource_impl>, s, s.device_pool(device))
  {
  }

  /// The CUDA pool named `pool_name` (as `rmmctl stats` shows it).
  ipc_memory_resource(session s, std::string_view pool_name)
      : shared_base(
            cuda::std::in_place_type<detail::ipc_memory_resource_impl>, s, s.pool(pool_name))
  {
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
