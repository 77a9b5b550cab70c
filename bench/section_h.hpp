#pragma once

// Section h of rmmd_bench: a busy node. The daemon's
// resident memory per live lease (a million on a host pool, 100,000 on the
// CUDA pool) and per open session (a thousand), session set-up with a
// thousand open, the stats call, `rmmctl stats` and a /metrics scrape with a
// thousand open, and a session holding 100,000 leases SIGKILLed to its
// memory back. bench/README.md says how; the sessions and leases are made on
// the session socket by helper processes (harness/raw_session.hpp).

#include "bench/bench_support.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace rmmd::bench {

struct scale_options {
  /// The rmmd binary: the section starts a host-only daemon of its own from
  /// it, and runs the `rmmctl` found beside it (or in ../client/).
  std::filesystem::path rmmd;
  /// This binary: the helper processes are it, in the modes below.
  std::filesystem::path self;
  /// Added to the helpers' environment.
  std::vector<std::string> helper_env;
  bool quick{false};
  /// The bench's CUDA daemon, for the CUDA pool's figures; null: host only.
  daemon_process const* cuda_daemon{nullptr};
};

/// Runs section h, filling `out` (each part records its own error there and
/// the section goes on); returns the targets it measured.
std::vector<target_row> section_scale(scale_options const& options, results::Scale& out);

/// Every lease section h makes, host or CUDA.
constexpr std::uint64_t scale_lease_bytes = 256;

/// `rmmd_bench --raw-leases RUNTIME_DIR host|cuda COUNT 256`: one session
/// holding COUNT leases: "ready COUNT SECONDS", then holds them until stdin
/// closes (or it is killed). Returns the exit status (section_h_helpers.cpp).
int raw_leases_main(std::string const& dir, std::string const& kind, std::size_t count);

/// `rmmd_bench --raw-sessions RUNTIME_DIR COUNT 256`: COUNT sessions, one
/// after another, each holding one lease of the host pool: "ready COUNT",
/// "samples NS..." (each hello to welcome); then per stdin line "probe N": N
/// more sessions opened and closed one at a time, "samples NS..."; exits when
/// stdin closes.
int raw_sessions_main(std::string const& dir, std::size_t count);

/// `rmmd_bench --sections h` where there is no GPU: the host figures alone,
/// printed and written to `out_path` as a run of rmmd_bench. Returns the exit
/// status (0: the section ran; 1: it failed).
int section_scale_without_gpu(scale_options const& options,
                              std::string const& out_path,
                              std::string const& command);

}  // namespace rmmd::bench
