#pragma once

// CUDA pools: an RMM cuda_async_memory_resource per tenant with posix-fd and,
// where a probe proves them, fabric export handles (cuda_backend).

#include "daemon/backends/pool_kinds.hpp"

namespace rmmd::backends::cuda {

[[nodiscard]] pool_kind_entry cuda_pool_kind() noexcept;

}  // namespace rmmd::backends::cuda
