#include "bench/section_g.hpp"

#include "bench/bench_session.hpp"
#include "bench/bench_support.hpp"

#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/session.hpp>

#include <cuda_runtime_api.h>
#include <cuda/stream>

#include <signal.h>
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::bench {
namespace {

std::int64_t now_ns()
{
  return std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now().time_since_epoch())
      .count();
}

v1::PoolStats pool_of(v1::Stats const& stats, std::uint32_t id)
{
  for (auto const& p : stats.pools()) {
    if (p.pool().id() == id) { return p; }
  }
  throw bench_error("GetStats has no pool " + std::to_string(id));
}

/// The next line of worker `i`; "asked NS" lines are recorded in `asked`
/// (by worker) and skipped, unless `want` is "asked".
std::string next_line(child_process& w,
                      std::size_t i,
                      std::string const& want,
                      std::map<std::size_t, std::int64_t>& asked,
                      steady::time_point deadline)
{
  while (true) {
    auto line = w.read_line(deadline);
    if (!line) {
      throw bench_error("mobility worker " + std::to_string(i) + " said nothing (wanted '" + want +
                        "')");
    }
    if (line->rfind("asked ", 0) == 0) {
      asked[i] = std::stoll(line->substr(6));
      continue;
    }
    if (*line != want) {
      throw bench_error("mobility worker " + std::to_string(i) + " said: " + *line);
    }
    return *line;
  }
}

double ms_between(std::int64_t from_ns, std::int64_t to_ns)
{
  return static_cast<double>(to_ns - from_ns) / 1e6;
}

/// Prints section g's header line and records its configuration.
void describe_mobility(mobility_config const& cfg,
                       std::size_t pool_bytes,
                       std::size_t request_bytes,
                       results::Mobility* out)
{
  std::printf(
      "\ng) memory that moves: %d slab clients hold one idle %zu MiB slab each (the GPU 0 pool, "
      "%zu MiB, is full); the bench asks for %zu MiB, which only their idle slabs can serve; "
      "reclaim_timeout %lld ms, %d trials\n",
      cfg.clients,
      cfg.slab_bytes >> 20,
      pool_bytes >> 20,
      request_bytes >> 20,
      static_cast<long long>(cfg.reclaim_timeout.count()),
      cfg.trials);
  std::fflush(stdout);
  out->set_clients(static_cast<std::uint32_t>(cfg.clients));
  out->set_slab_bytes(static_cast<std::uint32_t>(cfg.slab_bytes));
  out->set_request_bytes(static_cast<std::uint32_t>(request_bytes));
  out->set_reclaim_timeout_ms(static_cast<std::uint32_t>(cfg.reclaim_timeout.count()));
}

/// The last trial's "asked" lines: whatever the workers print before EOF;
/// throws if one exits with a failure.
void collect_last_asks(std::vector<std::unique_ptr<child_process>>& workers,
                       std::map<std::size_t, std::int64_t>& asked)
{
  auto const clients = workers.size();
  for (std::size_t i = 0; i < clients; ++i) {
    workers[i]->close_stdin();
    auto rest = workers[i]->read_all(30s);
    for (std::size_t at = rest.find("asked "); at != std::string::npos;
         at             = rest.find("asked ", at + 1)) {
      asked[i] = std::stoll(rest.substr(at + 6));
    }
    if (auto status = workers[i]->wait(30s); status != 0) {
      throw bench_error("mobility worker " + std::to_string(i) + " exited with " +
                        (status ? std::to_string(*status) : std::string("no status")));
    }
  }
}

/// Records every trial's time, the refusals, the last trial's timeline and
/// the daemon's reclaim counts in `out`, prints them, and returns what the
/// targets judge.
mobility_outcome record_trials(std::vector<double> const& trial_ms,
                               int refused,
                               std::int64_t t_request,
                               std::int64_t t_answer,
                               std::map<std::size_t, std::int64_t> const& asked,
                               std::map<pid_t, std::int64_t> const& gave_back,
                               std::vector<std::unique_ptr<child_process>> const& workers,
                               rmmd::session const& observer,
                               std::uint32_t pool,
                               results::Mobility* out)
{
  auto const clients = workers.size();
  auto sorted        = trial_ms;
  std::sort(sorted.begin(), sorted.end());
  auto rank = [&](double q) {
    auto const n = sorted.size();
    auto idx     = static_cast<std::size_t>(std::ceil(q * static_cast<double>(n)));
    return sorted[std::min(n, std::max<std::size_t>(idx, 1)) - 1];
  };
  mobility_outcome outcome{.p50_ms  = rank(0.5),
                           .p99_ms  = rank(0.99),
                           .refused = refused,
                           .trials  = static_cast<int>(sorted.size())};
  out->set_trials(static_cast<std::uint32_t>(outcome.trials));
  out->set_p50_ms(outcome.p50_ms);
  out->set_p99_ms(outcome.p99_ms);
  out->set_max_ms(sorted.back());
  out->set_refused(static_cast<std::uint32_t>(refused));
  auto* timeline = out->mutable_timeline();
  timeline->set_success_ms(ms_between(t_request, t_answer));
  for (std::size_t i = 0; i < clients; ++i) {
    auto* c = timeline->add_clients();
    c->set_client(static_cast<std::uint32_t>(i));
    if (auto a = asked.find(i); a != asked.end()) {
      c->set_asked_ms(ms_between(t_request, a->second));
    }
    if (auto g = gave_back.find(workers[i]->pid()); g != gave_back.end()) {
      c->set_gave_back_ms(ms_between(t_request, g->second));
    }
  }
  auto const pool_after = pool_of(get_stats(observer), pool);
  out->set_reclaim_waits(static_cast<std::uint32_t>(pool_after.reclaim_waits()));
  out->set_reclaim_served(static_cast<std::uint32_t>(pool_after.reclaim_served()));

  std::printf(
      "  request -> success: p50 %.2f ms, p99 %.2f ms, max %.2f ms; refused %d of %d; "
      "daemon: %llu waits, %llu served\n",
      outcome.p50_ms,
      outcome.p99_ms,
      sorted.back(),
      refused,
      outcome.trials,
      static_cast<unsigned long long>(pool_after.reclaim_waits()),
      static_cast<unsigned long long>(pool_after.reclaim_served()));
  std::printf("  last trial (ms after the request): ");
  for (auto const& c : timeline->clients()) {
    if (!c.has_asked_ms() && !c.has_gave_back_ms()) { continue; }
    std::printf("client %u asked %.2f gave back %.2f; ",
                c.client(),
                c.has_asked_ms() ? c.asked_ms() : -1.0,
                c.has_gave_back_ms() ? c.gave_back_ms() : -1.0);
  }
  std::printf("success %.2f\n", timeline->success_ms());
  std::fflush(stdout);
  return outcome;
}

}  // namespace

int mobility_worker_main(std::size_t slab_bytes)
{
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  try {
    if (cudaSetDevice(0) != cudaSuccess) { return 4; }
    rmmd::session s(rmmd::session::options{.client_name = "rmmd-bench-mobility"});
    auto const pool = s.device_pool(0).id;
    // Long idle_trim: the slabs go back only because the daemon asks.
    rmmd::ipc_memory_resource mr(s,
                                 0,
                                 rmmd::ipc_resource_options{.mode = rmmd::allocation_mode::slab,
                                                            .slab_bytes = slab_bytes,
                                                            .idle_trim  = std::chrono::hours(1)});
    auto const watch = s.watch_reclaims(pool, [](std::uint32_t) {
      std::printf("asked %lld\n", static_cast<long long>(now_ns()));
      std::fflush(stdout);
    });
    cuda::stream_ref stream{cudaStream_t{}};
    std::string line;
    while (std::getline(std::cin, line)) {
      if (line != "fill") { continue; }
      void* p = mr.allocate(stream, 256, 256);
      mr.deallocate(stream, p, 256, 256);
      if (cudaStreamSynchronize(stream.get()) != cudaSuccess) { return 4; }
      std::printf("filled\n");
      std::fflush(stdout);
    }
    s.unwatch_reclaims(watch);
  } catch (std::exception const& e) {
    std::printf("error: %s\n", e.what());
    std::fflush(stdout);
    return 3;
  }
  return 0;
}

mobility_outcome section_mobility(mobility_config const& cfg,
                                  std::filesystem::path const& rmmd,
                                  std::string const& self,
                                  std::vector<std::string> const& env,
                                  results::Mobility* out)
{
  auto const clients       = static_cast<std::size_t>(cfg.clients);
  auto const pool_bytes    = clients * cfg.slab_bytes;
  auto const request_bytes = static_cast<std::size_t>(cfg.request_slabs) * cfg.slab_bytes;
  describe_mobility(cfg, pool_bytes, request_bytes, out);

  daemon_process daemon(bench_daemon(rmmd,
                                     {"--backend=cuda",
                                      "--cuda-pool-bytes",
                                      std::to_string(pool_bytes),
                                      "--reclaim-timeout-ms",
                                      std::to_string(cfg.reclaim_timeout.count())},
                                     std::chrono::seconds(60)));
  rmmd::session requester(
      rmmd::session::options{.runtime_dir = daemon.runtime_dir(), .client_name = "rmmd-bench-g"});
  rmmd::session observer(rmmd::session::options{.runtime_dir = daemon.runtime_dir(),
                                                .client_name = "rmmd-bench-g-observer"});
  auto const pool = requester.device_pool(0).id;
  if (pool_of(get_stats(observer), pool).pool().capacity_bytes() != pool_bytes) {
    throw bench_error("the GPU 0 pool's capacity is not the " + std::to_string(pool_bytes) +
                      " bytes asked for (a GPU with less memory?)");
  }

  auto worker_env = env;
  worker_env.push_back("RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string());
  std::vector<std::unique_ptr<child_process>> workers;
  for (std::size_t i = 0; i < clients; ++i) {
    workers.push_back(std::make_unique<child_process>(
        std::vector<std::string>{self, "--mobility-worker", std::to_string(cfg.slab_bytes)},
        worker_env));
  }
  std::map<std::size_t, std::int64_t> asked;  // by worker: when it heard the request
  // Every worker leases (or keeps) its slab, idle; then the daemon must have
  // heard so from each (its keeper reports within a tick, 250 ms). A worker
  // the daemon asked late (a second round of asks, sent while the request was
  // being served) may give its slab back after saying "filled": then fill
  // again, up to 10 s.
  auto fill = [&] {
    auto const reported_by = steady::now() + 10s;
    while (true) {
      for (auto& w : workers) { w->write_line("fill"); }
      auto const deadline = steady::now() + 120s;
      for (std::size_t i = 0; i < clients; ++i) {
        next_line(*workers[i], i, "filled", asked, deadline);
      }
      auto const refill_at = steady::now() + 500ms;
      while (steady::now() < refill_at) {
        if (pool_of(get_stats(observer), pool).reclaimable_bytes() == pool_bytes) { return; }
        std::this_thread::sleep_for(2ms);  // no event announces a report: poll the ledger
      }
      if (steady::now() > reported_by) {
        std::string held;
        auto const now_held = get_stats(observer);
        for (auto const& s : now_held.sessions()) {
          held += " pid " + std::to_string(s.pid()) + ": " + std::to_string(s.bytes() >> 20) +
                  " MiB held, " + std::to_string(s.reclaimable_bytes() >> 20) + " MiB reclaimable;";
        }
        throw bench_error("the slab clients did not report their idle slabs within 10 s:" + held);
      }
    }
  };

  std::vector<double> trial_ms;
  int refused            = 0;
  std::int64_t t_request = 0, t_answer = 0;
  std::map<pid_t, std::int64_t> gave_back;  // last trial: by worker pid, as the ledger showed it
  for (int trial = 0; trial < cfg.trials; ++trial) {
    fill();
    asked.clear();
    bool const last = trial + 1 == cfg.trials;
    // The last trial's timeline: when each client's slab left the ledger,
    // polled through gRPC (GetStats, about 0.1-0.3 ms each) while the
    // request waits; the other trials run unobserved.
    std::atomic<bool> done{false};
    std::thread poller;
    if (last) {
      poller = std::thread([&] {
        std::map<pid_t, std::size_t> worker_pids;
        for (std::size_t i = 0; i < clients; ++i) { worker_pids[workers[i]->pid()] = i; }
        while (!done.load()) {
          auto const stats = get_stats(observer);
          auto const t     = now_ns();
          for (auto const& s : stats.sessions()) {
            if (worker_pids.contains(s.pid()) && s.bytes() == 0 && !gave_back.contains(s.pid())) {
              gave_back[s.pid()] = t;
            }
          }
        }
      });
    }
    t_request = now_ns();
    std::optional<std::uint64_t> lease;
    try {
      lease = requester.allocate(pool, request_bytes, 0).id;
    } catch (rmm::out_of_memory const& e) {
      ++refused;
      if (refused == 1) { std::printf("  refused: %s\n", e.what()); }
    }
    t_answer = now_ns();
    done     = true;
    if (poller.joinable()) { poller.join(); }
    trial_ms.push_back(ms_between(t_request, t_answer));
    out->add_trial_ms(trial_ms.back());
    if (lease) { requester.free(*lease); }
  }
  collect_last_asks(workers, asked);

  return record_trials(
      trial_ms, refused, t_request, t_answer, asked, gave_back, workers, observer, pool, out);
}

}  // namespace rmmd::bench
