// Section d: session set-up (connect, hello, the first pool import) and a
// SIGKILLed client's memory back in the pool. The client is a helper process
// ("--holder") that holds 256 MiB until it is killed.

#include "bench/sections.hpp"
#include "bench/targets.hpp"

#include <cuda/stream>

#include <signal.h>

#include <cstdio>
#include <optional>
#include <thread>

namespace rmmd::bench {

// Section d's victim: holds `bytes` from the daemon (written once), says
// "holding", and waits for stdin to close (the bench SIGKILLs it first).
int holder_main(allocation_mode mode, std::size_t bytes)
{
  die_with_parent();
  try {
    BENCH_CUDA(cudaSetDevice(0));
    rmmd::session s(rmmd::session::options{.client_name = "rmmd-bench-holder"});
    auto mr = make_ipc_resource(s, mode);
    stream_holder stream;
    void* p = mr.allocate(cuda::stream_ref{stream.get()}, bytes, alignment);
    BENCH_CUDA(cudaMemsetAsync(p, 1, bytes, stream.get()));
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    say("holding");
    wait_for_stdin_line(std::chrono::milliseconds(180'000));
    mr.deallocate(cuda::stream_ref{stream.get()}, p, bytes, alignment);
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

void section_setup_and_reclaim(config const& cfg,
                               daemon_process& daemon,
                               rmmd::session const& session,
                               run_state& st)
{
  std::printf("\nd) session set-up (connect, hello, pool import) and SIGKILL to memory back\n");
  auto& out = *st.doc.mutable_setup_and_reclaim();
  try {
    std::vector<double> ns;
    for (std::size_t i = 0; i < cfg.setup_sessions + 2; ++i) {
      std::optional<rmmd::session> s;
      std::optional<rmmd::ipc_memory_resource> mr;
      auto t0 = steady::now();
      s.emplace(rmmd::session::options{.runtime_dir = daemon.runtime_dir(),
                                       .client_name = "rmmd-bench-setup"});
      mr.emplace(make_ipc_resource(*s, allocation_mode::direct));
      auto t1 = steady::now();
      mr.reset();
      s.reset();
      if (i >= 2) { ns.push_back(ns_between(t0, t1)); }
    }
    auto sum = summarize(ns);
    target_row t{"session set-up p50", sum.p50_us / 1000.0, true, session_setup_target_ms, "ms"};
    auto verdict = st.check(t);
    std::printf(
        "  session + first ipc_memory_resource: p50 %.3f ms, p99 %.3f ms over %zu  "
        "(target <= %.1f ms: %s)\n",
        sum.p50_us / 1000.0,
        sum.p99_us / 1000.0,
        sum.count,
        session_setup_target_ms,
        verdict.c_str());
    auto& setup = *out.mutable_session_setup();
    setup.set_sessions(u32(sum.count));
    setup.set_p50_ms(sum.p50_us / 1000.0);
    setup.set_p99_ms(sum.p99_us / 1000.0);
    *setup.mutable_target() = target_result(t);
  } catch (std::exception const& e) {
    out.mutable_session_setup()->set_error(e.what());
    st.error("d session set-up", e.what());
  }
  std::fflush(stdout);

  auto const pool_id = session.device_pool(0).id;
  auto env           = self_env();
  env.push_back("RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string());
  for (auto mode : {allocation_mode::direct, allocation_mode::slab}) {
    auto& row = *out.add_sigkill_to_memory_back();
    row.set_mode(mode_name(mode));
    row.set_held_bytes(u32(cfg.kill_hold_bytes));
    try {
      std::vector<double> ns;
      for (std::size_t trial = 0; trial < cfg.kill_trials; ++trial) {
        auto const before = pool_in_use(get_stats(session), pool_id);
        child_process holder(
            {self_path(), "--holder", mode_name(mode), std::to_string(cfg.kill_hold_bytes)}, env);
        expect_line(holder, "holder", "holding", steady::now() + 120s);
        auto const holding = pool_in_use(get_stats(session), pool_id);
        if (holding < before + cfg.kill_hold_bytes) {
          throw bench_error(
              format("the daemon counts %llu bytes in use while the holder holds "
                     "%zu (before: %llu)",
                     static_cast<unsigned long long>(holding),
                     cfg.kill_hold_bytes,
                     static_cast<unsigned long long>(before)));
        }
        auto t0 = steady::now();
        holder.kill(SIGKILL);
        auto const give_up = t0 + 10s;
        bool back          = false;
        auto t1            = t0;
        while (!back && steady::now() < give_up) {
          back = pool_in_use(get_stats(session), pool_id) <= before;
          t1   = steady::now();
          // A poll interval (GetStats itself takes tens of us), not a wait.
          if (!back) { std::this_thread::sleep_for(100us); }
        }
        holder.finish(10s);
        if (!back) { throw bench_error("the memory was not back in the pool 10 s after SIGKILL"); }
        ns.push_back(ns_between(t0, t1));
      }
      auto sum      = summarize(ns);
      double p50_ms = sum.p50_us / 1000.0, max_ms = sum.max_us / 1000.0;
      target_row t{
          mode_name(mode) + " SIGKILL to memory back p50", p50_ms, true, reclaim_target_ms, "ms"};
      auto verdict = st.check(t);
      std::printf(
          "  SIGKILL of a %s client holding %s to memory back: p50 %.2f ms, max %.2f ms "
          "over %zu  (target <= %.0f ms: %s)\n",
          mode_name(mode).c_str(),
          size_name(cfg.kill_hold_bytes).c_str(),
          p50_ms,
          max_ms,
          sum.count,
          reclaim_target_ms,
          verdict.c_str());
      row.set_trials(u32(sum.count));
      row.set_p50_ms(p50_ms);
      row.set_max_ms(max_ms);
      *row.mutable_target() = target_result(t);
    } catch (std::exception const& e) {
      row.set_error(e.what());
      st.error("d reclaim " + mode_name(mode), e.what());
    }
    std::fflush(stdout);
  }
}

}  // namespace rmmd::bench
