// What slab mode's own bookkeeping costs per allocate+deallocate pair, on
// the CPU alone (issue 14, point 4): RMM's pool_memory_resource over a host
// upstream (malloc; the pool never touches the memory), bare, and wrapped as
// rmmd's slab_carver wrapped it before and after issue 14. Without a GPU the
// pool's CUDA calls (cudaStreamGetId, cudaEventRecord) fail at once and cost
// little, so the wrappers' share shows larger than on a GPU host; the
// difference between the rows is the point.
//
//   before: a shared_mutex read lock around each call, two relaxed atomic
//           adds per call (count and bytes), a thread_local exception_ptr
//           cleared per allocate;
//   after:  one atomic add per call on one word that holds a closed bit,
//           the count and the bytes (in units of 256) carved.
//
// Build (no nvcc needed) and run, from the repository root:
//   R=.venv/lib/python3.11/site-packages
//   g++ -O2 -std=c++20 -DNDEBUG -DCCCL_DISABLE_PDL -I$R/librmm/include/rapids \
//     -isystem $R/librmm/include -isystem $R/rapids_logger/include \
//     -isystem /usr/local/cuda/include -isystem /usr/local/cuda/include/cccl \
//     bench/experiments/slab_bookkeeping.cpp -o /tmp/slab_bookkeeping \
//     -L$R/librmm/lib64 -L$R/rapids_logger/lib64 -L/usr/local/cuda/lib64 \
//     -lrmm -lrapids_logger -lcudart \
//     -Wl,-rpath,$R/librmm/lib64:$R/rapids_logger/lib64:/usr/local/cuda/lib64
//   /tmp/slab_bookkeeping [threads] [pairs] [rounds]
//
// It prints, per variant, the median over rounds of each round's p50 (of
// the mean pair time in batches of 100), and the ratio to the bare pool's.

#include <rmm/mr/pool_memory_resource.hpp>

#include <cuda/memory_resource>
#include <cuda/stream>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <shared_mutex>
#include <thread>
#include <vector>

namespace {

struct host_upstream {
  void* allocate(cuda::stream_ref, std::size_t bytes, std::size_t)
  {
    return std::aligned_alloc(256, bytes);
  }
  void deallocate(cuda::stream_ref, void* p, std::size_t, std::size_t) noexcept
  {
    std::free(p);
  }
  void* allocate_sync(std::size_t bytes, std::size_t a)
  {
    return allocate(cuda::stream_ref{cudaStreamLegacy}, bytes, a);
  }
  void deallocate_sync(void* p, std::size_t b, std::size_t a) noexcept
  {
    deallocate(cuda::stream_ref{cudaStreamLegacy}, p, b, a);
  }
  bool operator==(host_upstream const&) const noexcept
  {
    return true;
  }
  friend void get_property(host_upstream const&, cuda::mr::device_accessible) noexcept {}
};

using pool_t = rmm::mr::pool_memory_resource;

struct bare {
  pool_t* pool;
  void* allocate(cuda::stream_ref s, std::size_t b)
  {
    return pool->allocate(s, b, 256);
  }
  void deallocate(cuda::stream_ref s, void* p, std::size_t b)
  {
    pool->deallocate(s, p, b, 256);
  }
};

thread_local std::exception_ptr failed_lease;

struct before {
  pool_t* pool;
  std::shared_mutex mutex;
  std::unique_ptr<pool_t>* owned{};
  std::atomic<std::size_t> bytes{0}, count{0};
  __attribute__((noinline)) void* allocate(cuda::stream_ref s, std::size_t b)
  {
    failed_lease = nullptr;
    std::shared_lock lock(mutex);
    void* p = pool->allocate(s, b, 256);
    bytes.fetch_add(b, std::memory_order_relaxed);
    count.fetch_add(1, std::memory_order_relaxed);
    return p;
  }
  __attribute__((noinline)) void deallocate(cuda::stream_ref s, void* p, std::size_t b)
  {
    std::shared_lock lock(mutex);
    pool->deallocate(s, p, b, 256);
    bytes.fetch_sub(b, std::memory_order_relaxed);
    count.fetch_sub(1, std::memory_order_relaxed);
  }
};

struct after {
  static constexpr std::uint64_t closed     = std::uint64_t{1} << 63;
  static constexpr std::uint64_t one_carved = std::uint64_t{1} << 35;
  static constexpr std::uint64_t carving(std::size_t bytes)
  {
    return one_carved + ((std::uint64_t{bytes} + 255) >> 8);
  }
  pool_t* pool;
  alignas(64) std::atomic<std::uint64_t> users{0};
  __attribute__((noinline)) void* allocate(cuda::stream_ref s, std::size_t b)
  {
    auto const mine = carving(b);
    if ((users.fetch_add(mine, std::memory_order_acquire) & closed) != 0) { std::abort(); }
    return pool->allocate(s, b, 256);
  }
  __attribute__((noinline)) void deallocate(cuda::stream_ref s, void* p, std::size_t b)
  {
    pool->deallocate(s, p, b, 256);
    users.fetch_sub(carving(b), std::memory_order_release);
  }
};

/// p50 of one round over batches of 100 pairs: `threads` threads, `pairs`
/// pairs each.
template <typename W>
double round_p50(W& w, int threads, std::size_t pairs, std::size_t bytes)
{
  std::vector<std::vector<double>> ns(static_cast<std::size_t>(threads));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      // The legacy stream: without a GPU RMM cannot size its per-thread event table.
      cuda::stream_ref s{cudaStreamLegacy};
      for (int i = 0; i < 200; ++i) { w.deallocate(s, w.allocate(s, bytes), bytes); }
      auto& mine = ns[static_cast<std::size_t>(t)];
      mine.reserve(pairs);
      ready.fetch_add(1);
      while (!go.load()) {}
      // Batches of 100 pairs: this clock reads in steps of 10 ns or more.
      for (std::size_t i = 0; i < pairs; i += 100) {
        auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < 100; ++k) { w.deallocate(s, w.allocate(s, bytes), bytes); }
        mine.push_back(
            std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0)
                .count() /
            100);
      }
    });
  }
  while (ready.load() < threads) { std::this_thread::yield(); }
  go = true;
  for (auto& th : pool) { th.join(); }
  std::vector<double> all;
  for (auto& v : ns) { all.insert(all.end(), v.begin(), v.end()); }
  std::nth_element(all.begin(), all.begin() + static_cast<long>(all.size() / 2), all.end());
  return all[all.size() / 2];
}

double median(std::vector<double> v)
{
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv)
{
  int const threads       = argc > 1 ? std::atoi(argv[1]) : 1;
  std::size_t const pairs = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 20000;
  int const rounds        = argc > 3 ? std::atoi(argv[3]) : 15;
  for (std::size_t bytes : {std::size_t{256}, std::size_t{64} << 10, std::size_t{1} << 20}) {
    pool_t pool(host_upstream{}, std::size_t{256} << 20);
    bare b{&pool};
    before x{&pool};
    after y{&pool};
    std::vector<double> pb, px, py;
    for (int r = 0; r < rounds; ++r) {  // interleaved, so drift falls on all three
      pb.push_back(round_p50(b, threads, pairs, bytes));
      px.push_back(round_p50(x, threads, pairs, bytes));
      py.push_back(round_p50(y, threads, pairs, bytes));
    }
    auto const mb = median(pb), mx = median(px), my = median(py);
    std::printf(
        "%d thread(s) %8zu B: pool %7.1f ns  before %7.1f ns (%.3fx, +%.1f)  after %7.1f ns "
        "(%.3fx, +%.1f)\n",
        threads,
        bytes,
        mb,
        mx,
        mx / mb,
        mx - mb,
        my,
        my / mb,
        my - mb);
  }
}
