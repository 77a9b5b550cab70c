#pragma once

// The targets sections a to f judge their figures by (bench/README.md lists
// them with the figures they apply to). Sections a8, g and h keep theirs in
// their own files; the per-lease memory target is shared by e and h.

namespace rmmd::bench {

constexpr double fast_ratio_target       = 1.5;  // x cuda_async p50, 256 B to 1 MiB
constexpr double direct_steps_target     = 1.3;  // x the sum of the bare steps
constexpr double fast_aggregate_target   = 5e6;  // pairs/s, 16 processes
constexpr double direct_aggregate_target = 5e4;
constexpr double direct_over_b2_target   = 0.75;  // 16 direct processes / b2, 1 thread
constexpr double session_setup_target_ms = 2.0;
constexpr double reclaim_target_ms       = 50.0;
/// The daemon's RSS above its idle RSS, per live lease. Judged above idle,
/// not as a whole: a process holding a CUDA context alone is over 100 MiB.
constexpr double lease_rss_target_bytes = 128.0;
constexpr double share_open_target_ms   = 1.0;    // open p50, every size
constexpr double share_speedup_target   = 100.0;  // x the host copy's p50, at 4 GiB

}  // namespace rmmd::bench
