#pragma once

// Section a8 of rmmd_bench: slab mode's allocate+deallocate pair
// against RMM's own pool_memory_resource over cuda_async_memory_resource, in
// one process, with 1 and with 8 threads, with the default (automatic)
// carving lanes, one lane, and a lane per thread (bench/README.md).

#include "bench/bench_results.pb.h"

#include <rmmd/session.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace rmmd::bench {

/// slab p50 / pool p50 at every size and thread count: the median over the
/// rounds of each round's ratio.
constexpr double fast_vs_pool_target = 1.05;
/// With several threads and the default (automatic) lanes: slab p50 / pool
/// p50, where RMM's one pool makes the threads queue on its mutex.
constexpr double auto_lanes_threads_target = 0.2;
/// With the default lanes and one thread: each round's slab p50 / the
/// one-lane resource's p50 (the fast path unchanged), the rounds' median.
constexpr double auto_lanes_one_thread_target = 1.05;

struct fast_vs_pool_options {
  std::vector<int> threads{1, 8};
  std::vector<std::size_t> sizes{256, std::size_t{64} << 10, std::size_t{1} << 20};
  std::size_t warmup{200};  // per thread, each round
  std::size_t pairs{2000};  // timed, per thread, each round
  std::size_t rounds{24};   // each resource takes each place in a round's order in turn
  std::size_t alignment{256};
};

/// One target of the section, as measured (`<= limit`).
struct fast_vs_pool_target_row {
  std::string what;
  double measured{};
  double limit{fast_vs_pool_target};
};

struct fast_vs_pool_outcome {
  std::vector<fast_vs_pool_target_row> targets;
  std::vector<std::string> errors;  // "cell: what went wrong", one per failed cell
};

/// Measures every cell on GPU 0 through `session` (slab mode, the session's
/// pool of GPU 0), prints its table and appends its rows to
/// `doc.fast_vs_pool` (a cell that fails has its `error`). Throws when a
/// resource cannot be made.
fast_vs_pool_outcome section_fast_vs_pool(rmmd::session const& session,
                                          fast_vs_pool_options const& options,
                                          results::Run& doc);

}  // namespace rmmd::bench
