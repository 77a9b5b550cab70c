#pragma once

// Section p of rmmd_bench, peering: a buffer of another node's daemon, with
// two daemons on one host standing for nodes A and B (A on GPU 0 with a
// fabric pool, B under CUDA_VISIBLE_DEVICES=1, mutual TLS on 127.0.0.1 with
// the certificates of scripts/make-test-certs.sh). Measures the remote open
// (open NODE:NAME through B's daemon, import the fabric handle, map it on
// GPU 1, close) at 64 MiB and 4 GiB, and GPU 1 reading a remote buffer
// (a device-to-device copy out of the mapping) next to cudaMemcpyPeer of the
// same bytes from GPU 0 to GPU 1 in the same run. Skips, saying why,
// without 2 GPUs or an IMEX channel. bench/README.md says how to read it.

#include "bench/section_support.hpp"

#include <filesystem>

namespace rmmd::bench {

/// Runs section p against daemons it starts from `rmmd`, filling
/// `st.doc.peering` and checking its target into `st`.
void section_peering(config const& cfg, std::filesystem::path const& rmmd, run_state& st);

}  // namespace rmmd::bench
