#include "daemon/backends/pool_kinds.hpp"

#include "daemon/backends/cuda/cuda_pool_kind.hpp"
#include "daemon/backends/host/host_pool_kind.hpp"

#include <algorithm>
#include <array>

namespace rmmd::backends {

std::span<pool_kind_entry const> pool_kinds() noexcept
{
  static std::array const kinds{host::host_pool_kind(), cuda::cuda_pool_kind()};
  return kinds;
}

pool_kind_entry const& pool_kind_of(config::pool_kind kind) noexcept
{
  auto const all = pool_kinds();
  return *std::find_if(all.begin(), all.end(), [&](auto const& k) { return k.config == kind; });
}

}  // namespace rmmd::backends
