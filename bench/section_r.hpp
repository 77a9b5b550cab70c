#pragma once

// Section r of rmmd_bench: a restarted daemon's time to serve its kept
// buffers. A daemon of the section's own runs under harness::service_manager
// (the stand-in for systemd's fd store), a helper publishes N persistent
// buffers of S bytes, the daemon is SIGKILLed and started again: from its
// start to READY=1, and to every buffer opened by name by a client process
// that was waiting for it; 3 times. Beside it, what a daemon that could not
// re-adopt would at least pay: this binary makes and exports N allocations
// of S bytes itself (before refilling a byte). bench/README.md says more.

#include "bench/bench_support.hpp"

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace rmmd::bench {

struct restart_options {
  /// The rmmd binary: the section starts a daemon of its own from it.
  std::filesystem::path rmmd;
  /// This binary: the helper processes are it, in the modes below.
  std::filesystem::path self;
  std::vector<std::string> helper_env;
  /// Buffers in GPU 0's pool (a CUDA daemon); else in a host pool (a
  /// host-only daemon).
  bool cuda{false};
  std::size_t buffers{100};
  std::size_t buffer_bytes{std::size_t{1} << 30};
  std::size_t repetitions{3};
};

/// Runs section r, filling `out`; returns the targets it measured. Throws
/// bench_error when it cannot run at all.
std::vector<target_row> section_restart(restart_options const& options,
                                        results::RestartServing& out);

/// `rmmd_bench --restart-publisher RUNTIME_DIR POOL COUNT BYTES`: creates
/// COUNT persistent buffers "bench-r/I" of BYTES in POOL, publishes each and
/// says "ready COUNT"; exits.
int restart_publisher_main(std::string const& dir,
                           std::string const& pool,
                           std::size_t count,
                           std::size_t bytes);

/// `rmmd_bench --restart-opener RUNTIME_DIR COUNT`: sets up (CUDA, where
/// there is a GPU) and says "ready"; at a line "go" tries to open a session
/// every millisecond until one opens, then opens "bench-r/0".. by name and
/// says "done COUNT SESSION_NS LAST_NS READOPTED" (when the session opened and
/// when the last buffer did, on steady_clock, the bench's clock too; the
/// daemon's count of buffers served again); closes them and exits when stdin
/// closes.
int restart_opener_main(std::string const& dir, std::size_t count);

/// `rmmd_bench --sections r` where there is no GPU: the host figures,
/// written to `out_path` as a run of rmmd_bench. Returns the exit status.
int section_restart_without_gpu(restart_options const& options,
                                std::string const& out_path,
                                std::string const& command);

}  // namespace rmmd::bench
