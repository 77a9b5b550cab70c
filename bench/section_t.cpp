// Section t of rmmd_bench: tenants (section_t.hpp says what it measures).

#include "bench/section_t.hpp"

#include "bench/section_support.hpp"

#include "harness/raw_session.hpp"

#include <rmmd/session.hpp>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

namespace rmmd::bench {
namespace {

namespace fs = std::filesystem;

/// The helpers' uids: numeric, with no passwd entry needed.
constexpr uid_t first_uid = 61000;

/// Lets every uid reach the daemon's sockets (the harness makes its runtime
/// directory 0700; a node gives its users group `rmmd` instead).
void open_to_every_uid(fs::path const& dir)
{
  fs::permissions(dir,
                  fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                      fs::perms::others_read | fs::perms::others_exec);
  for (auto const* socket : {"rmmd-session.sock", "rmmd.sock"}) {
    std::error_code ec;
    fs::permissions(dir / socket,
                    fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read |
                        fs::perms::group_write | fs::perms::others_read | fs::perms::others_write,
                    ec);
  }
}

/// `argv` run as uid (and gid) `uid`, no supplementary groups.
std::vector<std::string> as_uid(uid_t uid, std::vector<std::string> argv)
{
  std::vector<std::string> out{"/usr/bin/setpriv",
                               "--reuid=" + std::to_string(uid),
                               "--regid=" + std::to_string(uid),
                               "--clear-groups",
                               "--"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::vector<std::string> daemon_args(tenants_options const& o,
                                     std::string const& pool_bytes,
                                     std::size_t uids)
{
  std::vector<std::string> args;
  if (o.cuda) {
    args = {"--backend=cuda", "--cuda-pool-bytes", pool_bytes, "--fabric", "off"};
  } else {
    args = {"--backend=host", "--host-pool-bytes", pool_bytes};
  }
  args.insert(args.end(), {"--reclaim-timeout-ms", "1000", "--allow-uid", "0"});
  for (std::size_t i = 0; i < uids; ++i) {
    args.insert(args.end(), {"--allow-uid", std::to_string(first_uid + i)});
  }
  return args;
}

std::vector<double> samples_of(std::string const& line)
{
  std::istringstream in(line);
  std::string word;
  in >> word;
  if (word != "samples") { throw bench_error("a helper said \"" + line + "\""); }
  std::vector<double> out;
  for (double v; in >> v;) { out.push_back(v); }
  return out;
}

void measure_setup(tenants_options const& o,
                   results::TenantSetup& out,
                   std::vector<target_row>& targets)
{
  std::size_t const uids = o.quick ? 10 : 50, per_uid = o.quick ? 10 : 20;
  out.set_uids(static_cast<std::uint32_t>(uids));
  out.set_sessions(static_cast<std::uint32_t>(uids * per_uid));
  out.mutable_target()->set_target("p99 <= 2000 us");
  daemon_process daemon(bench_daemon(
      o.rmmd, daemon_args(o, o.cuda ? "4GiB" : "64MiB", uids), std::chrono::seconds(60)));
  open_to_every_uid(daemon.runtime_dir());
  std::vector<std::unique_ptr<child_process>> helpers;
  std::vector<double> all, firsts;
  for (std::size_t i = 0; i < uids; ++i) {
    auto argv = as_uid(static_cast<uid_t>(first_uid + i),
                       {o.self.string(),
                        "--tenant-sessions",
                        daemon.runtime_dir().string(),
                        std::to_string(per_uid)});
    auto& h   = helpers.emplace_back(std::make_unique<child_process>(argv, o.helper_env));
    auto line = h->read_line(std::chrono::seconds(60));
    if (!line) { throw bench_error("a --tenant-sessions helper said nothing"); }
    auto samples = samples_of(*line);
    if (samples.empty()) { throw bench_error("a --tenant-sessions helper sent no samples"); }
    firsts.push_back(samples.front());
    all.insert(all.end(), samples.begin(), samples.end());
  }
  auto const s = summarize(all);
  auto const f = summarize(firsts);
  out.set_p50_us(s.p50_us);
  out.set_p99_us(s.p99_us);
  out.set_max_us(s.max_us);
  out.set_first_of_uid_p50_us(f.p50_us);
  out.set_first_of_uid_p99_us(f.p99_us);
  out.mutable_target()->set_pass(s.p99_us <= 2000);
  std::printf(
      "  %zu sessions of %zu uids: p50 %.0f us, p99 %.0f us, max %.0f us; "
      "each uid's first: p50 %.0f us, p99 %.0f us\n",
      all.size(),
      uids,
      s.p50_us,
      s.p99_us,
      s.max_us,
      f.p50_us,
      f.p99_us);
  targets.push_back({.what = "t) session set-up, " + std::to_string(all.size()) + " sessions of " +
                             std::to_string(uids) + " uids: p99",
                     .measured = s.p99_us / 1000,
                     .limit    = 2,
                     .unit     = "ms"});
  for (auto& h : helpers) { h->close_stdin(); }
  for (auto& h : helpers) { h->finish(std::chrono::seconds(20)); }
}

void measure_move(tenants_options const& o,
                  results::TenantMove& out,
                  std::vector<target_row>& targets)
{
  std::size_t const slab    = o.cuda ? std::size_t{1} << 30 : std::size_t{8} << 20;
  std::size_t const slabs   = 7;
  std::size_t const pool    = 8 * slab;
  std::size_t const request = 4 * slab;
  int const trials          = o.quick ? 5 : 20;
  out.set_pool_bytes(pool);
  out.set_idle_bytes(slabs * slab);
  out.set_request_bytes(request);
  out.mutable_target()->set_target("p50 <= 50 ms");
  daemon_process daemon(
      bench_daemon(o.rmmd, daemon_args(o, std::to_string(pool), 1), std::chrono::seconds(60)));
  open_to_every_uid(daemon.runtime_dir());
  rmmd::session requester(
      rmmd::session::options{.runtime_dir = daemon.runtime_dir(), .client_name = "rmmd-bench-t"});
  auto const pool_id = o.cuda ? requester.device_pool(0).id : requester.host_pool().id;
  std::vector<double> ms;
  int refused = 0;
  for (int t = 0; t < trials; ++t) {
    child_process idle(as_uid(first_uid,
                              {o.self.string(),
                               "--tenant-idle",
                               daemon.runtime_dir().string(),
                               o.cuda ? "cuda" : "host",
                               std::to_string(slabs),
                               std::to_string(slab)}),
                       o.helper_env);
    auto line = idle.read_line(std::chrono::seconds(60));
    if (line != "ready") {
      throw bench_error("the --tenant-idle helper said \"" + line.value_or("(nothing)") + "\"");
    }
    auto const t0 = steady::now();
    try {
      auto const lease = requester.allocate(pool_id, request, 0);
      ms.push_back(std::chrono::duration<double, std::milli>(steady::now() - t0).count());
      requester.free(lease.id);
    } catch (rmm::out_of_memory const&) {
      ++refused;
    }
    idle.close_stdin();
    idle.finish(std::chrono::seconds(20));
  }
  out.set_trials(static_cast<std::uint32_t>(trials));
  out.set_refused(static_cast<std::uint32_t>(refused));
  std::vector<double> ns;
  for (auto v : ms) { ns.push_back(v * 1e6); }
  auto const s = summarize(ns);
  if (!ms.empty()) {
    out.set_p50_ms(s.p50_us / 1000);
    out.set_max_ms(s.max_us / 1000);
  }
  out.mutable_target()->set_pass(!ms.empty() && refused == 0 && s.p50_us <= 50000);
  std::printf(
      "  uid %d holds %zu idle slabs of %zu MiB (pool %zu MiB); uid 0 asks %zu MiB: "
      "p50 %.1f ms, max %.1f ms, %d of %d refused\n",
      static_cast<int>(first_uid),
      slabs,
      slab >> 20,
      pool >> 20,
      request >> 20,
      s.p50_us / 1000,
      s.max_us / 1000,
      refused,
      trials);
  targets.push_back({.what     = "t) an allocation only another uid's idle memory serves: p50",
                     .measured = ms.empty() ? 1e9 : s.p50_us / 1000,
                     .limit    = 50,
                     .unit     = "ms"});
  targets.push_back({.what     = "t) such allocations refused",
                     .measured = static_cast<double>(refused),
                     .limit    = 0,
                     .unit     = "requests"});
}

}  // namespace

std::vector<target_row> section_tenants(tenants_options const& o, results::Tenants& out)
{
  out.set_backend(o.cuda ? "cuda" : "host");
  std::printf("\nt) tenants (%s pool): sessions of many uids; memory moved between uids\n",
              o.cuda ? "GPU 0" : "host");
  if (::geteuid() != 0) {
    throw bench_error("section t starts helpers as other uids (setpriv): it needs root");
  }
  std::vector<target_row> targets;
  try {
    measure_setup(o, *out.mutable_setup(), targets);
  } catch (std::exception const& e) {
    out.mutable_setup()->set_error(e.what());
    std::printf("  ERROR (set-up): %s\n", e.what());
  }
  try {
    measure_move(o, *out.mutable_move(), targets);
  } catch (std::exception const& e) {
    out.mutable_move()->set_error(e.what());
    std::printf("  ERROR (move): %s\n", e.what());
  }
  return targets;
}

int tenant_sessions_main(std::string const& dir, std::size_t count)
{
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  try {
    std::vector<harness::raw_session> sessions;
    sessions.reserve(count);
    std::string line = "samples";
    for (std::size_t i = 0; i < count; ++i) {
      auto const t0 = steady::now();
      sessions.emplace_back(dir, "rmmd-bench-tenant");
      line += " " + std::to_string(static_cast<long long>(
                        std::chrono::duration<double, std::nano>(steady::now() - t0).count()));
    }
    say(line);
    for (std::string in; std::getline(std::cin, in);) {}
    return 0;
  } catch (std::exception const& e) {
    say(std::string("error ") + e.what());
    return 1;
  }
}

int tenant_idle_main(std::string const& dir,
                     std::string const& backend,
                     std::size_t count,
                     std::size_t bytes)
{
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  try {
    rmmd::session s(rmmd::session::options{.runtime_dir = dir, .client_name = "rmmd-bench-idle"});
    auto const kind = backend == "cuda" ? rmmd::backend_kind::cuda : rmmd::backend_kind::host;
    auto const it   = std::find_if(
        s.pools().begin(), s.pools().end(), [&](auto const& p) { return p.backend == kind; });
    if (it == s.pools().end()) { throw bench_error("no " + backend + " pool"); }
    auto const pool = it->id;
    std::vector<std::uint64_t> slabs;
    for (std::size_t i = 0; i < count; ++i) { slabs.push_back(s.allocate(pool, bytes, 0).id); }
    auto report = [&](std::size_t held) {
      (void)s.report_usage(
          {rmmd::carved_usage{.pool_id = pool, .slab_bytes = held, .reclaimable_bytes = held}});
    };
    report(count * bytes);
    std::mutex mutex;
    std::condition_variable wake;
    bool asked = false, done = false;
    auto const watch = s.watch_reclaims(pool, [&](std::uint32_t) {
      {
        std::lock_guard lock(mutex);
        asked = true;
      }
      wake.notify_all();
    });
    std::thread input([&] {
      for (std::string line; std::getline(std::cin, line);) {}
      {
        std::lock_guard lock(mutex);
        done = true;
      }
      wake.notify_all();
    });
    say("ready");
    std::unique_lock lock(mutex);
    while (true) {
      wake.wait(lock, [&] { return asked || done; });
      if (done) { break; }
      asked = false;
      lock.unlock();
      for (auto id : slabs) { s.free(id); }
      slabs.clear();
      report(0);
      say("gave-back");
      lock.lock();
    }
    lock.unlock();
    input.join();
    s.unwatch_reclaims(watch);
    return 0;
  } catch (std::exception const& e) {
    say(std::string("error ") + e.what());
    return 1;
  }
}

int section_tenants_without_gpu(tenants_options const& o,
                                std::string const& out_path,
                                std::string const& command)
{
  return run_section_without_gpu(
      "t", "Targets (tenants)", o.quick, out_path, command, [&](auto& run) {
        return section_tenants(o, *run.mutable_tenants());
      });
}

}  // namespace rmmd::bench
