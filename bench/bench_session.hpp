#pragma once

// What the bench asks the daemon outside the calls it times.

#include "bench/bench_support.hpp"
#include "client/detail/session_impl.hpp"

#include <rmmd/session.hpp>

namespace rmmd::bench {

/// GetStats over the session's gRPC channel (every session listed).
inline v1::Stats get_stats(rmmd::session const& s)
{
  auto& impl = s.impl();
  v1::Stats out;
  auto ctx    = impl.context();
  auto status = impl.stub().GetStats(ctx.get(), v1::GetStatsRequest{}, &out);
  if (!status.ok()) { throw bench_error("GetStats failed: " + status.error_message()); }
  return out;
}

}  // namespace rmmd::bench
