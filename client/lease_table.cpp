#include <rmmd/detail/lease_table.hpp>
#include "client/detail/stderr_line.hpp"

#include <cstdio>

namespace rmmd::detail {

std::optional<std::uint64_t> lease_table::take(void* ptr) noexcept
{
  std::lock_guard lock(mutex_);
  auto it = ids_.find(ptr);
  if (it == ids_.end()) {
    rmmd::detail::stderr_line("rmmd: deallocate of %p, which this resource did not allocate\n",
                              ptr);
    return std::nullopt;
  }
  auto id = it->second;
  ids_.erase(it);
  return id;
}

}  // namespace rmmd::detail
