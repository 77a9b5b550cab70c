#pragma once

// What sections a to f of rmmd_bench share: the run's counts (`config`), the
// run's state (`run_state`: its results, its targets, its errors), CUDA checks,
// the kinds of client the sections start, and the line protocol between the
// bench and the helper processes it starts (the bench itself, given a helper
// name: helper_mains.cpp). Everything here runs in one thread of the bench or
// of one helper; nothing is shared between threads.

#include "bench/bench_session.hpp"
#include "bench/bench_support.hpp"

#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/session.hpp>

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::bench {

/// Every allocation the sections time asks for this alignment.
constexpr std::size_t alignment = 256;
/// Section a's and b's sizes.
constexpr std::array<std::size_t, 4> pair_sizes{
    256, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{64} << 20};

/// Throws bench_error naming `call` and where, unless `e` is cudaSuccess.
void check_cuda(cudaError_t e, char const* call, char const* file, int line);
#define BENCH_CUDA(call) ::rmmd::bench::check_cuda((call), #call, __FILE__, __LINE__)

std::string format(char const* fmt, ...) __attribute__((format(printf, 1, 2)));
/// 256 -> "256 B", 65536 -> "64 KiB", 4 << 30 -> "4 GiB".
std::string size_name(std::size_t bytes);
double ns_between(steady::time_point a, steady::time_point b);
double seconds_between(steady::time_point a, steady::time_point b);

/// One section run alone where there is no GPU (`--sections h`, `--sections
/// t`): a run of rmmd_bench with that section's host figures, which
/// `measure` writes into the run and whose targets it returns, printed under
/// `title` and written to `out_path`. Returns the exit status (0: the
/// section ran; 1: it or the write failed).
int run_section_without_gpu(std::string const& section,
                            std::string const& title,
                            bool quick,
                            std::string const& out_path,
                            std::string const& command,
                            std::function<std::vector<target_row>(results::Run&)> const& measure);

/// How a bench client allocates: its resource's mode, and how Allocate and
/// Free reach the daemon.
struct client_kind {
  allocation_mode mode{};
  call_transport transport{call_transport::session_socket};
};

constexpr client_kind fast_client{allocation_mode::slab};
constexpr client_kind direct_client{allocation_mode::direct};
constexpr client_kind direct_grpc_client{allocation_mode::direct, call_transport::grpc};

/// "fast", "direct" or "direct-grpc": in the tables, the JSON and helper argv.
std::string kind_name(client_kind k);
std::optional<client_kind> parse_kind(std::string const& s);
std::string mode_name(allocation_mode m);

ipc_memory_resource make_ipc_resource(session s, allocation_mode mode);
rmmd::session open_session(std::string name,
                           call_transport transport = call_transport::session_socket);

std::uint64_t pool_in_use(v1::Stats const& stats, std::uint32_t pool_id);
std::uint64_t pool_allocations(v1::Stats const& stats, std::uint32_t pool_id);

/// A non-blocking stream of the bench's own, synchronised and destroyed with it.
class stream_holder {
 public:
  stream_holder();
  stream_holder(stream_holder const&)            = delete;
  stream_holder& operator=(stream_holder const&) = delete;
  ~stream_holder();
  [[nodiscard]] cudaStream_t get() const noexcept
  {
    return stream_;
  }

 private:
  cudaStream_t stream_{};
};

/// The run's results document, the targets measured and the errors met.
struct run_state {
  results::Run doc;
  std::vector<target_row> targets;
  std::vector<std::string> errors;

  /// Records `t` and returns "pass" or "MISS", for the tables.
  std::string check(target_row t);
  /// Records and prints an error of `section`; the run goes on.
  void error(std::string const& section, std::string const& what);
};

/// `t` as the results' Target ("<= 1.5 x", pass).
results::Target target_result(target_row const& t);

/// A count the bench chose, for a uint32 field of the results (they hold no
/// 64-bit integers: proto3's JSON mapping writes those as strings).
std::uint32_t u32(std::size_t n);

/// The counts of a run: a full one, or `--quick`'s smoke run.
struct config {
  bool quick{};
  std::size_t pairs{2000};
  std::size_t pairs_direct_64mib{200};
  std::size_t warmup{200};
  std::chrono::seconds cell_budget{10};
  std::size_t step_reps{500};
  std::size_t step_reps_64mib{100};
  std::size_t rpc_reps{2000};
  double worker_seconds{2.0};
  std::size_t worker_bytes{256};
  std::vector<int> process_counts{1, 2, 4, 8, 16};
  std::size_t setup_sessions{50};
  std::size_t kill_trials{10};
  std::size_t kill_hold_bytes{std::size_t{256} << 20};
  std::size_t leases{10000};
  // The daemon's pools' and b2's cudaMemPoolAttrReleaseThreshold (0: rmmd's default).
  std::uint64_t release_threshold{0};
  // f) named shared buffers
  std::vector<std::size_t> share_sizes{std::size_t{64} << 20, std::size_t{4} << 30};
  std::vector<int> share_consumers{1, 8};
  std::size_t share_reps{200};
  std::size_t share_copy_reps{20};
  std::size_t share_warmup{5};

  static config make(bool quick);
};

/// `name` as a file name: lowercase letters and digits, runs of others as one '-'.
std::string gpu_slug(std::string const& name);
/// The GPU count, or 0 with the reason in `why`.
int visible_gpus(std::string& why);
/// The NVIDIA driver's version, from /proc/driver/nvidia/version.
std::string driver_version();
/// GPU 0 for the results; its name also in `name_out`.
results::Gpu gpu_result(std::string& name_out);

// ----------------------------------------------------- helper processes

/// The helpers' environment: RMMD_BENCH_PARENT, checked by die_with_parent().
std::vector<std::string> self_env();
/// This binary, as the helpers are started.
std::string self_path();

/// In a helper: die with the bench (and refuse to run if the bench is already gone).
void die_with_parent();
/// In a helper: true once a line arrives on stdin; false at EOF or the deadline.
bool wait_for_stdin_line(std::chrono::milliseconds timeout);
/// In a helper: returns when stdin closes (the bench is done with it).
void wait_for_stdin_eof();
/// In a helper: writes `line` and a newline to stdout, flushed.
void say(std::string const& line);
/// In a helper: says "error WHAT" (on one line) and returns 1, the exit status.
int helper_failed(std::exception const& e);

/// In the bench: reads lines from `p` until one of the helper protocol's
/// (ready, done, holding, error, samples, first: anything else a library
/// printed is skipped); throws naming `who` and `want` at EOF or the deadline.
std::string next_protocol_line(child_process& p,
                               std::string const& who,
                               std::string const& want,
                               steady::time_point deadline);
/// The next protocol line of `p`; throws naming `who` unless it starts with `want`.
std::string expect_line(child_process& p,
                        std::string const& who,
                        std::string const& want,
                        steady::time_point deadline);

}  // namespace rmmd::bench
