#pragma once

// Section l of rmmd_bench: a shared buffer's write lease passing from a
// SIGKILLed holder to the process waiting for it (docs/failover.md). A
// daemon of the section's own serves one persistent buffer; a helper holds
// its lease, another waits in line; the bench SIGKILLs the holder and the
// waiter says when its exclusive open returned. bench/README.md says more.

#include "bench/bench_support.hpp"

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace rmmd::bench {

struct lease_options {
  /// The rmmd binary: the section starts a daemon of its own from it.
  std::filesystem::path rmmd;
  /// This binary: the helpers are it, as --lease-waiter.
  std::filesystem::path self;
  std::vector<std::string> helper_env;
  /// The buffer in GPU 0's pool (a CUDA daemon); else in a host pool.
  bool cuda{false};
  bool quick{false};
};

/// Runs section l, filling `out`; returns its target. Throws bench_error
/// when it cannot run at all.
std::vector<target_row> section_lease(lease_options const& options, results::LeaseTakeover& out);

/// `rmmd_bench --lease-waiter RUNTIME_DIR NAME`: opens a session (and a CUDA
/// context, where there is a GPU) and says "ready"; then opens NAME
/// exclusively, waiting up to 120 s in line, writes the lease's generation
/// into its first 8 bytes and says "holding GENERATION NS" (NS: when the
/// open returned, on steady_clock, the bench's clock too); holds it until
/// stdin closes or it is killed.
int lease_waiter_main(std::string const& dir, std::string const& name);

/// `rmmd_bench --sections l` where there is no GPU: the host figures,
/// written to `out_path` as a run of rmmd_bench. Returns the exit status.
int section_lease_without_gpu(lease_options const& options,
                              std::string const& out_path,
                              std::string const& command);

}  // namespace rmmd::bench
