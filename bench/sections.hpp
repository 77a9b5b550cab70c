#pragma once

// Sections a to f of rmmd_bench (bench/README.md says what each measures),
// each in its file (section_a.cpp ... section_f.cpp), and the helper
// processes they start: this binary again, given a helper name
// (helper_mains.cpp). Each section prints its table, adds its results to
// `st.doc`, checks its targets into `st` and records a failed cell there as
// an error; one that cannot run at all throws.

#include "bench/section_support.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rmmd::bench {

/// Section a's p50 (us) of every cell measured, by resource key and size.
using pair_p50_map = std::map<std::pair<std::string, std::size_t>, double>;

/// a) allocate+deallocate pairs, one resource at a time (section_a.cpp).
pair_p50_map section_pairs(config const& cfg,
                           rmmd::session const& session,
                           rmmd::session const& grpc_session,
                           run_state& st);

/// b) the direct path's bare steps, against section a's direct p50 in
/// `pair_p50` (section_b.cpp).
void section_steps(config const& cfg,
                   rmmd::session const& session,
                   pair_p50_map const& pair_p50,
                   run_state& st);

/// b2) the daemon's CUDA work per direct pair, 1 to 8 threads (section_b2.cpp).
void section_daemon_side(config const& cfg, run_state& st);

/// c) N client processes at once; with `devices` (c2), 16 direct processes
/// only, worker i on GPU devices[i % size], its row's mode "direct-Ngpu"
/// (section_c.cpp).
void section_processes(config const& cfg,
                       daemon_process& daemon,
                       run_state& st,
                       std::vector<int> const& devices = {});

/// d) session set-up; SIGKILL to memory back (section_d.cpp).
void section_setup_and_reclaim(config const& cfg,
                               daemon_process& daemon,
                               rmmd::session const& session,
                               run_state& st);

/// e) the daemon's resident memory; `rss_fresh` is its RSS right after
/// start (section_e.cpp).
void section_rss(config const& cfg,
                 daemon_process& daemon,
                 rmmd::session const& session,
                 std::uint64_t rss_fresh,
                 run_state& st);

/// f) named shared buffers (section_f.cpp).
void section_sharing(config const& cfg, daemon_process& daemon, run_state& st);

/// A posix-fd exportable pool on GPU 0 with `release_threshold` (0, as rmmd's
/// pools are by default, unless --cuda-release-threshold says otherwise).
cudaError_t make_exportable_pool(cudaMemPool_t* pool, std::uint64_t release_threshold = 0);

// ----------------------------------------------- the helpers' own mains
// Each runs in a process of its own, started by its section; it speaks the
// line protocol of section_support.hpp on stdout and returns its exit status.

/// Section b's exporter: a pool exported over the socket on fd 3, then a
/// pointer exported per request (section_b.cpp).
int exporter_main();
/// Section c's client: pairs of `bytes` for `seconds` on `device` after "go".
int worker_main(client_kind kind, std::size_t bytes, double seconds, int device);
/// Section d's process to SIGKILL: holds `bytes` until stdin closes.
int holder_main(allocation_mode mode, std::size_t bytes);
/// Section e's reference: a CUDA context and one exportable RMM pool; says
/// "ready CONTEXT_RSS WITH_POOL_RSS".
int context_rss_main();

/// How a consumer of section f gets the producer's bytes.
enum class share_method { rmmd, rmmd_grpc, cuda_ipc, host_copy };
std::string method_name(share_method m);
std::optional<share_method> parse_method(std::string const& s);

/// Section f's rmmd producer: creates NAME (BYTES) in GPU 0's pool, writes
/// and publishes it; says "ready CREATE_NS WRITE_AND_PUBLISH_NS", closes it
/// when its stdin closes.
int share_producer_main(std::string const& name, std::size_t bytes);
/// Section f's legacy producer: cudaMalloc, write, cudaIpcGetMemHandle; says
/// "ready HANDLE_HEX", frees it when its stdin closes.
int ipc_producer_main(std::size_t bytes);
/// Section f's consumer: on "go", WARMUP + REPS open/read/close cycles (up
/// to SECONDS once one is measured); then "samples KIND NS...", "first NS"
/// and "done MEASURED". ARG: the buffer's name (rmmd), the handle in hex
/// (cuda_ipc), "-" (host_copy).
int share_consumer_main(share_method method,
                        std::size_t bytes,
                        std::size_t reps,
                        std::size_t warmup,
                        double seconds,
                        std::string const& arg);

}  // namespace rmmd::bench
