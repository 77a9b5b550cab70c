#include "daemon/metrics/admission_metrics.hpp"

namespace rmmd::metrics {

std::string_view limit_name(admission_limit limit) noexcept
{
  switch (limit) {
    case admission_limit::max_pending_per_uid:
      return "max_pending_per_uid";
    case admission_limit::max_pending_total:
      return "max_pending_total";
    case admission_limit::max_sessions_per_uid:
      return "max_sessions_per_uid";
    case admission_limit::max_sessions_total:
      return "max_sessions_total";
  }
  return "unknown";
}

void admission_metrics::refused(admission_limit limit) noexcept
{
  refusals_[static_cast<std::size_t>(limit)].fetch_add(1, std::memory_order_relaxed);
}

void admission_metrics::set_pending(std::size_t connections) noexcept
{
  pending_.store(connections, std::memory_order_relaxed);
}

admission_snapshot admission_metrics::snapshot() const noexcept
{
  admission_snapshot s;
  for (std::size_t i = 0; i < admission_limit_count; ++i) {
    s.refusals[i] = refusals_[i].load(std::memory_order_relaxed);
  }
  s.pending_connections = pending_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace rmmd::metrics
