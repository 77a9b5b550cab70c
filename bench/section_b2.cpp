// Section b2: the daemon's CUDA work per direct pair, with 1, 2, 4 and 8
// threads in the bench's own process. What the daemon does per direct pair,
// without sockets or the core: from an exportable pool, allocate 256 B on the
// thread's stream, synchronise, export the pointer, free. T threads at once,
// each on a stream of its own, as the daemon's call threads do. If the figure
// does not grow with T, the driver serialises these calls, and this rate
// bounds the direct path's throughput however many clients and daemon
// threads there are.

#include "bench/sections.hpp"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

namespace rmmd::bench {

void section_daemon_side(config const& cfg, run_state& st)
{
  std::printf(
      "\nb2) the daemon's CUDA work per direct pair (allocate 256 B, stream sync, pointer export, "
      "free) in one process, T threads at once for %.1f s\n",
      cfg.worker_seconds / 2);
  std::printf("%7s %12s %12s %14s\n", "threads", "pairs", "pairs/s", "us per pair");
  BENCH_CUDA(cudaSetDevice(0));
  cudaMemPool_t pool{};
  BENCH_CUDA(make_exportable_pool(&pool, cfg.release_threshold));
  struct pool_closer {
    cudaMemPool_t p;
    ~pool_closer()
    {
      cudaMemPoolDestroy(p);
    }
  } closer{pool};
  int pool_fd = -1;  // exporting the pool once makes its pointers exportable
  BENCH_CUDA(
      cudaMemPoolExportToShareableHandle(&pool_fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
  ::close(pool_fd);
  for (int threads : {1, 2, 4, 8}) {
    std::atomic<std::uint64_t> pairs{0};
    std::atomic<bool> failed{false};
    std::atomic<bool> go{false};
    auto const seconds = cfg.worker_seconds / 2;
    std::vector<std::thread> workers;
    steady::time_point start{};
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        if (cudaSetDevice(0) != cudaSuccess) {
          failed = true;
          return;
        }
        stream_holder stream;
        while (!go.load()) { std::this_thread::yield(); }
        auto const stop = start + std::chrono::duration_cast<steady::duration>(
                                      std::chrono::duration<double>(seconds));
        std::uint64_t mine = 0;
        while (steady::now() < stop) {
          void* p = nullptr;
          cudaMemPoolPtrExportData data{};
          if (cudaMallocFromPoolAsync(&p, 256, pool, stream.get()) != cudaSuccess ||
              cudaStreamSynchronize(stream.get()) != cudaSuccess ||
              cudaMemPoolExportPointer(&data, p) != cudaSuccess ||
              cudaFreeAsync(p, stream.get()) != cudaSuccess) {
            failed = true;
            return;
          }
          ++mine;
        }
        pairs += mine;
      });
    }
    start = steady::now();
    go    = true;
    for (auto& w : workers) { w.join(); }
    auto const wall = seconds_between(start, steady::now());
    auto& row       = *st.doc.add_daemon_side_pairs();
    row.set_threads(u32(static_cast<std::size_t>(threads)));
    if (failed) {
      row.set_error("a CUDA call failed");
      st.error("b2 x" + std::to_string(threads), "a CUDA call failed");
    } else {
      auto const rate = static_cast<double>(pairs.load()) / wall;
      row.set_pairs(static_cast<double>(pairs.load()));
      row.set_pairs_per_s(rate);
      std::printf("%7d %12llu %12.0f %14.2f\n",
                  threads,
                  static_cast<unsigned long long>(pairs.load()),
                  rate,
                  1e6 / rate);
    }
    std::fflush(stdout);
  }
}

}  // namespace rmmd::bench
