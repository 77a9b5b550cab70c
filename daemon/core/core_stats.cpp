#include "daemon/core/core_stats.hpp"

#include <algorithm>
#include <tuple>

namespace rmmd::core {

void core_stats::lease_taken_over(std::chrono::steady_clock::duration took) noexcept
{
  auto const seconds = std::chrono::duration<double>(took).count();
  auto const bucket  = static_cast<std::size_t>(
      std::lower_bound(takeover_bounds_seconds.begin(), takeover_bounds_seconds.end(), seconds) -
      takeover_bounds_seconds.begin());
  ++leases_.takeover_buckets[bucket];
  leases_.takeover_seconds_sum += seconds;
}

session_info core_stats::info(session_entry const& s, packed_blocks const& blocks)
{
  session_info info{.id               = s.id,
                    .peer             = s.peer,
                    .command          = s.command,
                    .client_name      = s.client_name,
                    .reconnects       = s.reconnects,
                    .previous_session = s.previous_session,
                    .bytes            = s.bytes,
                    .allocation_count = s.count,
                    .started          = s.started,
                    .shared_bytes     = s.shared_bytes,
                    .buffers_held     = s.holds.size()};
  for (auto const& [pool, c] : s.carved) {
    info.carved_bytes += c.bytes;
    info.carved_allocations += c.allocation_count;
    auto const idle = idle_of(c, s.held_in(pool));
    info.idle_bytes += idle.idle;
    info.reclaimable_bytes += idle.reclaimable;
  }
  for (auto const& [pool, idle] : blocks.idle(s.id)) {
    info.idle_bytes += idle.idle;
    info.reclaimable_bytes += idle.reclaimable;
  }
  return info;
}

session_listing core_stats::top(session_map const& sessions,
                                packed_blocks const& blocks,
                                std::size_t n)
{
  // Order the entries, and copy out (strings and all) only those shown.
  std::vector<session_entry const*> order;
  order.reserve(sessions.size());
  for (auto const& [id, s] : sessions) { order.push_back(s.get()); }
  auto const shown = std::min(n, order.size());
  auto const first = order.begin() + static_cast<std::ptrdiff_t>(shown);
  std::partial_sort(
      order.begin(), first, order.end(), [](session_entry const* a, session_entry const* b) {
        return std::tuple(b->bytes, b->count, a->id) < std::tuple(a->bytes, a->count, b->id);
      });
  session_listing out{.session_count = sessions.size()};
  out.sessions.reserve(shown);
  for (auto it = order.begin(); it != first; ++it) { out.sessions.push_back(info(**it, blocks)); }
  for (auto it = first; it != order.end(); ++it) {
    out.unlisted_bytes += (*it)->bytes;
    out.unlisted_allocations += (*it)->count;
  }
  return out;
}

namespace {

/// The row of `tenant` among `rows` (a pool with one backend for everyone
/// has one row, whoever it is); a tenant without a slot yet (no session of
/// it since the restart) gets a row of its own.
tenant_pool_stats& row_of(std::vector<tenant_pool_stats>& rows,
                          pool_tenants const& tenants,
                          tenant_key const& tenant)
{
  auto const text = tenants.per_tenant() ? tenant.text() : tenant_key{}.text();
  auto row =
      std::find_if(rows.begin(), rows.end(), [&](auto const& r) { return r.tenant == text; });
  if (row == rows.end()) { row = rows.insert(rows.end(), tenant_pool_stats{.tenant = text}); }
  return *row;
}

void count_in(tenant_pool_stats& row, std::size_t bytes)
{
  row.in_use_bytes += bytes;
  row.high_water_bytes = std::max(row.high_water_bytes, row.in_use_bytes);
}

/// What a restart adopted, buffers and sleep backups, in their tenant's row
/// of `pool`: their memory is no tenant backend's, so no slot counts it.
void add_adopted(std::vector<tenant_pool_stats>& rows,
                 core_stats::sources const& in,
                 pool_id pool,
                 pool_tenants const& tenants)
{
  for (auto const& [id, b] : in.buffers) {
    if (b->pool != pool || !b->release) { continue; }
    auto& row = row_of(rows, tenants, b->tenant);
    count_in(row, b->charge);
    ++row.shared_buffers;
  }
  for (auto const& [id, e] : in.stables) {
    if (!e->backup || e->backup->pool != pool || !e->backup->release) { continue; }
    count_in(row_of(rows, tenants, e->backup->tenant), e->backup->memory.block.bytes);
  }
}

}  // namespace

stats_snapshot core_stats::snapshot(sources in, std::optional<std::size_t> top_sessions) const
{
  stats_snapshot out;
  for (std::size_t i = 0; i < in.pools.size(); ++i) {
    auto const& p = *in.pools[i];
    auto const& h = pools_[i];
    std::optional<backend_usage> usage;
    std::optional<std::size_t> release;
    std::vector<tenant_pool_stats> tenants;
    for (auto const& [key, slot] : p.tenants.slots()) {
      auto const u = slot.backend->usage();
      if (u) {
        if (!usage) { usage = backend_usage{}; }
        usage->reserved_bytes += u->reserved_bytes;
        usage->used_bytes += u->used_bytes;
      }
      if (!release) { release = slot.backend->release_threshold(); }
      tenants.push_back(tenant_pool_stats{
          .tenant                 = key.text(),
          .in_use_bytes           = slot.in_use,
          .high_water_bytes       = slot.high_water,
          .backend_reserved_bytes = u ? std::optional(u->reserved_bytes) : std::nullopt,
          .backend_used_bytes     = u ? std::optional(u->used_bytes) : std::nullopt,
          .shared_buffers         = slot.buffers});
    }
    add_adopted(tenants, in, static_cast<pool_id>(i), p.tenants);
    out.pools.push_back(pool_stats{
        .pool                   = std::move(in.descriptions[i]),
        .tenants                = std::move(tenants),
        .in_use_bytes           = p.in_use,
        .high_water_bytes       = h.high_water,
        .allocation_count       = p.live,
        .total_allocations      = h.total,
        .backend_reserved_bytes = usage ? std::optional(usage->reserved_bytes) : std::nullopt,
        .backend_used_bytes     = usage ? std::optional(usage->used_bytes) : std::nullopt,
        .reclaim_waits          = h.reclaim_waits,
        .reclaim_served         = h.reclaim_served,
        .reclaim_refused        = h.reclaim_refused,
        .release_threshold_bytes =
            release ? std::optional<std::uint64_t>(*release) : std::nullopt});
  }
  for (auto const& [id, s] : in.sessions) {
    for (auto const& [pool, c] : s->carved) {
      auto const held = s->held_in(pool);
      auto& ps        = out.pools[pool];
      ps.carved_bytes += std::min(c.bytes, held);
      ps.carved_allocations += c.allocation_count;
      auto const idle = idle_of(c, held);
      ps.idle_bytes += idle.idle;
      ps.reclaimable_bytes += idle.reclaimable;
    }
    for (auto const& [pool, idle] : in.blocks.idle(id)) {
      out.pools[pool].idle_bytes += idle.idle;
      out.pools[pool].reclaimable_bytes += idle.reclaimable;
    }
  }
  for (auto const& [id, b] : in.buffers) {
    if (b->creating) { continue; }
    out.uid_shared_bytes[b->creator_uid] += b->charge;
    auto& ps = out.pools[b->pool];
    ++ps.shared_buffers;
    ps.shared_bytes += b->charge;
    ps.shared_holders += b->holders.size();
  }
  out.session_count = in.sessions.size();
  if (top_sessions) {
    auto listing             = top(in.sessions, in.blocks, *top_sessions);
    out.sessions             = std::move(listing.sessions);
    out.unlisted_bytes       = listing.unlisted_bytes;
    out.unlisted_allocations = listing.unlisted_allocations;
  } else {
    out.sessions.reserve(in.sessions.size());
    for (auto const& [id, s] : in.sessions) { out.sessions.push_back(info(*s, in.blocks)); }
  }
  return out;
}

}  // namespace rmmd::core
