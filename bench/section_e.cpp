// Section e: the daemon's resident memory, at start, idle after sections a to
// d, and with 10,000 live 256 B direct leases of the bench's own session.
// Judged above the idle RSS, per lease, as section h judges it: a process
// holding a CUDA context and one exportable pool (measured here by the helper
// "--context-rss", for reference) is already over 100 MiB.

#include "bench/sections.hpp"
#include "bench/targets.hpp"

#include <rmm/mr/cuda_async_memory_resource.hpp>

#include <cuda/stream>

#include <unistd.h>

#include <cstdio>
#include <optional>

namespace rmmd::bench {

int context_rss_main()
{
  // What any process that owns a CUDA pool pays, rmmd or not: the context,
  // and an RMM pool with posix-fd export (as rmmd makes), one allocation made.
  using handle = rmm::mr::cuda_async_memory_resource::allocation_handle_type;
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) { return 4; }
  auto const context_only = rss_bytes(::getpid());
  rmm::mr::cuda_async_memory_resource mr(std::nullopt, std::nullopt, handle::posix_file_descriptor);
  mr.deallocate_sync(mr.allocate_sync(1 << 20, 256), 1 << 20, 256);
  std::printf("ready %llu %llu\n",
              static_cast<unsigned long long>(context_only),
              static_cast<unsigned long long>(rss_bytes(::getpid())));
  return 0;
}

namespace {

double mib(double bytes)
{
  return bytes / (1 << 20);
}

/// The floor: what a bare process with a CUDA context and one pool holds.
void measure_context_floor(results::DaemonRss& out, run_state& st)
{
  try {
    child_process probe({self_path(), "--context-rss"}, self_env());
    auto const line = expect_line(probe, "the context-RSS probe", "ready", steady::now() + 60s);
    unsigned long long context = 0, with_pool = 0;
    if (std::sscanf(line.c_str(), "ready %llu %llu", &context, &with_pool) != 2) {
      throw bench_error("the context-RSS probe said: " + line);
    }
    probe.finish(5s);
    out.set_cuda_context_process_bytes(static_cast<double>(context));
    out.set_cuda_context_and_pool_process_bytes(static_cast<double>(with_pool));
    std::printf(
        "  for reference, a bare process: CUDA context %.1f MiB, with an RMM pool %.1f MiB\n",
        mib(static_cast<double>(context)),
        mib(static_cast<double>(with_pool)));
  } catch (std::exception const& e) {
    out.set_cuda_context_error(e.what());
    st.error("e context", e.what());
  }
}

/// Fills `out` with the RSS `rss` the daemon has with `leases` (it counts
/// `live`, made in `make_s`), judged above `rss_idle` per lease.
void record_leases(std::size_t leases,
                   std::uint64_t live,
                   double make_s,
                   std::uint64_t rss,
                   std::uint64_t rss_idle,
                   results::DaemonRss& out,
                   run_state& st)
{
  auto const above     = static_cast<double>(rss) - static_cast<double>(rss_idle);
  auto const per_lease = above / static_cast<double>(leases);
  target_row t{"daemon RSS above idle per live lease, " + std::to_string(leases) + " leases",
               per_lease,
               true,
               lease_rss_target_bytes,
               "B"};
  auto verdict = st.check(t);
  std::printf(
      "  with %zu live leases (daemon counts %llu, made in %.2f s): %.1f MiB, %.2f MiB above "
      "idle, %.0f B per lease  (target <= %.0f B: %s)\n",
      leases,
      static_cast<unsigned long long>(live),
      make_s,
      mib(static_cast<double>(rss)),
      mib(above),
      per_lease,
      lease_rss_target_bytes,
      verdict.c_str());
  out.set_leases(u32(leases));
  out.set_daemon_live_allocations(static_cast<double>(live));
  out.set_with_leases_bytes(static_cast<double>(rss));
  out.set_above_idle_bytes(above);
  out.set_per_lease_bytes(per_lease);
  *out.mutable_per_lease_target() = target_result(t);
}

}  // namespace

void section_rss(config const& cfg,
                 daemon_process& daemon,
                 rmmd::session const& session,
                 std::uint64_t rss_fresh,
                 run_state& st)
{
  std::printf("\ne) the daemon's resident memory (VmRSS)\n");
  auto& out = *st.doc.mutable_daemon_rss();
  out.set_idle_fresh_bytes(static_cast<double>(rss_fresh));
  auto const rss_idle = rss_bytes(daemon.pid());
  out.set_idle_after_load_bytes(static_cast<double>(rss_idle));
  std::printf("  idle at start %.1f MiB; idle after sections a-d %.1f MiB\n",
              mib(static_cast<double>(rss_fresh)),
              mib(static_cast<double>(rss_idle)));
  measure_context_floor(out, st);
  auto mr      = make_ipc_resource(session, allocation_mode::direct);
  auto pool_id = session.device_pool(0).id;
  stream_holder stream;
  cuda::stream_ref ref{stream.get()};
  std::vector<void*> held;
  held.reserve(cfg.leases);
  auto release_all = [&] {
    for (auto* p : held) { mr.deallocate(ref, p, 256, alignment); }
    held.clear();
    cudaStreamSynchronize(stream.get());
  };
  try {
    auto const deadline = steady::now() + 120s;
    auto t0             = steady::now();
    while (held.size() < cfg.leases && steady::now() < deadline) {
      held.push_back(mr.allocate(ref, 256, alignment));
    }
    auto t1 = steady::now();
    if (held.size() < cfg.leases) {
      throw bench_error(format("only %zu of %zu leases made in 120 s", held.size(), cfg.leases));
    }
    auto const live = pool_allocations(get_stats(session), pool_id);
    auto const rss  = rss_bytes(daemon.pid());
    record_leases(held.size(), live, seconds_between(t0, t1), rss, rss_idle, out, st);
    release_all();
    out.set_after_free_bytes(static_cast<double>(rss_bytes(daemon.pid())));
  } catch (std::exception const& e) {
    release_all();
    out.set_error(e.what());
    st.error("e", e.what());
  }
  std::fflush(stdout);
}

}  // namespace rmmd::bench
