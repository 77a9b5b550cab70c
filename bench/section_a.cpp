// Section a: allocate+deallocate pairs, one resource at a time, at four sizes:
// in-process RMM (cuda_async, the baseline; its pool) against rmmd's direct
// path (on the session socket and over gRPC) and its fast path (slabs).

#include "bench/sections.hpp"
#include "bench/targets.hpp"

#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <cuda/stream>

#include <cstdio>
#include <optional>

namespace rmmd::bench {
namespace {

struct pair_cell {
  summary latency;
  double pairs_per_s{};
  bool cut_short{};  // the cell's time budget ended it
};

template <typename Resource>
pair_cell measure_pairs(Resource& mr,
                        cudaStream_t stream,
                        std::size_t bytes,
                        std::size_t warmup,
                        std::size_t pairs,
                        steady::duration budget)
{
  cuda::stream_ref s{stream};
  auto const deadline = steady::now() + budget;
  for (std::size_t i = 0; i < warmup && steady::now() < deadline; ++i) {
    void* p = mr.allocate(s, bytes, alignment);
    mr.deallocate(s, p, bytes, alignment);
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ns;
  ns.reserve(pairs);
  auto const start = steady::now();
  auto const stop  = start + budget;
  auto last        = start;
  for (std::size_t i = 0; i < pairs; ++i) {
    auto t0 = steady::now();
    void* p = mr.allocate(s, bytes, alignment);
    mr.deallocate(s, p, bytes, alignment);
    last = steady::now();
    ns.push_back(ns_between(t0, last));
    if (last >= stop) { break; }
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaGetLastError());
  pair_cell cell;
  cell.cut_short   = ns.size() < pairs;
  cell.latency     = summarize(ns);
  cell.pairs_per_s = static_cast<double>(ns.size()) / seconds_between(start, last);
  return cell;
}

struct pair_kind {
  std::string key;    // in the JSON
  std::string label;  // in the table
};

void print_header()
{
  std::printf(
      "\na) allocate+deallocate pairs: same stream, no sync per pair; latency per pair "
      "(steady_clock)\n");
  std::printf("%-22s %7s %6s %9s %9s %12s %8s  %s\n",
              "resource",
              "size",
              "pairs",
              "p50 us",
              "p99 us",
              "pairs/s",
              "x base",
              "target");
}

}  // namespace

pair_p50_map section_pairs(config const& cfg,
                           rmmd::session const& session,
                           rmmd::session const& grpc_session,
                           run_state& st)
{
  pair_p50_map p50;
  print_header();
  stream_holder stream;
  std::map<std::size_t, double> baseline_p50;

  auto run_kind = [&](pair_kind const& kind, auto make) {
    try {
      auto mr = make();
      for (auto bytes : pair_sizes) {
        results::PairCell row;
        row.set_resource(kind.key);
        row.set_size_bytes(u32(bytes));
        try {
          auto n    = (kind.key.rfind("rmmd_direct", 0) == 0 && bytes >= (std::size_t{64} << 20))
                          ? cfg.pairs_direct_64mib
                          : cfg.pairs;
          auto cell = measure_pairs(mr, stream.get(), bytes, cfg.warmup, n, cfg.cell_budget);
          p50[{kind.key, bytes}] = cell.latency.p50_us;
          if (kind.key == "cuda_async") { baseline_p50[bytes] = cell.latency.p50_us; }
          std::optional<double> ratio;
          if (auto b = baseline_p50.find(bytes); b != baseline_p50.end() && b->second > 0) {
            ratio = cell.latency.p50_us / b->second;
          }
          std::string verdict;
          if (kind.key == "rmmd_fast" && bytes <= (std::size_t{1} << 20) && ratio) {
            target_row t{"fast p50 / cuda_async p50 at " + size_name(bytes),
                         *ratio,
                         true,
                         fast_ratio_target,
                         "x"};
            verdict               = format("<= %.1fx %s", fast_ratio_target, st.check(t).c_str());
            *row.mutable_target() = target_result(t);
          }
          row.set_pairs(u32(cell.latency.count));
          row.set_cut_short_by_budget(cell.cut_short);
          row.set_p50_us(cell.latency.p50_us);
          row.set_p99_us(cell.latency.p99_us);
          row.set_mean_us(cell.latency.mean_us);
          row.set_min_us(cell.latency.min_us);
          row.set_max_us(cell.latency.max_us);
          row.set_pairs_per_s(cell.pairs_per_s);
          if (ratio) { row.set_ratio_to_baseline_p50(*ratio); }
          std::printf("%-22s %7s %6zu %9.2f %9.2f %12.0f %8s  %s%s\n",
                      kind.label.c_str(),
                      size_name(bytes).c_str(),
                      cell.latency.count,
                      cell.latency.p50_us,
                      cell.latency.p99_us,
                      cell.pairs_per_s,
                      ratio ? format("%.2f", *ratio).c_str() : "-",
                      verdict.c_str(),
                      cell.cut_short ? " (cut short by the time budget)" : "");
        } catch (std::exception const& e) {
          row.set_error(e.what());
          st.error("a " + kind.key + " " + size_name(bytes), e.what());
        }
        std::fflush(stdout);
        *st.doc.add_pairs() = std::move(row);
      }
    } catch (std::exception const& e) {
      // No resource, no cell: each size gets a row that says why.
      for (auto bytes : pair_sizes) {
        auto& row = *st.doc.add_pairs();
        row.set_resource(kind.key);
        row.set_size_bytes(u32(bytes));
        row.set_error(e.what());
      }
      st.error("a " + kind.key, e.what());
    }
  };

  run_kind({"cuda_async", "cuda_async (baseline)"},
           [] { return rmm::mr::cuda_async_memory_resource{}; });
  run_kind({"rmmd_direct", "rmmd direct"},
           [&] { return make_ipc_resource(session, allocation_mode::direct); });
  run_kind({"rmmd_direct_grpc", "rmmd direct (gRPC)"},
           [&] { return make_ipc_resource(grpc_session, allocation_mode::direct); });
  run_kind({"rmmd_fast", "rmmd fast (slab)"},
           [&] { return make_ipc_resource(session, allocation_mode::slab); });
  run_kind({"rmm_pool", "pool over cuda_async"}, [] {
    rmm::mr::cuda_async_memory_resource upstream{};
    return rmm::mr::pool_memory_resource(upstream, std::size_t{256} << 20);
  });
  return p50;
}

}  // namespace rmmd::bench
