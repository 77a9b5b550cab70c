// Section a8 of rmmd_bench: slab mode against RMM's pool, 1 and 8 threads.
//
// Slab mode runs with the options a program gets by default (automatic
// carving lanes: one lane for one thread, a lane per thread once a second
// allocates), with one lane, and with a lane per thread from the start. With
// the default lanes, the one-lane resource runs in the same rounds too, so
// that one thread shows the default's fast path against one lane's.
//
// Both resources carve with the same RMM code (pool_memory_resource); what
// slab mode adds per call is its own bookkeeping. A 5% target needs care with
// a pair of about a microsecond: the p50 of all pairs pooled drifts with the
// host by far more than 5% from run to run, so the target judges the median
// over rounds of each round's slab p50 / pool p50, the resources running
// back to back within a round. Threads made anew for every round, and a
// resource that keeps its place in the round, move a ratio by more than the
// target too; so the threads are made once and pinned, one CPU each, and
// each resource takes every place in the round in turn. A further resource,
// the pool itself again, shows what the method reads where there is no
// difference.

#include "bench/section_a8.hpp"

#include "bench/bench_support.hpp"

#include <rmmd/ipc_memory_resource.hpp>

#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/resource_ref.hpp>

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sched.h>
#include <cuda/stream>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::bench {
namespace {

void check(cudaError_t e, char const* call)
{
  if (e != cudaSuccess) {
    throw bench_error(std::string(call) + " failed: " + cudaGetErrorName(e));
  }
}

std::string size_text(std::size_t bytes)
{
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0) {
    return std::to_string(bytes >> 20) + " MiB";
  }
  if (bytes >= 1024 && bytes % 1024 == 0) { return std::to_string(bytes >> 10) + " KiB"; }
  return std::to_string(bytes) + " B";
}

std::string fixed3(double x)
{
  char text[32];
  std::snprintf(text, sizeof(text), "%.3f", x);
  return text;
}

/// T non-blocking streams, one per thread, shared by both resources.
class streams {
 public:
  explicit streams(int count) : streams_(static_cast<std::size_t>(count))
  {
    for (auto& s : streams_) {
      check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    }
  }
  streams(streams const&)            = delete;
  streams& operator=(streams const&) = delete;
  ~streams()
  {
    for (auto s : streams_) {
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
  }
  [[nodiscard]] cudaStream_t operator[](std::size_t i) const noexcept
  {
    return streams_[i];
  }

 private:
  std::vector<cudaStream_t> streams_;
};

/// RMM's pool with what a slab-mode pair runs besides its pool, done the same
/// way: two out-of-line layers each way (the resource and the carver), the
/// size, alignment and process-exit checks, and one atomic add on allocate
/// and one on deallocate (the carver's word of carved count and bytes). The
/// gap between this and the bare pool is slab mode's own per-call cost; the
/// gap between slab mode and this is whatever differs below (the carver's
/// pool over imported slabs against this pool over cuda_async).
class pool_with_bookkeeping {
 public:
  explicit pool_with_bookkeeping(rmm::mr::pool_memory_resource& pool) : pool_(pool) {}
  [[gnu::noinline]] void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t align)
  {
    if (bytes == 0) { return nullptr; }
    if (bytes > capacity_) { throw bench_error("larger than the pool"); }
    return carve(stream, bytes, align);
  }
  [[gnu::noinline]] void deallocate(cuda::stream_ref stream,
                                    void* ptr,
                                    std::size_t bytes,
                                    std::size_t align) noexcept
  {
    if (ptr == nullptr || exiting_.load(std::memory_order_acquire)) { return; }
    give_back(stream, ptr, bytes, align);
  }

 private:
  static constexpr std::uint64_t closed = std::uint64_t{1} << 63;
  static std::uint64_t units(std::size_t bytes) noexcept
  {
    return (std::uint64_t{1} << 40) + (bytes + 255) / 256;
  }
  [[gnu::noinline]] void* carve(cuda::stream_ref stream, std::size_t bytes, std::size_t align)
  {
    if (align > 256) { throw bench_error("alignment above 256"); }
    if ((users_.fetch_add(units(bytes), std::memory_order_acquire) & closed) != 0) {
      throw bench_error("closed");  // never: nothing trims this one
    }
    return pool_.allocate(stream, bytes, align);
  }
  [[gnu::noinline]] void give_back(cuda::stream_ref stream,
                                   void* ptr,
                                   std::size_t bytes,
                                   std::size_t align) noexcept
  {
    pool_.deallocate(stream, ptr, bytes, align);
    users_.fetch_sub(units(bytes), std::memory_order_release);
  }

  rmm::mr::pool_memory_resource& pool_;
  std::size_t capacity_{std::size_t{1} << 40};
  std::atomic<bool> exiting_{false};
  std::atomic<std::uint64_t> users_{0};
};

struct round_result {
  std::vector<double> ns;  // every timed pair of every thread
  double wall_s{};         // first start to last end
};

/// The CPUs this process may run on (empty if it cannot tell).
std::vector<int> usable_cpus()
{
  std::vector<int> out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) { return out; }
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) { out.push_back(cpu); }
  }
  return out;
}

/// The section's T threads, made once per thread count and kept for every
/// round of every resource, thread t pinned to CPU `cpus[t]` when `cpus` has
/// one for each. Rounds that made their threads anew let the scheduler place
/// each resource's threads anew, on another core than the resource it is
/// compared with.
class crew {
 public:
  crew(int threads, std::vector<int> const& cpus)
  {
    for (int t = 0; t < threads; ++t) {
      members_.emplace_back([this, t] { work(static_cast<std::size_t>(t)); });
      if (cpus.size() >= static_cast<std::size_t>(threads)) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpus[static_cast<std::size_t>(t)], &set);
        pinned_ = pthread_setaffinity_np(members_.back().native_handle(), sizeof(set), &set) == 0 &&
                  (t == 0 || pinned_);
      }
    }
  }
  crew(crew const&)            = delete;
  crew& operator=(crew const&) = delete;
  ~crew()
  {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& m : members_) { m.join(); }
  }
  [[nodiscard]] bool pinned() const noexcept
  {
    return pinned_;
  }
  /// Runs job(t) on every thread t; returns when all have.
  void run(std::function<void(std::size_t)> const& job)
  {
    std::unique_lock lock(mutex_);
    job_     = &job;
    running_ = members_.size();
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
  }

 private:
  void work(std::size_t t)
  {
    std::uint64_t seen = 0;
    for (;;) {
      std::function<void(std::size_t)> const* job = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) { return; }
        seen = generation_;
        job  = job_;
      }
      (*job)(t);  // catches its own exceptions
      std::lock_guard lock(mutex_);
      if (--running_ == 0) { done_.notify_one(); }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::function<void(std::size_t)> const* job_{nullptr};
  std::uint64_t generation_{0};
  std::size_t running_{0};
  bool stop_{false};
  bool pinned_{false};
  std::vector<std::thread> members_;  // last: they use the rest
};

/// One round of one resource on the crew: each thread, on its own stream,
/// warms up, waits until all have, then times `pairs` pairs.
template <typename Resource>
round_result run_round(crew& team,
                       Resource& mr,
                       streams const& s,
                       int threads,
                       std::size_t bytes,
                       fast_vs_pool_options const& o)
{
  auto const n = static_cast<std::size_t>(threads);
  std::vector<std::vector<double>> per_thread(n);
  std::vector<steady::time_point> starts(n), ends(n);
  std::vector<std::exception_ptr> errors(n);
  std::atomic<int> warm{0};
  std::function<void(std::size_t)> const body = [&](std::size_t t) {
    bool counted = false;
    try {
      check(cudaSetDevice(0), "cudaSetDevice");
      cuda::stream_ref ref{s[t]};
      for (std::size_t i = 0; i < o.warmup; ++i) {
        void* p = mr.allocate(ref, bytes, o.alignment);
        mr.deallocate(ref, p, bytes, o.alignment);
      }
      auto& ns = per_thread[t];
      ns.reserve(o.pairs);
      warm.fetch_add(1);
      counted = true;
      while (warm.load(std::memory_order_acquire) < threads) {}
      starts[t] = steady::now();
      for (std::size_t i = 0; i < o.pairs; ++i) {
        auto const t0 = steady::now();
        void* p       = mr.allocate(ref, bytes, o.alignment);
        mr.deallocate(ref, p, bytes, o.alignment);
        ns.push_back(static_cast<double>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(steady::now() - t0).count()));
      }
      ends[t] = steady::now();
    } catch (...) {
      errors[t] = std::current_exception();
      if (!counted) { warm.fetch_add(1); }
    }
  };
  team.run(body);
  for (std::size_t t = 0; t < n; ++t) {
    check(cudaStreamSynchronize(s[t]), "cudaStreamSynchronize");
  }
  for (auto const& e : errors) {
    if (e) { std::rethrow_exception(e); }
  }
  round_result out;
  for (auto& ns : per_thread) { out.ns.insert(out.ns.end(), ns.begin(), ns.end()); }
  out.wall_s = std::chrono::duration<double>(*std::max_element(ends.begin(), ends.end()) -
                                             *std::min_element(starts.begin(), starts.end()))
                   .count();
  return out;
}

double median(std::vector<double> v)
{
  if (v.empty()) { return 0.0; }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// What each resource measured in a cell: every pair, and each round's p50.
struct measured {
  std::vector<double> ns;
  std::vector<double> p50;
  double pairs{};
  double wall_s{};
};

/// A cell's resources: slab mode and RMM's pool, called directly and through
/// a resource_ref; with one lane the bookkept pool and the pool again; with
/// the default lanes the one-lane resource through a resource_ref.
struct cell_samples {
  measured fast, pool, bk, again, fast_ref, pool_ref, one_ref;
};

/// What a cell's `lanes` says: ipc_resource_options::carving_lanes, where
/// auto_carving_lanes is the default.
std::string lanes_text(std::size_t lanes)
{
  return lanes == auto_carving_lanes ? "auto" : std::to_string(lanes);
}

void print_header(fast_vs_pool_options const& o)
{
  std::printf(
      "\na8) slab mode against RMM's pool in one process: T threads, each on its own stream and "
      "CPU, %zu pairs each per batch; each round one batch per resource, their order turned by "
      "one each round, %zu rounds; all/all: slab p50 / pool p50 of every pair, called directly\n",
      o.pairs,
      o.rounds);
  std::printf(
      "    direct: the rounds' median of each round's slab p50 / pool p50, each resource called "
      "by its own type (RMM's pool, all in headers, is then inlined into the timing loop); ref: "
      "the same through rmm::device_async_resource_ref, as RMM's containers call every resource "
      "(the target: <= %.2fx; both marked)\n",
      fast_vs_pool_target);
  std::printf(
      "    bk: RMM's pool plus what slab mode adds per call besides its pool (two out-of-line "
      "layers, its checks, one atomic add each way); pool': the same pool again, as a resource of "
      "its own (what the method reads as a difference where there is none); one lane only; "
      "bk/pool, pool'/pool: the rounds' median of each round's p50 over the pool's\n");
  std::printf(
      "    lanes: auto is the default options' (one lane for one thread, a lane per thread once a "
      "second allocates; the target with several threads: <= %.2fx); def/1: the rounds' median of "
      "the default's p50 over the one-lane resource's, both through the reference (the target "
      "with one thread: <= %.2fx)\n",
      auto_lanes_threads_target,
      auto_lanes_one_thread_target);
  std::printf("%7s %5s %7s %11s %11s %12s %11s %11s %12s %8s %13s %13s %9s %8s %8s %13s\n",
              "threads",
              "lanes",
              "size",
              "slab p50",
              "slab p99",
              "slab pairs/s",
              "pool p50",
              "pool p99",
              "pool pairs/s",
              "all/all",
              "direct",
              "ref",
              "bk p50",
              "bk/pool",
              "pool'/pl",
              "def/1");
}

/// The cell's figures and targets into `row` and `out`, and its table line.
void record_cell(cell_samples const& m,
                 int threads,
                 std::size_t lanes,
                 std::size_t bytes,
                 bool with_bk,
                 results::FastVsPoolCell& row,
                 fast_vs_pool_outcome& out)
{
  auto const& [fast_m, pool_m, bk_m, again_m, fast_ref_m, pool_ref_m, one_ref_m] = m;
  bool const default_lanes = lanes == auto_carving_lanes;
  // Default lanes with several threads: no queue on one pool's mutex.
  double const target_x =
      default_lanes && threads > 1 ? auto_lanes_threads_target : fast_vs_pool_target;
  char limit[32];
  std::snprintf(limit, sizeof(limit), "<= %g x", target_x);
  auto ratios = [&](measured const& x, measured const& base) {
    std::vector<double> v;
    for (std::size_t r = 0; r < x.p50.size() && r < base.p50.size(); ++r) {
      if (base.p50[r] > 0) { v.push_back(x.p50[r] / base.p50[r]); }
    }
    return v;
  };
  auto const round_ratios = ratios(fast_m, pool_m);
  auto const ratio        = median(round_ratios);
  auto const ref_ratios   = ratios(fast_ref_m, pool_ref_m);
  auto const ref_ratio    = median(ref_ratios);
  auto const bk_ratio     = median(ratios(bk_m, pool_m));
  auto const again_ratio  = median(ratios(again_m, pool_m));
  auto const f            = summarize(fast_m.ns);
  auto const p            = summarize(pool_m.ns);
  auto const bk           = summarize(bk_m.ns);
  auto const pooled       = p.p50_us > 0 ? f.p50_us / p.p50_us : 0.0;
  for (auto x : round_ratios) { row.add_round_ratios(x); }
  for (auto x : ref_ratios) { row.add_ref_round_ratios(x); }
  row.set_ref_fast_p50_us(summarize(fast_ref_m.ns).p50_us);
  row.set_ref_pool_p50_us(summarize(pool_ref_m.ns).p50_us);
  row.set_median_ref_round_ratio(ref_ratio);
  if (with_bk) {
    row.set_bookkept_p50_us(bk.p50_us);
    row.set_bookkept_over_pool(bk_ratio);
    row.set_pool_again_over_pool(again_ratio);
  }
  auto within     = [&](double x) { return x > 0 && x <= target_x; };
  bool const pass = within(ref_ratio);
  auto cell       = std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") +
              (default_lanes ? ", default lanes"
               : lanes == 1  ? std::string()
                             : ", " + std::to_string(lanes) + " lanes") +
              ", " + size_text(bytes);
  out.targets.push_back({"slab p50 / pool p50 through resource_ref, " + cell, ref_ratio, target_x});
  out.targets.push_back({"slab p50 / pool p50 called directly, " + cell, ratio, target_x});
  double one_lane_ratio = 0;
  if (default_lanes) {
    one_lane_ratio = median(ratios(fast_ref_m, one_ref_m));
    row.set_ref_one_lane_p50_us(summarize(one_ref_m.ns).p50_us);
    row.set_default_over_one_lane(one_lane_ratio);
    if (threads == 1) {
      bool const same = one_lane_ratio > 0 && one_lane_ratio <= auto_lanes_one_thread_target;
      char one_limit[32];
      std::snprintf(one_limit, sizeof(one_limit), "<= %g x", auto_lanes_one_thread_target);
      row.mutable_one_lane_target()->set_target(one_limit);
      row.mutable_one_lane_target()->set_pass(same);
      out.targets.push_back({"default lanes p50 / one lane p50 through resource_ref, " + cell,
                             one_lane_ratio,
                             auto_lanes_one_thread_target});
    }
  }
  row.mutable_target()->set_target(limit);
  row.mutable_target()->set_pass(pass);
  row.mutable_direct_target()->set_target(limit);
  row.mutable_direct_target()->set_pass(within(ratio));
  row.set_pairs_each(static_cast<std::uint32_t>(f.count));
  row.set_fast_p50_us(f.p50_us);
  row.set_fast_p99_us(f.p99_us);
  row.set_fast_pairs_per_s(fast_m.wall_s > 0 ? fast_m.pairs / fast_m.wall_s : 0);
  row.set_pool_p50_us(p.p50_us);
  row.set_pool_p99_us(p.p99_us);
  row.set_pool_pairs_per_s(pool_m.wall_s > 0 ? pool_m.pairs / pool_m.wall_s : 0);
  row.set_fast_over_pool_p50(pooled);
  row.set_median_round_ratio(ratio);
  std::printf(
      "%7d %5s %7s %11.3f %11.3f %12.0f %11.3f %11.3f %12.0f %8.3f %8.3f %4s %8.3f %4s "
      "%9s %8s %8s %8s %4s\n",
      threads,
      lanes_text(lanes).c_str(),
      size_text(bytes).c_str(),
      f.p50_us,
      f.p99_us,
      row.fast_pairs_per_s(),
      p.p50_us,
      p.p99_us,
      row.pool_pairs_per_s(),
      pooled,
      ratio,
      within(ratio) ? "pass" : "MISS",
      ref_ratio,
      pass ? "pass" : "MISS",
      with_bk ? fixed3(bk.p50_us).c_str() : "-",
      with_bk ? fixed3(bk_ratio).c_str() : "-",
      with_bk ? fixed3(again_ratio).c_str() : "-",
      default_lanes ? fixed3(one_lane_ratio).c_str() : "-",
      default_lanes && threads == 1
          ? (one_lane_ratio > 0 && one_lane_ratio <= auto_lanes_one_thread_target ? "pass" : "MISS")
          : "");
}

}  // namespace

fast_vs_pool_outcome section_fast_vs_pool(rmmd::session const& session,
                                          fast_vs_pool_options const& o,
                                          results::Run& doc)
{
  auto const cpus = usable_cpus();
  print_header(o);
  check(cudaSetDevice(0), "cudaSetDevice");
  ipc_resource_options slab_options;
  slab_options.mode = allocation_mode::slab;
  // The default options: automatic lanes.
  ipc_memory_resource defaults(session, 0, slab_options);
  auto one_lane_options          = slab_options;
  one_lane_options.carving_lanes = 1;
  ipc_memory_resource one_lane(session, 0, one_lane_options);
  // With T threads, also slab mode with a carving lane per thread from the
  // start (ipc_resource_options::carving_lanes = T), made when first needed.
  std::map<std::size_t, std::unique_ptr<ipc_memory_resource>> with_lanes;
  rmm::mr::cuda_async_memory_resource upstream{};
  rmm::mr::pool_memory_resource pool(upstream, std::size_t{256} << 20);
  pool_with_bookkeeping bookkept(pool);

  fast_vs_pool_outcome out;
  for (int threads : o.threads) {
    streams s(threads);
    // CPU 0 of the process's set is left to the main thread, the keeper and
    // the daemon; the crew takes the next T when there are that many.
    std::vector<int> crew_cpus;
    if (cpus.size() > static_cast<std::size_t>(threads)) {
      crew_cpus.assign(cpus.begin() + 1, cpus.begin() + 1 + threads);
    }
    crew team(threads, crew_cpus);
    std::printf("    %d thread%s: %s\n",
                threads,
                threads == 1 ? "" : "s",
                team.pinned() ? ("pinned to CPUs " + std::to_string(crew_cpus.front()) + ".." +
                                 std::to_string(crew_cpus.back()))
                                    .c_str()
                              : "not pinned (too few CPUs, or the process may not pin)");
    std::vector<std::size_t> lane_counts{auto_carving_lanes, 1};
    if (threads > 1) { lane_counts.push_back(static_cast<std::size_t>(threads)); }
    for (auto lanes : lane_counts) {
      for (auto bytes : o.sizes) {
        auto& row = *doc.add_fast_vs_pool();
        row.set_threads(static_cast<std::uint32_t>(threads));
        row.set_size_bytes(static_cast<std::uint32_t>(bytes));
        row.set_rounds(static_cast<std::uint32_t>(o.rounds));
        row.set_carving_lanes(static_cast<std::uint32_t>(lanes));
        row.set_pinned(team.pinned());
        if (lanes > 1 && !with_lanes.contains(lanes)) {
          auto options          = slab_options;
          options.carving_lanes = lanes;
          with_lanes.emplace(lanes, std::make_unique<ipc_memory_resource>(session, 0, options));
        }
        auto& fast = lanes == auto_carving_lanes ? defaults
                     : lanes == 1                ? one_lane
                                                 : *with_lanes.at(lanes);
        try {
          cell_samples samples;
          auto& [fast_m, pool_m, bk_m, again_m, fast_ref_m, pool_ref_m, one_ref_m] = samples;
          auto batch = [&](auto& resource, measured& into) {
            return [&, mr = &resource, m = &into] {
              auto got = run_round(team, *mr, s, threads, bytes, o);
              m->pairs += static_cast<double>(got.ns.size());
              m->wall_s += got.wall_s;
              m->p50.push_back(summarize(got.ns).p50_us);
              m->ns.insert(m->ns.end(), got.ns.begin(), got.ns.end());
            };
          };
          bool const with_bk = lanes == 1;
          // As RMM's containers (device_buffer, device_uvector) call every
          // resource: through a type-erased reference, an indirect call that
          // no compiler inlines into the caller.
          rmm::device_async_resource_ref fast_ref{fast};
          rmm::device_async_resource_ref pool_ref{pool};
          rmm::device_async_resource_ref one_lane_ref{one_lane};
          std::vector<std::function<void()>> batches{batch(fast, fast_m),
                                                     batch(pool, pool_m),
                                                     batch(fast_ref, fast_ref_m),
                                                     batch(pool_ref, pool_ref_m)};
          if (with_bk) {
            batches.push_back(batch(bookkept, bk_m));
            batches.push_back(batch(pool, again_m));
          }
          if (lanes == auto_carving_lanes) { batches.push_back(batch(one_lane_ref, one_ref_m)); }
          // Each resource takes each place in the order as often as the
          // others, so what a place costs (the first after a switch, say)
          // falls on all.
          for (std::size_t r = 0; r < o.rounds; ++r) {
            for (std::size_t i = 0; i < batches.size(); ++i) {
              batches[(i + r) % batches.size()]();
            }
          }
          record_cell(samples, threads, lanes, bytes, with_bk, row, out);
        } catch (std::exception const& e) {
          row.set_error(e.what());
          out.errors.push_back(std::to_string(threads) + " threads, lanes " + lanes_text(lanes) +
                               ", " + size_text(bytes) + ": " + e.what());
          std::printf("%7d %5s %7s  ERROR: %s\n",
                      threads,
                      lanes_text(lanes).c_str(),
                      size_text(bytes).c_str(),
                      e.what());
        }
        std::fflush(stdout);
      }
    }
  }
  return out;
}

}  // namespace rmmd::bench
