#include "client/detail/usage_reports.hpp"
#include "client/detail/stderr_line.hpp"

#include "client/detail/session_channel.hpp"

#include <algorithm>
#include <cstdio>
#include <exception>

namespace rmmd::detail {

std::vector<std::uint32_t> usage_reports::send(std::vector<carved_usage> const& usage)
{
  return send_built([&](std::uint32_t) { return usage; });
}

std::vector<std::uint32_t> usage_reports::send_built(
    std::function<std::vector<carved_usage>(std::uint32_t generation)> const& build)
{
  v1::UsageReply reply;
  // Pool ids as the daemon of now numbers them (after a reconnect, its pools
  // are matched to the session's by name and GPU); a pool it does not serve
  // is not reported. The figures are built for each try: a try that went to
  // a daemon the session then reconnected away from is made again, for the
  // new one.
  auto status =
      channel_.call([&](v1::Rmmd::Stub& stub, grpc::ClientContext* ctx, std::uint32_t generation) {
        v1::UsageReport request;
        for (auto const& u : build(generation)) {
          auto pool = channel_.daemon_pool(u.pool_id);
          if (!pool) { continue; }
          auto* p = request.add_pools();
          p->set_pool_id(*pool);
          p->set_bytes(u.bytes);
          p->set_allocation_count(u.allocation_count);
          p->set_slab_bytes(u.slab_bytes);
          p->set_reclaimable_bytes(u.reclaimable_bytes);
        }
        reply.Clear();
        return stub.ReportUsage(ctx, request, &reply);
      });
  if (!status.ok()) {
    // The daemon's refusals name the call already; gRPC's own do not.
    throw_status(status, status.error_message().starts_with("report usage") ? "" : "report usage");
  }
  std::vector<std::uint32_t> pressed;
  for (auto id : reply.trim_pool_ids()) {
    if (auto ours = channel_.session_pool(id)) { pressed.push_back(*ours); }
  }
  return pressed;
}

std::vector<std::uint32_t> usage_reports::report_carved(void const* reporter,
                                                        carved_usage const& usage,
                                                        std::uint32_t generation)
{
  std::lock_guard lock(carved_mutex_);
  carved_[usage.pool_id][reporter] = {usage, generation};
  return send_carved_locked(usage.pool_id);
}

void usage_reports::forget_reporter(void const* reporter, std::uint32_t pool_id) noexcept
{
  std::lock_guard lock(carved_mutex_);
  auto it = carved_.find(pool_id);
  if (it == carved_.end() || it->second.erase(reporter) == 0) { return; }
  try {
    static_cast<void>(send_carved_locked(pool_id));
  } catch (std::exception const&) {
    // The daemon is gone, or busy: its figure corrects itself at the next report.
  }
}

std::vector<std::uint32_t> usage_reports::send_carved_locked(std::uint32_t pool_id)
{
  auto const& reporters = carved_[pool_id];
  return send_built([&](std::uint32_t generation) {
    // Figures made for another daemon are left out: the slabs they count
    // are not all this one's (it refuses more slabs than the session holds
    // there). Their reporters report again within a second while they hold
    // slabs.
    carved_usage sum{.pool_id = pool_id};
    for (auto const& [reporter, r] : reporters) {
      if (r.generation != generation) { continue; }
      sum.bytes += r.usage.bytes;
      sum.allocation_count += r.usage.allocation_count;
      sum.slab_bytes += r.usage.slab_bytes;
      sum.reclaimable_bytes += r.usage.reclaimable_bytes;
    }
    return std::vector<carved_usage>{sum};
  });
}

std::uint64_t usage_reports::watch(std::uint32_t pool_id,
                                   std::function<void(std::uint32_t)> on_request)
{
  // Reclaim requests must be heard while no call reads the socket.
  channel_.start_reader();
  std::lock_guard lock(watches_mutex_);
  auto const id = next_watch_++;
  watches_.emplace(id, reclaim_watch{.pool_id = pool_id, .on_request = std::move(on_request)});
  return id;
}

void usage_reports::unwatch(std::uint64_t watch_id) noexcept
{
  std::lock_guard lock(watches_mutex_);
  watches_.erase(watch_id);
}

void usage_reports::run_watches(std::vector<std::uint32_t> const& reclaims) noexcept
{
  std::lock_guard lock(watches_mutex_);
  for (auto const& [id, w] : watches_) {
    if (std::find(reclaims.begin(), reclaims.end(), w.pool_id) == reclaims.end()) { continue; }
    try {
      w.on_request(w.pool_id);
    } catch (std::exception const& e) {
      rmmd::detail::stderr_line("rmmd: answering the daemon's reclaim request: %s\n", e.what());
    }
  }
}

}  // namespace rmmd::detail
