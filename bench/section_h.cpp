// Section h of rmmd_bench: a busy node. See section_h.hpp and
// bench/README.md; its helper processes are in section_h_helpers.cpp.

#include "bench/section_h.hpp"
#include "bench/section_support.hpp"
#include "bench/targets.hpp"

#include "bench/bench_session.hpp"
#include "harness/raw_session.hpp"

#include <rmmd/session.hpp>

#include <httplib.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::bench {
namespace {

// The section's targets, and its leases' size.
constexpr double session_target_bytes = 16.0 * 1024;  // per open session
constexpr double setup_target_ms      = 2.0;          // p99 with 1,000 sessions open
constexpr double listing_target_ms    = 100.0;        // rmmctl stats, /metrics, max
constexpr double listing_target_bytes = 64.0 * 1024;  // their size with 1,000 sessions
constexpr double close_target_ms      = 50.0;         // 100,000 leases back, p50
constexpr std::uint64_t lease_bytes   = scale_lease_bytes;

struct counts {
  std::size_t host_leases{1'000'000};
  std::size_t lease_holders{4};
  std::size_t cuda_leases{100'000};
  std::size_t sessions{1000};
  std::size_t session_processes{4};
  std::size_t setup_probes{200};
  std::size_t calls{20};
  std::size_t close_leases{100'000};
  std::size_t close_trials{3};

  static counts make(bool quick)
  {
    counts c;
    if (quick) {
      c.host_leases  = 100'000;
      c.cuda_leases  = 10'000;
      c.setup_probes = 50;
      c.calls        = 5;
      c.close_trials = 1;
    }
    return c;
  }
};

double seconds_between(steady::time_point a, steady::time_point b)
{
  return std::chrono::duration<double>(b - a).count();
}

double ms_between(steady::time_point a, steady::time_point b)
{
  return std::chrono::duration<double, std::milli>(b - a).count();
}

double mib(double bytes)
{
  return bytes / (1 << 20);
}

char const* verdict(target_row const& t)
{
  return t.pass() ? "pass" : "MISS";
}

results::Target target_of(target_row const& t)
{
  results::Target out;
  std::ostringstream limit;
  limit << (t.at_most ? "<= " : ">= ") << t.limit << " " << t.unit;
  out.set_target(limit.str());
  out.set_pass(t.pass());
  return out;
}

/// The next line of `p` that starts with "ready", "samples" or "error";
/// throws naming `who` at EOF, at the deadline, or on "error".
std::string protocol_line(child_process& p, std::string const& who, steady::time_point deadline)
{
  for (auto line = p.read_line(deadline); line; line = p.read_line(deadline)) {
    if (line->starts_with("error ")) { throw bench_error(who + ": " + line->substr(6)); }
    if (line->starts_with("ready") || line->starts_with("samples")) { return *line; }
  }
  auto status = p.wait(steady::now());
  throw bench_error(
      who + " (pid " + std::to_string(p.pid()) + ") said nothing " +
      (status ? "and exited with status " + std::to_string(*status) : "before its deadline"));
}

std::vector<double> parse_samples(std::string const& line)
{
  std::istringstream in(line.substr(std::strlen("samples")));
  std::vector<double> out;
  for (double v; in >> v;) { out.push_back(v); }
  return out;
}

/// A session of the bench's own on a daemon, for its stats call.
class observer {
 public:
  enum class core_backend { host, cuda };

  explicit observer(std::filesystem::path const& runtime_dir)
      : session_(rmmd::session::options{.runtime_dir = runtime_dir, .client_name = "rmmd-bench-h"})
  {
  }

  /// GetStats with `top` sessions (none: every session), as JSON.
  std::string stats_json(std::optional<std::uint32_t> top) const
  {
    return rmmd::admin(session_).stats_json({.top = top});
  }

  /// GetStats with `top` sessions (none: every session); the reply.
  v1::Stats stats(std::optional<std::uint32_t> top = 0) const
  {
    return get_stats(session_, {.top = top});
  }

  std::uint64_t in_use(std::uint32_t pool) const
  {
    auto const now = stats();
    for (auto const& p : now.pools()) {
      if (p.pool().id() == pool) { return p.in_use_bytes(); }
    }
    throw bench_error("no pool " + std::to_string(pool) + " in the stats");
  }

  std::uint64_t live(std::uint32_t pool) const
  {
    auto const now = stats();
    for (auto const& p : now.pools()) {
      if (p.pool().id() == pool) { return p.allocation_count(); }
    }
    throw bench_error("no pool " + std::to_string(pool) + " in the stats");
  }

  /// The host pool, or GPU 0's pool; throws (naming the pools) if none.
  std::uint32_t pool_of(core_backend backend) const
  {
    return backend == core_backend::host ? session_.host_pool().id : session_.device_pool(0).id;
  }

  std::string metrics_address() const
  {
    return rmmd::admin(session_).health().metrics_address;
  }

 private:
  rmmd::session session_;
};

/// Starts a --raw-leases holder and waits for its "ready".
child_process start_holder(scale_options const& o,
                           std::filesystem::path const& dir,
                           std::string const& kind,
                           std::size_t count)
{
  child_process p({o.self.string(),
                   "--raw-leases",
                   dir.string(),
                   kind,
                   std::to_string(count),
                   std::to_string(lease_bytes)},
                  o.helper_env);
  return p;
}

void await_ready(child_process& p, std::string const& who, std::chrono::seconds timeout)
{
  auto line = protocol_line(p, who, steady::now() + timeout);
  if (!line.starts_with("ready")) { throw bench_error(who + " said: " + line); }
}

/// The daemon's RSS with `count` leases on `kind`'s pool held by `holders`
/// processes, and after they exit.
void measure_leases(scale_options const& o,
                    daemon_process const& daemon,
                    observer const& obs,
                    std::uint32_t pool,
                    std::string const& kind,
                    std::size_t count,
                    std::size_t holders,
                    results::ScaleLeases& out,
                    std::vector<target_row>& targets)
{
  out.set_pool(kind);
  out.set_leases(static_cast<std::uint32_t>(count));
  out.set_holders(static_cast<std::uint32_t>(holders));
  auto const live_before = obs.live(pool);
  auto const idle        = rss_bytes(daemon.pid());
  out.set_idle_rss_bytes(static_cast<double>(idle));
  std::vector<child_process> ps;
  auto const t0 = steady::now();
  for (std::size_t i = 0; i < holders; ++i) {
    auto const share = count / holders + (i < count % holders ? 1 : 0);
    ps.push_back(start_holder(o, daemon.runtime_dir(), kind, share));
  }
  for (auto& p : ps) { await_ready(p, "a --raw-leases holder", std::chrono::seconds(600)); }
  out.set_make_seconds(seconds_between(t0, steady::now()));
  auto const live = obs.live(pool) - live_before;
  auto const rss  = rss_bytes(daemon.pid());
  out.set_daemon_live_allocations(static_cast<double>(live));
  out.set_with_leases_rss_bytes(static_cast<double>(rss));
  auto const per =
      (static_cast<double>(rss) - static_cast<double>(idle)) / static_cast<double>(count);
  out.set_per_lease_bytes(per);
  target_row t{"daemon RSS per live lease, " + kind + " pool, " + std::to_string(count) + " leases",
               per,
               true,
               lease_rss_target_bytes,
               "B"};
  *out.mutable_target() = target_of(t);
  targets.push_back(t);
  std::printf(
      "  %s pool: %zu leases (daemon counts %llu) made by %zu processes in %.1f s; RSS %.1f MiB "
      "-> %.1f MiB: %.0f B per lease (target <= %.0f B: %s)\n",
      kind.c_str(),
      count,
      static_cast<unsigned long long>(live),
      holders,
      out.make_seconds(),
      mib(static_cast<double>(idle)),
      mib(static_cast<double>(rss)),
      per,
      lease_rss_target_bytes,
      verdict(t));
  std::fflush(stdout);
  for (auto& p : ps) { p.close_stdin(); }
  for (auto& p : ps) { p.finish(std::chrono::seconds(60)); }
  auto const deadline = steady::now() + std::chrono::seconds(60);
  while (obs.live(pool) > live_before && steady::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  out.set_after_close_rss_bytes(static_cast<double>(rss_bytes(daemon.pid())));
  std::printf("  after the holders exit: %.1f MiB\n", mib(out.after_close_rss_bytes()));
}

/// A session holding `count` leases SIGKILLed, to its memory back, `trials` times.
void measure_close(scale_options const& o,
                   daemon_process const& daemon,
                   observer const& obs,
                   std::uint32_t pool,
                   std::string const& kind,
                   std::size_t count,
                   std::size_t trials,
                   results::ScaleClose& out,
                   std::vector<target_row>& targets)
{
  out.set_pool(kind);
  out.set_leases(static_cast<std::uint32_t>(count));
  std::vector<double> ms;
  for (std::size_t trial = 0; trial < trials; ++trial) {
    auto const before = obs.in_use(pool);
    auto holder       = start_holder(o, daemon.runtime_dir(), kind, count);
    await_ready(holder, "a --raw-leases holder", std::chrono::seconds(600));
    // At least the leases' bytes: a CUDA pool's are packed into blocks.
    if (obs.in_use(pool) < before + count * lease_bytes) {
      throw bench_error("the daemon does not count the holder's leases");
    }
    auto const t0 = steady::now();
    holder.kill(SIGKILL);
    auto const deadline = t0 + std::chrono::seconds(30);
    while (obs.in_use(pool) != before) {
      if (steady::now() > deadline) {
        throw bench_error("the killed session's memory did not come back within 30 s");
      }
    }
    ms.push_back(ms_between(t0, steady::now()));
    holder.finish(std::chrono::seconds(5));
  }
  std::sort(ms.begin(), ms.end());
  auto const p50 = ms[(ms.size() - 1) / 2];
  out.set_trials(static_cast<std::uint32_t>(ms.size()));
  out.set_p50_ms(p50);
  out.set_max_ms(ms.back());
  target_row t{"SIGKILL of a session holding " + std::to_string(count) + " " + kind +
                   " leases to memory back, p50",
               p50,
               true,
               close_target_ms,
               "ms"};
  *out.mutable_target() = target_of(t);
  targets.push_back(t);
  std::printf(
      "  %s pool: a session holding %zu leases SIGKILLed, to memory back: p50 %.1f ms, "
      "max %.1f ms over %zu trials (target p50 <= %.0f ms: %s)\n",
      kind.c_str(),
      count,
      p50,
      ms.back(),
      ms.size(),
      close_target_ms,
      verdict(t));
  std::fflush(stdout);
}

/// The rmmctl beside `rmmd` (a bundle's bin/), or in the build tree's client/.
std::optional<std::filesystem::path> find_rmmctl(std::filesystem::path const& rmmd)
{
  auto const dir = rmmd.parent_path();
  for (auto const& candidate : {dir / "rmmctl", dir.parent_path() / "rmmctl" / "rmmctl"}) {
    if (::access(candidate.c_str(), X_OK) == 0) { return candidate; }
  }
  return std::nullopt;
}

/// Times `calls` runs of `call` (returning the reply's size); fills `out`.
template <typename Call>
void time_calls(std::size_t calls, results::ScaleCall& out, Call&& call)
{
  std::vector<double> ms;
  double bytes = 0;
  for (std::size_t i = 0; i < calls; ++i) {
    auto const t0 = steady::now();
    bytes         = call();
    ms.push_back(ms_between(t0, steady::now()));
  }
  std::sort(ms.begin(), ms.end());
  out.set_p50_ms(ms[(ms.size() - 1) / 2]);
  out.set_max_ms(ms.back());
  out.set_bytes(bytes);
}

void judge_call(std::string const& what,
                results::ScaleCall& out,
                std::vector<target_row>& targets,
                bool size_target)
{
  target_row t{what + ", max", out.max_ms(), true, listing_target_ms, "ms"};
  *out.mutable_target() = target_of(t);
  targets.push_back(t);
  std::string size_verdict;
  if (size_target) {
    target_row s{what + ", size", out.bytes() / 1024, true, listing_target_bytes / 1024, "KiB"};
    targets.push_back(s);
    size_verdict = std::string(", size target <= 64 KiB: ") + verdict(s);
  }
  std::printf("  %-44s p50 %7.2f ms  max %7.2f ms  %8.1f KiB  (target max <= %.0f ms: %s%s)\n",
              what.c_str(),
              out.p50_ms(),
              out.max_ms(),
              out.bytes() / 1024,
              listing_target_ms,
              verdict(t),
              size_verdict.c_str());
}

/// Opens the sessions (in c.session_processes helpers, each session
/// holding one lease) and judges the daemon's RSS per session; returns the
/// helpers, which keep them open until their stdin closes.
std::vector<child_process> open_sessions(scale_options const& o,
                                         counts const& c,
                                         daemon_process const& daemon,
                                         results::ScaleSessions& out,
                                         std::vector<target_row>& targets)
{
  out.set_sessions(static_cast<std::uint32_t>(c.sessions));
  out.set_processes(static_cast<std::uint32_t>(c.session_processes));
  auto const idle = rss_bytes(daemon.pid());
  out.set_idle_rss_bytes(static_cast<double>(idle));
  std::vector<child_process> ps;
  for (std::size_t i = 0; i < c.session_processes; ++i) {
    auto const share =
        c.sessions / c.session_processes + (i < c.sessions % c.session_processes ? 1 : 0);
    ps.emplace_back(std::vector<std::string>{o.self.string(),
                                             "--raw-sessions",
                                             daemon.runtime_dir().string(),
                                             std::to_string(share),
                                             std::to_string(lease_bytes)},
                    o.helper_env);
  }
  std::vector<double> ramp;
  for (auto& p : ps) {
    await_ready(p, "a --raw-sessions process", std::chrono::seconds(300));
    auto samples = parse_samples(
        protocol_line(p, "a --raw-sessions process", steady::now() + std::chrono::seconds(30)));
    ramp.insert(ramp.end(), samples.begin(), samples.end());
  }
  auto const rss = rss_bytes(daemon.pid());
  out.set_with_sessions_rss_bytes(static_cast<double>(rss));
  auto const per =
      (static_cast<double>(rss) - static_cast<double>(idle)) / static_cast<double>(c.sessions);
  out.set_per_session_bytes(per);
  target_row per_t{"daemon RSS per open session, " + std::to_string(c.sessions) + " sessions",
                   per / 1024,
                   true,
                   session_target_bytes / 1024,
                   "KiB"};
  *out.mutable_per_session_target() = target_of(per_t);
  targets.push_back(per_t);
  auto const ramp_summary = summarize(ramp);
  out.mutable_setup_ramp()->set_p50_us(ramp_summary.p50_us);
  out.mutable_setup_ramp()->set_p99_us(ramp_summary.p99_us);
  std::printf(
      "  %zu sessions in %zu processes, one 256 B lease each: RSS %.1f MiB -> %.1f MiB: "
      "%.2f KiB per session (target <= %.0f KiB: %s)\n",
      c.sessions,
      c.session_processes,
      mib(static_cast<double>(idle)),
      mib(static_cast<double>(rss)),
      per / 1024,
      session_target_bytes / 1024,
      verdict(per_t));
  std::printf("  set-up (hello to welcome) on the way there: p50 %.3f ms, p99 %.3f ms\n",
              ramp_summary.p50_us / 1000,
              ramp_summary.p99_us / 1000);
  return ps;
}

/// Set-up with them all open: one helper opens and closes more sessions, one
/// at a time.
void probe_setup(child_process& helper,
                 counts const& c,
                 results::ScaleSessions& out,
                 std::vector<target_row>& targets)
{
  helper.write_line("probe " + std::to_string(c.setup_probes));
  auto probes = parse_samples(
      protocol_line(helper, "a --raw-sessions process", steady::now() + std::chrono::seconds(120)));
  auto const probe_summary = summarize(probes);
  out.set_setup_probes(static_cast<std::uint32_t>(probes.size()));
  out.mutable_setup_with_all_open()->set_p50_us(probe_summary.p50_us);
  out.mutable_setup_with_all_open()->set_p99_us(probe_summary.p99_us);
  target_row setup_t{"session set-up with " + std::to_string(c.sessions) + " open, p99",
                     probe_summary.p99_us / 1000,
                     true,
                     setup_target_ms,
                     "ms"};
  *out.mutable_setup_target() = target_of(setup_t);
  targets.push_back(setup_t);
  std::printf(
      "  set-up with %zu open (%zu more, opened and closed): p50 %.3f ms, p99 %.3f ms "
      "(target p99 <= %.0f ms: %s)\n",
      c.sessions,
      probes.size(),
      probe_summary.p50_us / 1000,
      probe_summary.p99_us / 1000,
      setup_target_ms,
      verdict(setup_t));
}

/// `rmmctl stats` as a process, c.calls times.
void time_rmmctl(scale_options const& o,
                 counts const& c,
                 daemon_process const& daemon,
                 results::ScaleSessions& out,
                 std::vector<target_row>& targets)
{
  try {
    auto const rmmctl = find_rmmctl(o.rmmd);
    if (!rmmctl) { throw bench_error("no rmmctl beside " + o.rmmd.string()); }
    time_calls(c.calls, *out.mutable_rmmctl_stats(), [&] {
      child_process p({rmmctl->string(), "--runtime-dir", daemon.runtime_dir().string(), "stats"},
                      {},
                      {.merge_stderr = true});
      p.close_stdin();
      auto const text   = p.read_all(std::chrono::seconds(30));
      auto const status = p.wait(std::chrono::seconds(30));
      if (status != 0) { throw bench_error("rmmctl stats failed: " + text); }
      return static_cast<double>(text.size());
    });
    judge_call("rmmctl stats (a process: start, session, call)",
               *out.mutable_rmmctl_stats(),
               targets,
               true);
  } catch (std::exception const& e) {
    out.mutable_rmmctl_stats()->set_error(e.what());
    std::printf("  rmmctl stats: ERROR %s\n", e.what());
  }
}

/// GET /metrics, c.calls times.
void time_metrics(counts const& c,
                  observer const& obs,
                  results::ScaleSessions& out,
                  std::vector<target_row>& targets)
{
  try {
    auto const address = obs.metrics_address();
    auto const colon   = address.rfind(':');
    if (address.empty() || colon == std::string::npos) {
      throw bench_error("the daemon serves no metrics");
    }
    httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
    http.set_read_timeout(std::chrono::seconds(30));
    time_calls(c.calls, *out.mutable_metrics_scrape(), [&] {
      auto r = http.Get("/metrics");
      if (!r || r->status != 200) { throw bench_error("GET /metrics failed"); }
      return static_cast<double>(r->body.size());
    });
    judge_call("GET /metrics", *out.mutable_metrics_scrape(), targets, true);
  } catch (std::exception const& e) {
    out.mutable_metrics_scrape()->set_error(e.what());
    std::printf("  /metrics: ERROR %s\n", e.what());
  }
}

/// Listing the sessions: GetStats with every one and with the top 21,
/// rmmctl stats, a /metrics scrape.
void time_listings(scale_options const& o,
                   counts const& c,
                   daemon_process const& daemon,
                   observer const& obs,
                   results::ScaleSessions& out,
                   std::vector<target_row>& targets)
{
  out.set_calls(static_cast<std::uint32_t>(c.calls));
  // Timed: the call and its JSON (rmmd::admin's form, what rmmctl reads);
  // the size: the reply's on the wire.
  time_calls(c.calls, *out.mutable_get_stats_all(), [&] {
    return static_cast<double>(obs.stats_json(std::nullopt).size());
  });
  out.mutable_get_stats_all()->set_bytes(
      static_cast<double>(obs.stats(std::nullopt).ByteSizeLong()));
  std::printf("  %-44s p50 %7.2f ms  max %7.2f ms  %8.1f KiB  (for reference)\n",
              "GetStats, every session",
              out.get_stats_all().p50_ms(),
              out.get_stats_all().max_ms(),
              out.get_stats_all().bytes() / 1024);
  time_calls(c.calls, *out.mutable_get_stats_top(), [&] {
    return static_cast<double>(obs.stats_json(21).size());
  });
  out.mutable_get_stats_top()->set_bytes(static_cast<double>(obs.stats(21).ByteSizeLong()));
  judge_call(
      "GetStats, top 21 sessions (rmmctl stats')", *out.mutable_get_stats_top(), targets, true);
  time_rmmctl(o, c, daemon, out, targets);
  time_metrics(c, obs, out, targets);
  std::fflush(stdout);
}

void measure_sessions(scale_options const& o,
                      counts const& c,
                      daemon_process const& daemon,
                      observer const& obs,
                      results::ScaleSessions& out,
                      std::vector<target_row>& targets)
{
  auto ps = open_sessions(o, c, daemon, out, targets);
  probe_setup(ps.front(), c, out, targets);
  time_listings(o, c, daemon, obs, out, targets);

  for (auto& p : ps) { p.close_stdin(); }
  for (auto& p : ps) { p.finish(std::chrono::seconds(60)); }
  auto const deadline = steady::now() + std::chrono::seconds(60);
  while (obs.stats(0).session_count() > 1 && steady::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  out.set_after_close_rss_bytes(static_cast<double>(rss_bytes(daemon.pid())));
  std::printf("  after the sessions close: %.1f MiB\n", mib(out.after_close_rss_bytes()));
}

/// Runs `body`, recording a failure in `error` (and on stdout) instead of
/// ending the section.
template <typename Body>
void part(std::string const& name, Body&& body, std::string* error)
{
  try {
    body();
  } catch (std::exception const& e) {
    *error = e.what();
    std::printf("  ERROR (h, %s): %s\n", name.c_str(), e.what());
    std::fflush(stdout);
  }
}

}  // namespace

std::vector<target_row> section_scale(scale_options const& o, results::Scale& out)
{
  auto const c = counts::make(o.quick);
  std::vector<target_row> targets;
  std::printf("\nh) a busy node: %zu sessions, %zu leases on a host pool, %zu on the CUDA pool\n",
              c.sessions,
              c.host_leases,
              o.cuda_daemon != nullptr ? c.cuda_leases : 0);
  std::fflush(stdout);

  {
    // A host-only daemon of the section's own: its idle RSS has no CUDA
    // context in it, and its pool holds a million 256-byte leases.
    daemon_process host(bench_daemon(o.rmmd,
                                     {"--backend=host",
                                      "--host-pool-bytes",
                                      "1GiB",
                                      "--metrics-address",
                                      "127.0.0.1:0",
                                      "--max-sessions-per-uid",
                                      "4096",
                                      "--log-level",
                                      "warning"},
                                     std::chrono::seconds(60)));
    observer obs(host.runtime_dir());
    auto const pool = obs.pool_of(observer::core_backend::host);
    {
      // Warm up: the call threads' first calls, one session and lease.
      harness::raw_session warm(host.runtime_dir(), "rmmd-bench-warm-up");
      (void)warm.allocate(pool, lease_bytes, 100);
    }
    std::string error;
    part(
        "sessions",
        [&] { measure_sessions(o, c, host, obs, *out.mutable_sessions(), targets); },
        &error);
    if (!error.empty()) { out.mutable_sessions()->set_error(error); }
    error.clear();
    part(
        "host leases",
        [&] {
          measure_leases(o,
                         host,
                         obs,
                         pool,
                         "host",
                         c.host_leases,
                         c.lease_holders,
                         *out.mutable_host_leases(),
                         targets);
        },
        &error);
    if (!error.empty()) { out.mutable_host_leases()->set_error(error); }
    error.clear();
    part(
        "host close",
        [&] {
          measure_close(o,
                        host,
                        obs,
                        pool,
                        "host",
                        c.close_leases,
                        c.close_trials,
                        *out.mutable_host_close(),
                        targets);
        },
        &error);
    if (!error.empty()) { out.mutable_host_close()->set_error(error); }
  }

  if (o.cuda_daemon != nullptr) {
    auto const& daemon = *o.cuda_daemon;
    std::string error;
    std::optional<observer> obs;
    part(
        "cuda", [&] { obs.emplace(daemon.runtime_dir()); }, &error);
    if (obs) {
      auto const pool = obs->pool_of(observer::core_backend::cuda);
      part(
          "cuda leases",
          [&] {
            measure_leases(o,
                           daemon,
                           *obs,
                           pool,
                           "cuda",
                           c.cuda_leases,
                           1,
                           *out.mutable_cuda_leases(),
                           targets);
          },
          &error);
      if (!error.empty()) { out.mutable_cuda_leases()->set_error(error); }
      error.clear();
      part(
          "cuda close",
          [&] {
            measure_close(o,
                          daemon,
                          *obs,
                          pool,
                          "cuda",
                          c.close_leases,
                          c.close_trials,
                          *out.mutable_cuda_close(),
                          targets);
          },
          &error);
      if (!error.empty()) { out.mutable_cuda_close()->set_error(error); }
    } else {
      out.set_error(error);
    }
  }
  return targets;
}

int section_scale_without_gpu(scale_options const& o,
                              std::string const& out_path,
                              std::string const& command)
{
  return run_section_without_gpu(
      "h", "Targets (issue 14)", o.quick, out_path, command, [&](auto& run) {
        return section_scale(o, *run.mutable_scale());
      });
}

}  // namespace rmmd::bench
