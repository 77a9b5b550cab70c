#pragma once

// Host pools: shared host memory, a memfd per tenant (host_backend).

#include "daemon/backends/pool_kinds.hpp"

namespace rmmd::backends::host {

[[nodiscard]] pool_kind_entry host_pool_kind() noexcept;

}  // namespace rmmd::backends::host
