#pragma once

// Section g of rmmd_bench, memory that moves: slab
// clients hold idle slabs that fill the GPU 0 pool; the bench's own session
// asks for what only those slabs can serve, and times the request from send
// to success while the daemon asks the clients for their slabs back
// (bench/README.md).

#include "bench/bench_results.pb.h"

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>

namespace rmmd::bench {

struct mobility_config {
  int clients{16};                                ///< slab clients, one slab each
  std::size_t slab_bytes{std::size_t{64} << 20};  ///< each client's slab
  int request_slabs{4};                           ///< the request: this many slabs' bytes
  int trials{20};
  std::chrono::milliseconds reclaim_timeout{1000};  ///< the daemon's reclaim_timeout_ms
};

/// What the targets are judged on.
struct mobility_outcome {
  double p50_ms{};
  double p99_ms{};
  int refused{};
  int trials{};
};

/// Runs section g with a daemon of its own (`rmmd`: the binary; its pool on
/// GPU 0 limited to clients * slab_bytes) and `clients` processes of `self`
/// (--mobility-worker); fills `out` (one timeline: the last trial's) and
/// prints its table. Throws bench_error when it cannot run.
mobility_outcome section_mobility(mobility_config const& cfg,
                                  std::filesystem::path const& rmmd,
                                  std::string const& self,
                                  std::vector<std::string> const& env,
                                  results::Mobility* out);

/// `rmmd_bench --mobility-worker SLAB_BYTES`: a slab client of section g.
/// On "fill" it carves and frees 256 bytes (its resource leases one slab,
/// idle after) and says "filled"; when the daemon asks for its slabs it says
/// "asked NS" (steady clock, the same in every process of the host); at EOF
/// it exits.
int mobility_worker_main(std::size_t slab_bytes);

}  // namespace rmmd::bench
