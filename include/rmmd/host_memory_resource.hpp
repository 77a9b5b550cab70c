#pragma once

#include <rmmd/detail/host_memory_resource_impl.hpp>
#include <rmmd/session.hpp>

#include <cuda/memory_resource>

#include <string_view>

namespace rmmd {

/// Host memory from one of the daemon's shared host pools (a memfd every
/// session maps once): what one process writes at an allocation, any other
/// session of the node can read at the same pool offset.
///
/// A copyable handle over shared state, like RMM's resources: copies compare
/// equal and share the allocations. It can be stored in
/// `cuda::mr::any_resource<cuda::mr::host_accessible>` and given to anything
/// that takes a CCCL host-accessible resource.
///
/// It keeps RMM's resource contract: allocate(0) returns nullptr without
/// asking the daemon, and deallocate(nullptr, ...) does nothing. A request
/// larger than the pool throws rmm::out_of_memory (without asking the daemon),
/// as does one the pool or a quota cannot hold now; the rest of error.hpp
/// holds too. deallocate() waits for `stream` (so no queued copy still reads
/// the memory), then frees; it never throws. While the process exits (a
/// resource kept in a static), neither deallocate() nor the destructor
/// calls CUDA or the daemon, or prints: the daemon reclaims everything a
/// session held when it closes.
///
/// Thread safety: every member may be called from any thread.
class host_memory_resource final
    : public cuda::mr::shared_resource<detail::host_memory_resource_impl> {
  using shared_base = cuda::mr::shared_resource<detail::host_memory_resource_impl>;

 public:
  /// Memory from `s`'s first host pool, or the host pool named `pool_name`.
  explicit host_memory_resource(session s, std::string_view pool_name = {})
      : shared_base(
            cuda::std::in_place_type<detail::host_memory_resource_impl>, std::move(s), pool_name)
  {
  }

  /// The session this resource allocates through.
  [[nodiscard]] session const& get_session() const noexcept
  {
    return get().get_session();
  }

  /// Offset of `ptr` (from this resource) in the pool: what another process
  /// adds to its own host_pool_base() to reach the same bytes.
  [[nodiscard]] std::uint64_t offset_of(void const* ptr) const noexcept
  {
    return get().offset_of(ptr);
  }

  friend void get_property(host_memory_resource const&, cuda::mr::host_accessible) noexcept {}
};

static_assert(cuda::mr::synchronous_resource_with<host_memory_resource, cuda::mr::host_accessible>);
static_assert(cuda::mr::resource_with<host_memory_resource, cuda::mr::host_accessible>);

}  // namespace rmmd
