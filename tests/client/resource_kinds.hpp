#pragma once

// The client resources and modes that the conformance test
// (resource_conformance.hpp) runs every body against. A kind says how to
// start the daemon for it, how to make the resource from a session, which
// pool it draws from, and what its memory can be reached from.

#include <rmmd/host_memory_resource.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/pinned_host_memory_resource.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace rmmd::test {

/// rmmd::host_memory_resource: shared host memory, no GPU needed.
struct host_kind {
  using resource                          = rmmd::host_memory_resource;
  static constexpr char const* name       = "host_memory_resource";
  static constexpr bool needs_gpu         = false;
  static constexpr bool host_accessible   = true;
  static constexpr bool device_accessible = false;
  /// The mode of `rmmd_test_client exit-with-static`.
  static constexpr char const* client_mode = "host";

  static std::vector<std::string> daemon_args()
  {
    return {"--backend", "host", "--host-pool-bytes", "256MiB"};
  }
  static resource make(rmmd::session const& s)
  {
    return resource(s);
  }
  static pool_info const& pool(rmmd::session const& s)
  {
    return s.host_pool();
  }
  /// What the resource keeps leased while nothing is allocated goes back.
  static void give_back_idle(resource&) {}
};

/// rmmd::pinned_host_memory_resource: the same pool, page-locked, so host and
/// device accessible. Page-locking needs CUDA and a GPU.
struct pinned_host_kind {
  using resource                           = rmmd::pinned_host_memory_resource;
  static constexpr char const* name        = "pinned_host_memory_resource";
  static constexpr bool needs_gpu          = true;
  static constexpr bool host_accessible    = true;
  static constexpr bool device_accessible  = true;
  static constexpr char const* client_mode = "pinned-host";

  static std::vector<std::string> daemon_args()
  {
    return {"--backend", "host", "--host-pool-pinned", "on", "--host-pool-bytes", "256MiB"};
  }
  static resource make(rmmd::session const& s)
  {
    return resource(s);
  }
  static pool_info const& pool(rmmd::session const& s)
  {
    return s.host_pool();
  }
  static void give_back_idle(resource&) {}
};

/// rmmd::ipc_memory_resource on GPU 0's pool, in `Mode`.
template <rmmd::allocation_mode Mode>
struct ipc_kind {
  using resource                          = rmmd::ipc_memory_resource;
  static constexpr char const* name       = Mode == rmmd::allocation_mode::slab
                                                ? "ipc_memory_resource_slab"
                                                : "ipc_memory_resource_direct";
  static constexpr bool needs_gpu         = true;
  static constexpr bool host_accessible   = false;
  static constexpr bool device_accessible = true;
  static constexpr char const* client_mode =
      Mode == rmmd::allocation_mode::slab ? "ipc-slab" : "ipc-direct";

  static std::vector<std::string> daemon_args()
  {
    return {"--cuda-pool-bytes", "2GiB", "--host-pool-bytes", "16MiB"};
  }
  static resource make(rmmd::session const& s)
  {
    // Small slabs, so that the bodies make the pool grow by several; never
    // trimmed behind the test's back (give_back_idle trims).
    return resource(
        s,
        0,
        rmmd::ipc_resource_options{
            .mode = Mode, .slab_bytes = std::size_t{8} << 20, .idle_trim = std::chrono::hours(1)});
  }
  static pool_info const& pool(rmmd::session const& s)
  {
    return s.device_pool(0);
  }
  static void give_back_idle(resource& mr)
  {
    static_cast<void>(mr.trim());
  }
};

using ipc_slab_kind   = ipc_kind<rmmd::allocation_mode::slab>;
using ipc_direct_kind = ipc_kind<rmmd::allocation_mode::direct>;

/// Names the instantiations after the kind (gtest's NameGenerator).
struct kind_name {
  template <typename Kind>
  static std::string GetName(int)
  {
    return Kind::name;
  }
};

}  // namespace rmmd::test
