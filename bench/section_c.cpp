// Sections c and c2: N client processes at once against the one daemon, each
// a helper process ("--worker") making allocate+deallocate pairs for a few
// seconds after a common start. c: 1 to 16 processes in each mode; c2: 16
// direct processes on GPU 0, then spread over GPUs 0 and 1.

#include "bench/sections.hpp"
#include "bench/targets.hpp"

#include <cuda/stream>

#include <cstdio>
#include <memory>

namespace rmmd::bench {

// A client process of section c: a session and a resource of `mode`, a
// warm-up, "ready"; then, on the line "go" from the bench, pairs of `bytes`
// for `seconds`, and "done PAIRS NANOSECONDS".
int worker_main(client_kind kind, std::size_t bytes, double seconds, int device)
{
  die_with_parent();
  try {
    BENCH_CUDA(cudaSetDevice(device));
    auto s  = open_session("rmmd-bench-worker", kind.transport);
    auto mr = make_ipc_resource(s, kind.mode);
    stream_holder stream;
    cuda::stream_ref ref{stream.get()};
    for (int i = 0; i < 100; ++i) {
      void* p = mr.allocate(ref, bytes, alignment);
      mr.deallocate(ref, p, bytes, alignment);
    }
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    say("ready");
    if (!wait_for_stdin_line(std::chrono::milliseconds(180'000))) { return 3; }
    auto const start = steady::now();
    auto const stop  = start + std::chrono::duration_cast<steady::duration>(
                                  std::chrono::duration<double>(seconds));
    std::uint64_t pairs = 0;
    auto now            = start;
    while (now < stop) {
      for (int i = 0; i < 64; ++i) {
        void* p = mr.allocate(ref, bytes, alignment);
        mr.deallocate(ref, p, bytes, alignment);
      }
      pairs += 64;
      now = steady::now();
    }
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    say(format("done %llu %.0f", static_cast<unsigned long long>(pairs), ns_between(start, now)));
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

namespace {

/// What N workers measured together, and the daemon's CPU time meanwhile.
struct workers_outcome {
  std::uint64_t pairs{};
  double aggregate{};  // the sum of each worker's pairs / its own elapsed time
  double wall_s{};
  double daemon_cpu_s{};
};

/// Starts `n` workers of `kind` (worker i on devices[i % size], or GPU 0),
/// waits until all are ready, says "go" to all, and reads each one's "done".
workers_outcome run_workers(config const& cfg,
                            daemon_process& daemon,
                            client_kind kind,
                            int n,
                            std::vector<int> const& devices)
{
  auto env = self_env();
  env.push_back("RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string());
  std::vector<std::unique_ptr<child_process>> workers;
  for (int i = 0; i < n; ++i) {
    workers.push_back(std::make_unique<child_process>(
        std::vector<std::string>{
            self_path(),
            "--worker",
            kind_name(kind),
            std::to_string(cfg.worker_bytes),
            format("%g", cfg.worker_seconds),
            std::to_string(!devices.empty() ? devices[static_cast<std::size_t>(i) % devices.size()]
                                            : 0)},
        env));
  }
  auto const ready_by = steady::now() + 180s;
  for (int i = 0; i < n; ++i) {
    expect_line(
        *workers[static_cast<std::size_t>(i)], "worker " + std::to_string(i), "ready", ready_by);
  }
  double cpu0 = cpu_seconds(daemon.pid());
  auto t0     = steady::now();
  for (auto& w : workers) { w->write_line("go"); }
  auto const done_by = steady::now() + std::chrono::seconds(60) +
                       std::chrono::duration_cast<steady::duration>(
                           std::chrono::duration<double>(cfg.worker_seconds));
  workers_outcome out;
  for (int i = 0; i < n; ++i) {
    auto line = expect_line(
        *workers[static_cast<std::size_t>(i)], "worker " + std::to_string(i), "done", done_by);
    unsigned long long p = 0;
    double ns            = 0;
    if (std::sscanf(line.c_str(), "done %llu %lf", &p, &ns) != 2 || ns <= 0) {
      throw bench_error("worker " + std::to_string(i) + " said: " + line);
    }
    out.pairs += p;
    out.aggregate += static_cast<double>(p) / (ns / 1e9);
  }
  auto t1     = steady::now();
  double cpu1 = cpu_seconds(daemon.pid());
  for (auto& w : workers) {
    if (w->finish(30s) != 0) {
      throw bench_error("a worker exited with status " + std::to_string(w->finish(0ms)));
    }
  }
  out.wall_s       = seconds_between(t0, t1);
  out.daemon_cpu_s = cpu1 - cpu0;
  return out;
}

/// The 16-process targets of section c (the default transport only), into
/// `row`; returns the table's verdict text.
std::string judge_processes(client_kind kind,
                            double aggregate,
                            results::ProcessesRow& row,
                            run_state& st)
{
  bool fast    = kind.mode == allocation_mode::slab;
  double limit = fast ? fast_aggregate_target : direct_aggregate_target;
  target_row t{
      kind_name(kind) + " aggregate pairs/s, 16 processes", aggregate, false, limit, "pairs/s"};
  auto verdict          = format(">= %.0f %s", limit, st.check(t).c_str());
  *row.mutable_target() = target_result(t);
  if (fast) { return verdict; }
  // The direct path at the driver's pace: b2's one thread in this run.
  double b2_rate = 0;
  for (auto const& b2 : st.doc.daemon_side_pairs()) {
    if (b2.threads() == 1 && b2.has_pairs_per_s()) { b2_rate = b2.pairs_per_s(); }
  }
  if (b2_rate <= 0) { return verdict + "; no b2 figure in this run (run b2 with c)"; }
  target_row r{"direct aggregate pairs/s, 16 processes / b2 one thread",
               aggregate / b2_rate,
               false,
               direct_over_b2_target,
               "x b2"};
  verdict +=
      format("; %.2fx b2 >= %.2f %s", r.measured, direct_over_b2_target, st.check(r).c_str());
  row.set_over_b2_one_thread(r.measured);
  *row.mutable_b2_target() = target_result(r);
  return verdict;
}

}  // namespace

void section_processes(config const& cfg,
                       daemon_process& daemon,
                       run_state& st,
                       std::vector<int> const& devices)
{
  bool const spread = !devices.empty();
  if (!spread) {
    std::printf(
        "\nc) N client processes at once against the one daemon, %s pairs for %.1f s each\n",
        size_name(cfg.worker_bytes).c_str(),
        cfg.worker_seconds);
  }
  std::printf("%-11s %6s %14s %12s %14s %10s  %s\n",
              "mode",
              "procs",
              "pairs",
              "pairs/s",
              "daemon cpu s",
              "cpu/wall",
              "target (16 procs)");
  auto const kinds  = spread
                          ? std::vector<client_kind>{direct_client}
                          : std::vector<client_kind>{fast_client, direct_client, direct_grpc_client};
  auto const counts = spread ? std::vector<int>{16} : cfg.process_counts;
  for (auto kind : kinds) {
    for (int n : counts) {
      auto& row = *st.doc.add_processes();
      row.set_mode(kind_name(kind) + (spread ? "-" + std::to_string(devices.size()) + "gpu" : ""));
      row.set_processes(u32(static_cast<std::size_t>(n)));
      row.set_size_bytes(u32(cfg.worker_bytes));
      row.set_seconds_each(cfg.worker_seconds);
      try {
        auto const got = run_workers(cfg, daemon, kind, n, devices);
        std::string verdict;
        // The gRPC transport is shown for comparison; the target is the default's.
        if (n == 16 && kind.transport == call_transport::session_socket && !spread) {
          verdict = judge_processes(kind, got.aggregate, row, st);
        }
        row.set_pairs(static_cast<double>(got.pairs));
        row.set_aggregate_pairs_per_s(got.aggregate);
        row.set_wall_s(got.wall_s);
        row.set_daemon_cpu_s(got.daemon_cpu_s);
        row.set_daemon_cpu_per_wall(got.daemon_cpu_s / got.wall_s);
        std::printf("%-11s %6d %14llu %12.0f %14.3f %10.2f  %s\n",
                    row.mode().c_str(),
                    n,
                    static_cast<unsigned long long>(got.pairs),
                    got.aggregate,
                    got.daemon_cpu_s,
                    got.daemon_cpu_s / got.wall_s,
                    verdict.c_str());
      } catch (std::exception const& e) {
        row.set_error(e.what());
        st.error(std::string(spread ? "c2 " : "c ") + row.mode() + " x" + std::to_string(n),
                 e.what());
      }
      std::fflush(stdout);
    }
  }
}

}  // namespace rmmd::bench
