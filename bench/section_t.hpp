#pragma once

// Section t of rmmd_bench, tenants: every uid is a tenant with
// pools of its own, made on its first session. (a) session set-up with 1,000
// sessions of 50 uids open (helper processes run as numeric uids the
// daemon's allowed_uids names; no passwd entries needed); (b) an allocation
// that only another uid's idle memory can serve: a helper of another uid
// holds idle slabs of most of the pool, the bench's own session asks for
// more than what is left, and the daemon must move the memory between the
// tenants (trim one, grow the other). The fast path's figures are section a's.
// Host pool without a GPU (`--sections t`), the GPU 0 pool with one.
// bench/README.md says how to read it.

#include "bench/bench_support.hpp"

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace rmmd::bench {

struct tenants_options {
  /// The rmmd binary: the section starts daemons of its own from it.
  std::filesystem::path rmmd;
  /// This binary: the helper processes are it, in the modes below.
  std::filesystem::path self;
  std::vector<std::string> helper_env;
  bool quick{false};
  /// The GPU 0 pool (a CUDA daemon); else a host pool (a host-only daemon).
  bool cuda{false};
};

/// Runs section t, filling `out` (each part records its own error there);
/// returns the targets it measured. REQUIRES: root (helpers change uid).
std::vector<target_row> section_tenants(tenants_options const& options, results::Tenants& out);

/// `rmmd_bench --tenant-sessions RUNTIME_DIR COUNT`: COUNT sessions opened
/// one after another and held: "samples NS..." (each hello to welcome), then
/// waits for stdin to close.
int tenant_sessions_main(std::string const& dir, std::size_t count);

/// `rmmd_bench --tenant-idle RUNTIME_DIR host|cuda COUNT BYTES`: a slab
/// client at rest: COUNT leases of BYTES from the first pool of that backend,
/// reported as idle, reclaimable slabs; "ready"; frees them all when the
/// daemon asks ("gave-back"); exits when stdin closes.
int tenant_idle_main(std::string const& dir,
                     std::string const& backend,
                     std::size_t count,
                     std::size_t bytes);

/// `rmmd_bench --sections t` where there is no GPU: the host figures alone,
/// written to `out_path` as a run of rmmd_bench. Returns the exit status.
int section_tenants_without_gpu(tenants_options const& options,
                                std::string const& out_path,
                                std::string const& command);

}  // namespace rmmd::bench
