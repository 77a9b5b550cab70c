#include "daemon/metrics/prometheus_text.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

namespace rmmd::metrics {
namespace {

using labels = std::vector<std::pair<std::string_view, std::string>>;

/// HELP text escapes only backslash and line feed.
std::string escape_help(std::string_view text)
{
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double v)
{
  if (std::isinf(v)) { return v > 0 ? "+Inf" : "-Inf"; }
  if (std::isnan(v)) { return "NaN"; }
  return absl::StrFormat("%.9g", v);
}

std::string number(std::uint64_t v)
{
  return absl::StrCat(v);
}

/// Writes families: one HELP and TYPE header, then its samples.
class exposition {
 public:
  void family(std::string_view name, std::string_view type, std::string_view help)
  {
    // (Debian's abseil has its own string_view: append std::string_views by hand.)
    out_.append("# HELP ").append(name).append(" ").append(escape_help(help)).append("\n");
    out_.append("# TYPE ").append(name).append(" ").append(type).append("\n");
  }

  template <typename Value>
  void sample(std::string_view name, labels const& l, Value value)
  {
    out_ += name;
    if (!l.empty()) {
      out_ += '{';
      for (std::size_t i = 0; i < l.size(); ++i) {
        out_.append(i == 0 ? "" : ",")
            .append(l[i].first)
            .append("=\"")
            .append(escape_label_value(l[i].second))
            .append("\"");
      }
      out_ += '}';
    }
    absl::StrAppend(&out_, " ", number(value), "\n");
  }

  /// A family with one sample per element of `items`.
  template <typename Items, typename LabelsOf, typename ValueOf>
  void gauge_per(std::string_view name,
                 std::string_view help,
                 Items const& items,
                 LabelsOf labels_of,
                 ValueOf value_of,
                 std::string_view type = "gauge")
  {
    family(name, type, help);
    for (auto const& item : items) { sample(name, labels_of(item), value_of(item)); }
  }

  std::string take()
  {
    return std::move(out_);
  }

 private:
  std::string out_;
};

struct uid_totals {
  std::uint64_t bytes{};
  std::uint64_t allocations{};
  std::uint64_t sessions{};
};

/// A counter family `total` and a histogram family `duration` of `calls`:
/// every method's OK series always (so rates start at 0), other codes once
/// they have happened.
void write_calls(exposition& e,
                 std::string const& total,
                 std::string const& duration,
                 std::string_view counter_help,
                 std::string_view duration_help,
                 request_snapshot const& calls)
{
  e.family(total, "counter", counter_help);
  for (auto const& m : calls.methods) {
    for (std::size_t c = 0; c < status_code_count; ++c) {
      auto const n = m.calls[c];
      if (n == 0 && c != 0) { continue; }
      e.sample(total,
               {{"method", m.method}, {"code", std::string(status_code_name(static_cast<int>(c)))}},
               n);
    }
  }
  // A method's histogram from its first answer on: 17 series a method, for
  // every method of the service, were most of a scrape (40 of 67 KiB on a
  // fresh daemon), most of them zeros; the counter above names every method.
  e.family(duration, "histogram", duration_help);
  for (auto const& m : calls.methods) {
    auto const& h = m.latency;
    if (std::all_of(h.buckets.begin(), h.buckets.end(), [](auto n) { return n == 0; })) {
      continue;
    }
    std::uint64_t cumulative{};
    for (std::size_t b = 0; b < h.buckets.size(); ++b) {
      cumulative += h.buckets[b];
      auto const le = b < latency_bounds_seconds.size()
                          ? absl::StrFormat("%g", latency_bounds_seconds[b])
                          : std::string("+Inf");
      e.sample(duration + "_bucket", {{"method", m.method}, {"le", le}}, cumulative);
    }
    e.sample(duration + "_sum", {{"method", m.method}}, h.sum_seconds);
    e.sample(duration + "_count", {{"method", m.method}}, cumulative);
  }
}

/// Labels of a pool's series.
labels pool_labels(core::pool_stats const& p)
{
  return labels{{"pool", p.pool.name}};
}

/// The daemon itself: version, uptime, drain, sessions.
void write_daemon(exposition& e, daemon_snapshot const& s)
{
  e.family("rmmd_build_info", "gauge", "Always 1; the version label says which rmmd runs.");
  e.sample("rmmd_build_info", {{"version", s.version}}, std::uint64_t{1});
  e.family("rmmd_uptime_seconds", "gauge", "Seconds since the daemon started.");
  e.sample("rmmd_uptime_seconds", {}, s.uptime_seconds);
  e.family("rmmd_draining", "gauge", "1 while the daemon drains for shutdown, else 0.");
  e.sample("rmmd_draining", {}, std::uint64_t{s.draining ? 1u : 0u});
  e.family("rmmd_sessions", "gauge", "Live client sessions.");
  e.sample("rmmd_sessions", {}, static_cast<std::uint64_t>(s.stats.sessions.size()));
}

/// Address-stable memory: what sleeps, what its backups hold, and the wakes
/// that waited for room or were refused (docs/sleep.md).
void write_sleep(exposition& e, core::stable_totals const& t)
{
  e.family("rmmd_stable_awake_bytes", "gauge", "Bytes of address-stable allocations awake.");
  e.sample("rmmd_stable_awake_bytes", {}, static_cast<std::uint64_t>(t.awake_bytes));
  e.family("rmmd_sleeping_bytes",
           "gauge",
           "Device bytes of sleeping address-stable allocations, given back to their pools.");
  e.sample("rmmd_sleeping_bytes", {}, static_cast<std::uint64_t>(t.sleeping_bytes));
  e.family("rmmd_sleeping_allocations", "gauge", "Sleeping address-stable allocations.");
  e.sample("rmmd_sleeping_allocations", {}, static_cast<std::uint64_t>(t.sleeping_allocations));
  e.family("rmmd_sleep_backup_bytes",
           "gauge",
           "Host bytes the daemon holds as sleeping allocations' backups (charged to host pools).");
  e.sample("rmmd_sleep_backup_bytes", {}, static_cast<std::uint64_t>(t.backup_bytes));
  e.family("rmmd_kept_backup_names",
           "gauge",
           "Backup names kept after their session ended while asleep, waiting for a restore.");
  e.sample("rmmd_kept_backup_names", {}, static_cast<std::uint64_t>(t.kept_backup_names));
  e.family("rmmd_wake_waits_total", "counter", "Wakes that waited for room in their pool.");
  e.sample("rmmd_wake_waits_total", {}, t.wake_waits);
  e.family("rmmd_wake_failures_total",
           "counter",
           "Wakes refused for want of room by their deadline (nothing mapped).");
  e.sample("rmmd_wake_failures_total", {}, t.wake_failures);
}

/// Shared buffers' write leases (docs/failover.md): held and waited for
/// now, grants, waits and their timeouts, and the takeover histogram.
void write_leases(exposition& e, core::lease_totals const& t)
{
  e.family("rmmd_buffer_leases_held", "gauge", "Shared buffers whose write lease a session holds.");
  e.sample("rmmd_buffer_leases_held", {}, static_cast<std::uint64_t>(t.held));
  e.family("rmmd_buffer_lease_waiters",
           "gauge",
           "Exclusive opens waiting in line for a buffer's write lease.");
  e.sample("rmmd_buffer_lease_waiters", {}, static_cast<std::uint64_t>(t.waiters));
  e.family("rmmd_buffer_lease_grants_total",
           "counter",
           "Write leases granted: at once, or to the first in line.");
  e.sample("rmmd_buffer_lease_grants_total", {}, t.grants);
  e.family("rmmd_buffer_lease_waits_total", "counter", "Exclusive opens that waited in line.");
  e.sample("rmmd_buffer_lease_waits_total", {}, t.waits);
  e.family("rmmd_buffer_lease_wait_timeouts_total",
           "counter",
           "Waits for a write lease that ended at their deadline (DEADLINE_EXCEEDED; nothing "
           "changed).");
  e.sample("rmmd_buffer_lease_wait_timeouts_total", {}, t.wait_timeouts);
  std::string const takeover = "rmmd_buffer_lease_takeover_seconds";
  e.family(takeover,
           "histogram",
           "From a write lease holder's end (its close, or its session's end as the daemon "
           "handles it) to the grant to the first in line.");
  std::uint64_t cumulative{};
  for (std::size_t b = 0; b < t.takeover_buckets.size(); ++b) {
    cumulative += t.takeover_buckets[b];
    auto const le = b < core::takeover_bounds_seconds.size()
                        ? absl::StrFormat("%g", core::takeover_bounds_seconds[b])
                        : std::string("+Inf");
    e.sample(takeover + "_bucket", {{"le", le}}, cumulative);
  }
  e.sample(takeover + "_sum", {}, t.takeover_seconds_sum);
  e.sample(takeover + "_count", {}, cumulative);
}

/// What the start took back from the daemons before it, and what the
/// driver holds beyond the ledger.
void write_restart(exposition& e, core::stats_snapshot const& stats)
{
  auto const& r = stats.restart;
  e.family("rmmd_restarts_total",
           "counter",
           "Daemons before this one that kept buffers in the fd store (the state file's "
           "generation less one).");
  e.sample("rmmd_restarts_total", {}, static_cast<std::uint64_t>(r.restarts));
  e.family("rmmd_readopted_buffers", "gauge", "Buffers served again after the last restart.");
  e.sample("rmmd_readopted_buffers", {}, static_cast<std::uint64_t>(r.adopted_buffers));
  e.family("rmmd_readopted_bytes",
           "gauge",
           "Bytes of the allocations of the buffers served again after the last restart.");
  e.sample("rmmd_readopted_bytes", {}, static_cast<std::uint64_t>(r.adopted_bytes));
  e.family("rmmd_restart_dropped",
           "gauge",
           "Stored buffers or fds the start did not serve, each said in the log.");
  e.sample("rmmd_restart_dropped", {}, static_cast<std::uint64_t>(r.dropped));
  e.family("rmmd_keeping_buffers",
           "gauge",
           "1 where published buffers are kept across a restart (a service manager's fd store).");
  e.sample("rmmd_keeping_buffers", {}, std::uint64_t{r.keeping ? 1u : 0u});
  e.family("rmmd_reconnected_sessions_total",
           "counter",
           "Sessions opened since this start by clients that reconnected after a daemon before "
           "this one went away.");
  e.sample("rmmd_reconnected_sessions_total", {}, r.reconnected_sessions);
  auto gpu = [](core::gpu_memory_use const& g) {
    return labels{{"gpu_uuid", g.gpu_uuid}, {"device", std::to_string(g.device)}};
  };
  e.gauge_per("rmmd_gpu_driver_used_bytes",
              "Bytes the driver counts as used on the GPU (every process's).",
              stats.gpu_memory,
              gpu,
              [](auto const& g) { return static_cast<std::uint64_t>(g.driver_used_bytes); });
  e.gauge_per("rmmd_gpu_unaccounted_bytes",
              "Driver-used bytes beyond rmmd's ledger on the GPU: memory still held from before a "
              "restart, CUDA contexts, other processes.",
              stats.gpu_memory,
              gpu,
              [](auto const& g) { return static_cast<std::uint64_t>(g.unaccounted_bytes); });
  e.gauge_per("rmmd_gpu_spare_bytes",
              "Address-stable memory given back and kept for its uid's next allocation "
              "(--keep-released-memory): the daemon's, nobody's charge.",
              stats.gpu_memory,
              gpu,
              [](auto const& g) { return static_cast<std::uint64_t>(g.spare_bytes); });
}

/// Admission: a fixed label set (the four limits), never one series per uid.
void write_admission(exposition& e, admission_snapshot const& admission)
{
  e.family("rmmd_session_socket_pending_connections",
           "gauge",
           "Connections on the session socket that have not said hello yet.");
  e.sample("rmmd_session_socket_pending_connections", {}, admission.pending_connections);
  e.family("rmmd_admission_refusals_total",
           "counter",
           "Connections and hellos the session socket refused because a limit was reached, by "
           "limit (its field in rmmd.conf's admission message).");
  for (std::size_t l = 0; l < admission_limit_count; ++l) {
    e.sample("rmmd_admission_refusals_total",
             {{"limit", std::string(limit_name(static_cast<admission_limit>(l)))}},
             admission.refusals[l]);
  }
}

/// Pools: one info series with the descriptive labels, the figures by name.
void write_pools(exposition& e, std::vector<core::pool_stats> const& pools)
{
  auto const pool = pool_labels;
  e.gauge_per(
      "rmmd_pool_info",
      "Always 1; labels describe the pool (backend host or cuda; CUDA pools: the GPU's UUID "
      "and PCI bus id, the same in every process, and the daemon's device ordinal; -1 and "
      "empty for host pools).",
      pools,
      [](core::pool_stats const& p) {
        return labels{{"pool", p.pool.name},
                      {"pool_id", absl::StrCat(p.pool.id)},
                      {"backend", std::string(p.pool.backend.name)},
                      {"device", absl::StrCat(p.pool.device)},
                      {"gpu_uuid", p.pool.gpu_uuid},
                      {"pci_bus_id", p.pool.pci_bus_id}};
      },
      [](auto const&) { return std::uint64_t{1}; });
  e.gauge_per(
      "rmmd_pool_capacity_bytes",
      "Most bytes the pool may lend (its limit, or the backend's capacity).",
      pools,
      pool,
      [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.pool.capacity_bytes); });
  e.gauge_per("rmmd_pool_in_use_bytes",
              "Bytes lent out, as the daemon's ledger counts them.",
              pools,
              pool,
              [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.in_use_bytes); });
  e.gauge_per(
      "rmmd_pool_carved_bytes",
      "Bytes fast-path sessions report they carved out of their slabs (part of in_use, which "
      "counts slabs whole).",
      pools,
      pool,
      [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.carved_bytes); });
  e.gauge_per("rmmd_pool_idle_bytes",
              "Bytes of fast-path sessions' slabs not carved, as they last reported them (part of "
              "in_use).",
              pools,
              pool,
              [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.idle_bytes); });
  e.gauge_per(
      "rmmd_pool_reclaimable_bytes",
      "Of rmmd_pool_idle_bytes, the bytes of slabs with nothing carved, which their sessions "
      "give back when a request finds the pool short.",
      pools,
      pool,
      [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.reclaimable_bytes); });
  e.gauge_per(
      "rmmd_pool_reclaim_waits_total",
      "Requests that found the pool short and waited for other sessions' idle slabs.",
      pools,
      pool,
      [](core::pool_stats const& p) { return p.reclaim_waits; },
      "counter");
  e.gauge_per(
      "rmmd_pool_reclaim_served_total",
      "Of rmmd_pool_reclaim_waits_total, the requests the returned slabs made room for.",
      pools,
      pool,
      [](core::pool_stats const& p) { return p.reclaim_served; },
      "counter");
  e.gauge_per(
      "rmmd_pool_reclaim_refused_total",
      "Of rmmd_pool_reclaim_waits_total, the requests still short at reclaim_timeout (or a "
      "drain), refused.",
      pools,
      pool,
      [](core::pool_stats const& p) { return p.reclaim_refused; },
      "counter");
  e.gauge_per(
      "rmmd_pool_high_water_bytes",
      "Most bytes the pool has had lent out at once since the daemon started.",
      pools,
      pool,
      [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.high_water_bytes); });
  e.gauge_per(
      "rmmd_pool_live_allocations",
      "Live allocations in the pool.",
      pools,
      pool,
      [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.allocation_count); });
  e.gauge_per(
      "rmmd_pool_allocations_total",
      "Allocations the pool has made since the daemon started.",
      pools,
      pool,
      [](core::pool_stats const& p) { return p.total_allocations; },
      "counter");
}

/// Each pool's memory per tenant (one series per pool and uid with a session,
/// or per shared gid; "node" when tenancy is off): bounded by the node's
/// users, not by its sessions.
void write_tenants(exposition& e, std::vector<core::pool_stats> const& pools)
{
  struct row {
    std::string const* pool;
    core::tenant_pool_stats const* tenant;
  };
  std::vector<row> rows;
  for (auto const& p : pools) {
    for (auto const& t : p.tenants) { rows.push_back({&p.pool.name, &t}); }
  }
  auto const tenant = [](row const& r) {
    return labels{{"pool", *r.pool}, {"tenant", r.tenant->tenant}};
  };
  e.gauge_per("rmmd_tenant_pool_in_use_bytes",
              "Bytes of the pool lent to one tenant (uid, shared gid, or node), from memory of "
              "that tenant's own.",
              rows,
              tenant,
              [](row const& r) { return static_cast<std::uint64_t>(r.tenant->in_use_bytes); });
  std::vector<row> reported;
  for (auto const& r : rows) {
    if (r.tenant->backend_reserved_bytes) { reported.push_back(r); }
  }
  e.gauge_per("rmmd_tenant_pool_backend_reserved_bytes",
              "Bytes one tenant's backend of the pool holds from the driver (CUDA pools), lent "
              "or kept idle up to its release threshold.",
              reported,
              tenant,
              [](row const& r) { return *r.tenant->backend_reserved_bytes; });
}

/// Named shared buffers, per pool (never a series per buffer name: names are
/// unbounded; rmmctl buffers lists them).
void write_shared_buffers(exposition& e, std::vector<core::pool_stats> const& pools)
{
  auto const pool = pool_labels;
  e.gauge_per(
      "rmmd_pool_shared_buffers",
      "Named shared buffers in the pool (deleted ones still held included).",
      pools,
      pool,
      [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.shared_buffers); });
  e.gauge_per("rmmd_pool_shared_bytes",
              "Bytes of the pool in named shared buffers (part of in_use).",
              pools,
              pool,
              [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.shared_bytes); });
  e.gauge_per(
      "rmmd_pool_shared_buffer_holders",
      "Sessions holding the pool's shared buffers, summed over the buffers.",
      pools,
      pool,
      [](core::pool_stats const& p) { return static_cast<std::uint64_t>(p.shared_holders); });
}

/// The backend's own figures, only for pools whose backend reports them.
void write_backend_figures(exposition& e, std::vector<core::pool_stats> const& pools)
{
  auto const pool = pool_labels;
  std::vector<core::pool_stats> reporting;
  std::vector<core::pool_stats> with_threshold;
  for (auto const& p : pools) {
    if (p.backend_reserved_bytes && p.backend_used_bytes) { reporting.push_back(p); }
    if (p.release_threshold_bytes) { with_threshold.push_back(p); }
  }
  e.gauge_per("rmmd_pool_reserved_bytes",
              "Bytes the backend holds from the driver (cudaMemPoolAttrReservedMemCurrent).",
              reporting,
              pool,
              [](core::pool_stats const& p) { return *p.backend_reserved_bytes; });
  e.gauge_per("rmmd_pool_used_bytes",
              "Bytes of the backend's reserve in allocations (cudaMemPoolAttrUsedMemCurrent).",
              reporting,
              pool,
              [](core::pool_stats const& p) { return *p.backend_used_bytes; });
  e.gauge_per("rmmd_pool_release_threshold_bytes",
              "Bytes the backend keeps reserved when idle (cudaMemPoolAttrReleaseThreshold).",
              with_threshold,
              pool,
              [](core::pool_stats const& p) { return *p.release_threshold_bytes; });
}

/// Sessions. Every session counts in its uid's series (write_uids); only the
/// top_sessions holding the most bytes have series of their own (labels
/// session, uid, pid...), so that a scrape stays small with thousands of
/// sessions. The rest are summed in rmmd_unlisted_sessions*.
void write_sessions(exposition& e,
                    std::vector<core::session_info> const& sessions,
                    std::size_t top_sessions)
{
  std::vector<core::session_info const*> listed;
  listed.reserve(sessions.size());
  for (auto const& i : sessions) { listed.push_back(&i); }
  auto const shown = std::min(top_sessions, listed.size());
  // Most bytes first; then most allocations; then the oldest session (the
  // lowest id), so that the same sessions are shown from scrape to scrape.
  std::partial_sort(listed.begin(),
                    listed.begin() + static_cast<std::ptrdiff_t>(shown),
                    listed.end(),
                    [](core::session_info const* a, core::session_info const* b) {
                      return std::tuple(b->bytes, b->allocation_count, a->id) <
                             std::tuple(a->bytes, a->allocation_count, b->id);
                    });
  uid_totals unlisted;
  for (std::size_t i = shown; i < listed.size(); ++i) {
    unlisted.bytes += listed[i]->bytes;
    unlisted.allocations += listed[i]->allocation_count;
    ++unlisted.sessions;
  }
  listed.resize(shown);
  auto session = [](core::session_info const* i) {
    return labels{{"session", absl::StrCat(i->id)},
                  {"uid", absl::StrCat(i->peer.uid)},
                  {"pid", absl::StrCat(i->peer.pid)},
                  {"command", i->command},
                  {"client", i->client_name}};
  };
  e.gauge_per(
      "rmmd_session_bytes",
      "Bytes a session holds; only the sessions holding the most (see rmmd_unlisted_sessions).",
      listed,
      session,
      [](core::session_info const* i) { return static_cast<std::uint64_t>(i->bytes); });
  e.gauge_per(
      "rmmd_session_live_allocations",
      "Live allocations a session holds; only the sessions holding the most bytes.",
      listed,
      session,
      [](core::session_info const* i) { return static_cast<std::uint64_t>(i->allocation_count); });
  e.gauge_per(
      "rmmd_session_idle_bytes",
      "Bytes of a fast-path session's slabs not carved, as it last reported them; only the "
      "sessions holding the most bytes.",
      listed,
      session,
      [](core::session_info const* i) { return static_cast<std::uint64_t>(i->idle_bytes); });
  e.family("rmmd_unlisted_sessions",
           "gauge",
           "Live sessions without rmmd_session_* series of their own (beyond the top "
           "metrics_top_sessions by bytes).");
  e.sample("rmmd_unlisted_sessions", {}, unlisted.sessions);
  e.family("rmmd_unlisted_session_bytes", "gauge", "Bytes the unlisted sessions hold together.");
  e.sample("rmmd_unlisted_session_bytes", {}, unlisted.bytes);
  e.family("rmmd_unlisted_session_live_allocations",
           "gauge",
           "Live allocations the unlisted sessions hold together.");
  e.sample("rmmd_unlisted_session_live_allocations", {}, unlisted.allocations);
}

/// Per uid: every session, and the shared buffers each uid created.
void write_uids(exposition& e, core::stats_snapshot const& stats)
{
  auto const& sessions = stats.sessions;
  std::map<uid_t, uid_totals> uids;
  for (auto const& i : sessions) {
    auto& u = uids[i.peer.uid];
    u.bytes += i.bytes;
    u.allocations += i.allocation_count;
    ++u.sessions;
  }
  auto uid = [](auto const& kv) { return labels{{"uid", absl::StrCat(kv.first)}}; };
  e.gauge_per("rmmd_uid_bytes", "Bytes the sessions of a uid hold.", uids, uid, [](auto const& kv) {
    return kv.second.bytes;
  });
  e.gauge_per("rmmd_uid_shared_bytes",
              "Bytes of the shared buffers a uid created and that are not freed yet: charged to "
              "its quota beside rmmd_uid_bytes, also after the creating session ended.",
              stats.uid_shared_bytes,
              uid,
              [](auto const& kv) { return static_cast<std::uint64_t>(kv.second); });
  e.gauge_per("rmmd_uid_live_allocations",
              "Live allocations the sessions of a uid hold.",
              uids,
              uid,
              [](auto const& kv) { return kv.second.allocations; });
  e.gauge_per("rmmd_uid_sessions", "Live sessions of a uid.", uids, uid, [](auto const& kv) {
    return kv.second.sessions;
  });
}

/// The calls of both sockets, each transport's methods as its counters name
/// them (the call table's).
void write_all_calls(exposition& e, daemon_snapshot const& s)
{
  write_calls(e,
              "rmmd_grpc_requests_total",
              "rmmd_grpc_request_duration_seconds",
              "gRPC calls the daemon has answered, by method and status code.",
              "Time the daemon took to answer a gRPC call, by method.",
              s.requests);
  write_calls(e,
              "rmmd_session_calls_total",
              "rmmd_session_call_duration_seconds",
              "Calls the daemon has answered on session sockets (what clients use when the "
              "daemon offers it), by method and status code.",
              "Time the daemon took to answer a session-socket call, by method.",
              s.session_calls);
}

}  // namespace

std::string escape_label_value(std::string_view value)
{
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string render_prometheus(daemon_snapshot const& s, render_options const& options)
{
  exposition e;
  write_daemon(e, s);
  write_restart(e, s.stats);
  write_admission(e, s.admission);
  write_sleep(e, s.stable);
  write_leases(e, s.leases);
  write_pools(e, s.stats.pools);
  write_shared_buffers(e, s.stats.pools);
  write_tenants(e, s.stats.pools);
  write_backend_figures(e, s.stats.pools);
  write_sessions(e, s.stats.sessions, options.top_sessions);
  write_uids(e, s.stats);
  write_all_calls(e, s);
  return e.take();
}

}  // namespace rmmd::metrics
