#pragma once

#include <rmmd/detail/host_memory_resource_impl.hpp>
#include <rmmd/session.hpp>

#include <cuda/memory_resource>

#include <string_view>

namespace rmmd {

/// Page-locked host memory shared across the node's processes: the
/// cross-process counterpart of `rmm::mr::pinned_host_memory_resource`.
/// Allocations come from one of the daemon's pinnable host pools, which each
/// session maps and page-locks (cudaHostRegister) once; a kernel or
/// cudaMemcpyAsync in this process reads what another process wrote at the same
/// pool offset, and the other way round.
///
/// The pool must be pinnable (`pool_info::pinnable`; the daemon makes its host
/// pool pinnable on GPU nodes, `--host-pool-pinned`), or construction throws
/// rmmd::logic_error. Page-locking costs about 0.1 s per GiB of pool, once per
/// session, and commits that RAM.
///
/// A copyable handle over shared state, like RMM's resources, keeping their
/// contract as rmmd::host_memory_resource does (allocate(0) is nullptr,
/// deallocate(nullptr, ...) does nothing, a request larger than the pool is
/// rmm::out_of_memory). allocate() returns memory ready on every stream;
/// deallocate() waits for `stream` (no queued copy or kernel may still touch
/// the bytes the daemon lends again), never throws, and does nothing while the
/// process is exiting. Freed memory keeps its contents (it is not cleared), as
/// with RMM's pinned resources.
///
/// Thread safety: every member may be called from any thread.
class pinned_host_memory_resource final
    : public cuda::mr::shared_resource<detail::host_memory_resource_impl> {
  using shared_base = cuda::mr::shared_resource<detail::host_memory_resource_impl>;

 public:
  /// Memory from `s`'s first host pool, or the host pool named `pool_name`.
  explicit pinned_host_memory_resource(session s, std::string_view pool_name = {})
      : shared_base(cuda::std::in_place_type<detail::host_memory_resource_impl>,
                    std::move(s),
                    pool_name,
                    true)
  {
  }

  [[nodiscard]] session const& get_session() const noexcept
  {
    return get().get_session();
  }

  /// Offset of `ptr` in the pool: what another process adds to its own
  /// mapping of the pool to reach the same bytes.
  [[nodiscard]] std::uint64_t offset_of(void const* ptr) const noexcept
  {
    return get().offset_of(ptr);
  }

  friend void get_property(pinned_host_memory_resource const&, cuda::mr::host_accessible) noexcept
  {
  }
  friend void get_property(pinned_host_memory_resource const&, cuda::mr::device_accessible) noexcept
  {
  }
};

static_assert(cuda::mr::synchronous_resource_with<pinned_host_memory_resource,
                                                  cuda::mr::host_accessible,
                                                  cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<pinned_host_memory_resource,
                                      cuda::mr::host_accessible,
                                      cuda::mr::device_accessible>);

}  // namespace rmmd
