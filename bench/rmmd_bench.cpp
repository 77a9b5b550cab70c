// rmmd_bench: rmmd against in-process RMM on one GPU, in one run (issues 5
// and 12).
//
//   rmmd_bench --rmmd PATH_TO_rmmd --out FILE.json [--quick] [--sections a,a8,b,b2,c,c2,d,e,f,g,h]
//              [--a8-threads 1,8] [--a8-rounds N]
//
// Starts its own rmmd (temporary runtime directory, --backend=cuda), measures
// sections a) to h) (bench/README.md says what each one is), prints a table
// per section with the targets beside the figures, and writes every
// figure to FILE.json. Exit status: 0 when every section ran (a missed target
// is a result, not a failure), 1 when a section failed (the JSON says which
// and why), 2 when there is no GPU or the command line is wrong, 3 when the
// whole run passed --max-seconds.
//
// The same binary is its own helper process (started with posix_spawn, never
// a plain fork after CUDA started):
//   rmmd_bench --exporter                      section b's exporter (socket on fd 3)
//   rmmd_bench --worker MODE SIZE SECONDS [DEVICE]
//                                              section c's (and c2's) client processes
//   rmmd_bench --holder MODE BYTES             section d's process to SIGKILL
//   rmmd_bench --gpu-slug                      prints the GPU's name as a file name
//   rmmd_bench --context-rss                   section e's reference: a CUDA context and
//                                              one exportable RMM pool, nothing else
//   rmmd_bench --share-producer NAME BYTES     section f's rmmd producer
//   rmmd_bench --ipc-producer BYTES            section f's cudaIpcGetMemHandle producer
//   rmmd_bench --share-consumer METHOD BYTES REPS WARMUP SECONDS ARG
//                                              section f's consumer processes
//   rmmd_bench --mobility-worker SLAB_BYTES    section g's slab clients (section_g.cpp)
//   rmmd_bench --raw-leases / --raw-sessions   section h's (section_h.hpp)
//
// Without a GPU, `--sections h` runs section h's host figures alone.

#include "bench/bench_session.hpp"
#include "bench/bench_support.hpp"
#include "bench/section_a8.hpp"
#include "bench/section_g.hpp"
#include "bench/section_h.hpp"

#include "client/detail/session_impl.hpp"
#include "tools/socket/fd_passing.hpp"

#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <cuda_runtime_api.h>
#include <CLI/CLI.hpp>
#include <cuda/stream>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace rmmd::bench {
namespace {

ipc_memory_resource make_ipc_resource(session s, allocation_mode mode)
{
  ipc_resource_options options;
  options.mode = mode;
  return ipc_memory_resource(std::move(s), options);
}

constexpr std::size_t alignment = 256;
constexpr std::array<std::size_t, 4> pair_sizes{
    256, std::size_t{64} << 10, std::size_t{1} << 20, std::size_t{64} << 20};

// The targets.
constexpr double fast_ratio_target       = 1.5;  // x cuda_async p50, 256 B to 1 MiB
constexpr double direct_steps_target     = 1.3;  // x the sum of the bare steps
constexpr double fast_aggregate_target   = 5e6;  // pairs/s, 16 processes
constexpr double direct_aggregate_target = 5e4;
constexpr double direct_over_b2_target   = 0.75;  // issue 14: 16 direct processes / b2, 1 thread
constexpr double setup_target_ms         = 2.0;
constexpr double reclaim_target_ms       = 50.0;
constexpr double rss_target_bytes        = 64.0 * 1024 * 1024;

// ---------------------------------------------------------------- helpers

void check_cuda(cudaError_t e, char const* call, char const* file, int line)
{
  if (e != cudaSuccess) {
    throw bench_error(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" +
                      cudaGetErrorString(e) + ") at " + file + ":" + std::to_string(line));
  }
}
#define BENCH_CUDA(call) check_cuda((call), #call, __FILE__, __LINE__)

std::string format(char const* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(char const* fmt, ...)
{
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  return buf;
}

std::string size_name(std::size_t bytes)
{
  if (bytes >= (std::size_t{1} << 30) && bytes % (std::size_t{1} << 30) == 0) {
    return std::to_string(bytes >> 30) + " GiB";
  }
  if (bytes >= (std::size_t{1} << 20) && bytes % (std::size_t{1} << 20) == 0) {
    return std::to_string(bytes >> 20) + " MiB";
  }
  if (bytes >= 1024 && bytes % 1024 == 0) { return std::to_string(bytes >> 10) + " KiB"; }
  return std::to_string(bytes) + " B";
}

double ns_between(steady::time_point a, steady::time_point b)
{
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

double seconds_between(steady::time_point a, steady::time_point b)
{
  return std::chrono::duration<double>(b - a).count();
}

/// How a bench client allocates: its resource's mode, and how Allocate and
/// Free reach the daemon.
struct client_kind {
  allocation_mode mode{};
  call_transport transport{call_transport::session_socket};
};

constexpr client_kind fast_client{allocation_mode::slab};
constexpr client_kind direct_client{allocation_mode::direct};
constexpr client_kind direct_grpc_client{allocation_mode::direct, call_transport::grpc};

std::string kind_name(client_kind k)
{
  if (k.mode == allocation_mode::slab) { return "fast"; }
  return k.transport == call_transport::grpc ? "direct-grpc" : "direct";
}

std::optional<client_kind> parse_kind(std::string const& s)
{
  for (auto k : {fast_client, direct_client, direct_grpc_client}) {
    if (s == kind_name(k)) { return k; }
  }
  return std::nullopt;
}

std::string mode_name(allocation_mode m)
{
  return kind_name(client_kind{m});
}

rmmd::session open_session(std::string name,
                           call_transport transport = call_transport::session_socket)
{
  return rmmd::session(
      rmmd::session::options{.client_name = std::move(name), .lease_calls = transport});
}

/// Makes a child helper die with the bench (and refuse to run if the bench
/// is already gone).
void die_with_parent()
{
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (char const* p = std::getenv("RMMD_BENCH_PARENT"); p != nullptr) {
    if (std::to_string(::getppid()) != p) { std::_Exit(4); }
  }
}

/// True once a line arrives on stdin; false at EOF or the deadline.
bool wait_for_stdin_line(std::chrono::milliseconds timeout)
{
  auto const deadline = steady::now() + timeout;
  std::string got;
  while (steady::now() < deadline) {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
    int rc    = ::poll(&p, 1, static_cast<int>(std::max<long>(1, left.count())));
    if (rc < 0 && errno == EINTR) { continue; }
    if (rc <= 0) { return false; }
    char c;
    auto n = ::read(STDIN_FILENO, &c, 1);
    if (n <= 0) { return false; }
    if (c == '\n') { return true; }
  }
  return false;
}

void say(std::string const& line)
{
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

std::uint64_t pool_in_use(v1::Stats const& stats, std::uint32_t pool_id)
{
  for (auto const& p : stats.pools()) {
    if (p.pool().id() == pool_id) { return p.in_use_bytes(); }
  }
  throw bench_error("GetStats has no pool " + std::to_string(pool_id));
}

std::uint64_t pool_allocations(v1::Stats const& stats, std::uint32_t pool_id)
{
  for (auto const& p : stats.pools()) {
    if (p.pool().id() == pool_id) { return p.allocation_count(); }
  }
  throw bench_error("GetStats has no pool " + std::to_string(pool_id));
}

/// A stream of the bench's own, destroyed with it.
class stream_holder {
 public:
  stream_holder()
  {
    BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  stream_holder(stream_holder const&)            = delete;
  stream_holder& operator=(stream_holder const&) = delete;
  ~stream_holder()
  {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  [[nodiscard]] cudaStream_t get() const noexcept
  {
    return stream_;
  }

 private:
  cudaStream_t stream_{};
};

// ---------------------------------------------------------------- results

/// One target of the issue, as measured.
struct run_state {
  results::Run doc;
  std::vector<target_row> targets;
  std::vector<std::string> errors;

  /// Records `t` and returns "pass"/"MISS" with the limit, for the tables.
  std::string check(target_row t)
  {
    targets.push_back(t);
    return t.pass() ? "pass" : "MISS";
  }
  void error(std::string const& section, std::string const& what)
  {
    errors.push_back(section + ": " + what);
    std::printf("  ERROR (%s): %s\n", section.c_str(), what.c_str());
    std::fflush(stdout);
  }
};

results::Target target_result(target_row const& t)
{
  results::Target out;
  out.set_target(std::string(t.at_most ? "<= " : ">= ") + format("%g", t.limit) + " " + t.unit);
  out.set_pass(t.pass());
  return out;
}

/// A count the bench chose, for a uint32 field of the results (they hold no
/// 64-bit integers: proto3's JSON mapping writes those as strings).
std::uint32_t u32(std::size_t n)
{
  if (n > std::numeric_limits<std::uint32_t>::max()) {
    throw bench_error(std::to_string(n) + " does not fit the results' 32-bit count");
  }
  return static_cast<std::uint32_t>(n);
}

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

  static config make(bool quick)
  {
    config c;
    c.quick = quick;
    if (quick) {
      c.pairs              = 300;
      c.pairs_direct_64mib = 30;
      c.warmup             = 20;
      c.cell_budget        = std::chrono::seconds(3);
      c.step_reps          = 100;
      c.step_reps_64mib    = 20;
      c.rpc_reps           = 300;
      c.worker_seconds     = 0.5;
      c.setup_sessions     = 10;
      c.kill_trials        = 3;
      c.share_reps         = 30;
      c.share_copy_reps    = 3;
      c.share_warmup       = 2;
    }
    return c;
  }
};

// ------------------------------------------- a) allocate+deallocate pairs

struct pair_cell {
  summary latency;
  double pairs_per_s{};
  bool cut_short{};  // the cell's time budget ended it
};

template <typename Resource>
pair_cell measure_pairs(Resource& mr,
                        cudaStream_t stream,
                        std::size_t bytes,
                        std::size_t warmup,
                        std::size_t pairs,
                        steady::duration budget)
{
  cuda::stream_ref s{stream};
  auto const deadline = steady::now() + budget;
  for (std::size_t i = 0; i < warmup && steady::now() < deadline; ++i) {
    void* p = mr.allocate(s, bytes, alignment);
    mr.deallocate(s, p, bytes, alignment);
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ns;
  ns.reserve(pairs);
  auto const start = steady::now();
  auto const stop  = start + budget;
  auto last        = start;
  for (std::size_t i = 0; i < pairs; ++i) {
    auto t0 = steady::now();
    void* p = mr.allocate(s, bytes, alignment);
    mr.deallocate(s, p, bytes, alignment);
    last = steady::now();
    ns.push_back(ns_between(t0, last));
    if (last >= stop) { break; }
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  BENCH_CUDA(cudaGetLastError());
  pair_cell cell;
  cell.cut_short   = ns.size() < pairs;
  cell.latency     = summarize(ns);
  cell.pairs_per_s = static_cast<double>(ns.size()) / seconds_between(start, last);
  return cell;
}

struct pair_kind {
  std::string key;    // in the JSON
  std::string label;  // in the table
};

/// Returns the p50 (us) of every cell measured, by resource key and size.
std::map<std::pair<std::string, std::size_t>, double> section_pairs(
    config const& cfg,
    rmmd::session const& session,
    rmmd::session const& grpc_session,
    run_state& st)
{
  std::map<std::pair<std::string, std::size_t>, double> p50;
  std::printf(
      "\na) allocate+deallocate pairs: same stream, no sync per pair; latency per pair "
      "(steady_clock)\n");
  std::printf("%-22s %7s %6s %9s %9s %12s %8s  %s\n",
              "resource",
              "size",
              "pairs",
              "p50 us",
              "p99 us",
              "pairs/s",
              "x base",
              "target");
  stream_holder stream;
  std::map<std::size_t, double> baseline_p50;

  auto run_kind = [&](pair_kind const& kind, auto make) {
    try {
      auto mr = make();
      for (auto bytes : pair_sizes) {
        results::PairCell row;
        row.set_resource(kind.key);
        row.set_size_bytes(u32(bytes));
        try {
          auto n    = (kind.key.rfind("rmmd_direct", 0) == 0 && bytes >= (std::size_t{64} << 20))
                          ? cfg.pairs_direct_64mib
                          : cfg.pairs;
          auto cell = measure_pairs(mr, stream.get(), bytes, cfg.warmup, n, cfg.cell_budget);
          p50[{kind.key, bytes}] = cell.latency.p50_us;
          if (kind.key == "cuda_async") { baseline_p50[bytes] = cell.latency.p50_us; }
          std::optional<double> ratio;
          if (auto b = baseline_p50.find(bytes); b != baseline_p50.end() && b->second > 0) {
            ratio = cell.latency.p50_us / b->second;
          }
          std::string verdict;
          if (kind.key == "rmmd_fast" && bytes <= (std::size_t{1} << 20) && ratio) {
            target_row t{"fast p50 / cuda_async p50 at " + size_name(bytes),
                         *ratio,
                         true,
                         fast_ratio_target,
                         "x"};
            verdict               = format("<= %.1fx %s", fast_ratio_target, st.check(t).c_str());
            *row.mutable_target() = target_result(t);
          }
          row.set_pairs(u32(cell.latency.count));
          row.set_cut_short_by_budget(cell.cut_short);
          row.set_p50_us(cell.latency.p50_us);
          row.set_p99_us(cell.latency.p99_us);
          row.set_mean_us(cell.latency.mean_us);
          row.set_min_us(cell.latency.min_us);
          row.set_max_us(cell.latency.max_us);
          row.set_pairs_per_s(cell.pairs_per_s);
          if (ratio) { row.set_ratio_to_baseline_p50(*ratio); }
          std::printf("%-22s %7s %6zu %9.2f %9.2f %12.0f %8s  %s%s\n",
                      kind.label.c_str(),
                      size_name(bytes).c_str(),
                      cell.latency.count,
                      cell.latency.p50_us,
                      cell.latency.p99_us,
                      cell.pairs_per_s,
                      ratio ? format("%.2f", *ratio).c_str() : "-",
                      verdict.c_str(),
                      cell.cut_short ? " (cut short by the time budget)" : "");
        } catch (std::exception const& e) {
          row.set_error(e.what());
          st.error("a " + kind.key + " " + size_name(bytes), e.what());
        }
        std::fflush(stdout);
        *st.doc.add_pairs() = std::move(row);
      }
    } catch (std::exception const& e) {
      // No resource, no cell: each size gets a row that says why.
      for (auto bytes : pair_sizes) {
        auto& row = *st.doc.add_pairs();
        row.set_resource(kind.key);
        row.set_size_bytes(u32(bytes));
        row.set_error(e.what());
      }
      st.error("a " + kind.key, e.what());
    }
  };

  run_kind({"cuda_async", "cuda_async (baseline)"},
           [] { return rmm::mr::cuda_async_memory_resource{}; });
  run_kind({"rmmd_direct", "rmmd direct"},
           [&] { return make_ipc_resource(session, allocation_mode::direct); });
  run_kind({"rmmd_direct_grpc", "rmmd direct (gRPC)"},
           [&] { return make_ipc_resource(grpc_session, allocation_mode::direct); });
  run_kind({"rmmd_fast", "rmmd fast (slab)"},
           [&] { return make_ipc_resource(session, allocation_mode::slab); });
  run_kind({"rmm_pool", "pool over cuda_async"}, [] {
    rmm::mr::cuda_async_memory_resource upstream{};
    return rmm::mr::pool_memory_resource(upstream, std::size_t{256} << 20);
  });
  return p50;
}

// ------------------------------------------- b) the direct path's bare steps

// Section b's exporter, in its own process: a posix-fd cudaMemPool (what the
// daemon's pool is), exported once over the socket on fd 3; then, per
// request, allocate + sync (untimed), time cudaMemPoolExportPointer, send the
// export data; free on the next request.
struct exporter_request {
  std::uint32_t op{};  // 0 quit, 1 allocate and export, 2 free the last one
  std::uint64_t bytes{};
};
struct exporter_reply {
  std::int32_t cuda_error{};
  std::int64_t export_ns{};
  cudaMemPoolPtrExportData data{};
  char message[200]{};
};
constexpr int exporter_fd = 3;

bool send_reply(int fd, exporter_reply const& r, int pass_fd = -1)
{
  auto const fds = pass_fd >= 0 ? std::span<int const>(&pass_fd, 1) : std::span<int const>();
  return fd_passing::send_datagram(fd, {reinterpret_cast<char const*>(&r), sizeof(r)}, fds) ==
         static_cast<ssize_t>(sizeof(r));
}

/// Receives one fixed-size message (and an fd, if one came); false at EOF,
/// on error, or at the deadline.
template <typename T>
bool receive(int fd, T& out, std::chrono::milliseconds timeout, int* got_fd = nullptr)
{
  pollfd p{fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (rc < 0 && errno == EINTR);
  if (rc <= 0) { return false; }
  std::array<int, 1> fds{-1};
  auto const got =
      fd_passing::receive_datagram(fd, {reinterpret_cast<char*>(&out), sizeof(out)}, fds);
  bool const whole = got.bytes == static_cast<ssize_t>(sizeof(out)) && !got.truncated;
  if (whole && got.fd_count == 1 && got_fd != nullptr) {
    *got_fd = fds[0];
  } else {
    fd_passing::close_fds(fds, got.fd_count);
  }
  return whole;
}

/// A posix-fd exportable pool on GPU 0 with `release_threshold` (0, as rmmd's
/// pools are by default, unless --cuda-release-threshold says otherwise).
cudaError_t make_exportable_pool(cudaMemPool_t* pool, std::uint64_t release_threshold = 0)
{
  cudaMemPoolProps props{};
  props.allocType     = cudaMemAllocationTypePinned;
  props.handleTypes   = cudaMemHandleTypePosixFileDescriptor;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id   = 0;
  if (auto e = cudaMemPoolCreate(pool, &props); e != cudaSuccess) { return e; }
  return cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold, &release_threshold);
}

int exporter_main()
{
  die_with_parent();
  int const fd = exporter_fd;
  exporter_reply reply;
  auto fail = [&](char const* what, cudaError_t e) {
    reply.cuda_error = e;
    std::snprintf(
        reply.message, sizeof(reply.message), "exporter: %s failed: %s", what, cudaGetErrorName(e));
    send_reply(fd, reply);
    return 1;
  };
  if (auto e = cudaSetDevice(0); e != cudaSuccess) { return fail("cudaSetDevice(0)", e); }
  cudaMemPool_t pool{};
  if (auto e = make_exportable_pool(&pool); e != cudaSuccess) {
    return fail("creating an exportable pool", e);
  }
  int pool_fd = -1;
  if (auto e = cudaMemPoolExportToShareableHandle(
          &pool_fd, pool, cudaMemHandleTypePosixFileDescriptor, 0);
      e != cudaSuccess) {
    return fail("cudaMemPoolExportToShareableHandle", e);
  }
  cudaStream_t stream{};
  if (auto e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return fail("cudaStreamCreate", e);
  }
  if (!send_reply(fd, reply, pool_fd)) { return 1; }
  ::close(pool_fd);

  void* ptr = nullptr;
  exporter_request req;
  while (receive(fd, req, std::chrono::milliseconds(120'000)) && req.op != 0) {
    reply = exporter_reply{};
    if (req.op == 1) {
      if (auto e = cudaMallocFromPoolAsync(&ptr, req.bytes, pool, stream); e != cudaSuccess) {
        return fail("cudaMallocFromPoolAsync", e);
      }
      if (auto e = cudaStreamSynchronize(stream); e != cudaSuccess) {
        return fail("cudaStreamSynchronize", e);
      }
      auto t0 = steady::now();
      auto e  = cudaMemPoolExportPointer(&reply.data, ptr);
      auto t1 = steady::now();
      if (e != cudaSuccess) { return fail("cudaMemPoolExportPointer", e); }
      reply.export_ns = static_cast<std::int64_t>(ns_between(t0, t1));
    } else if (req.op == 2) {
      if (auto e = cudaFreeAsync(ptr, stream); e != cudaSuccess) {
        return fail("cudaFreeAsync", e);
      }
      if (auto e = cudaStreamSynchronize(stream); e != cudaSuccess) {
        return fail("cudaStreamSynchronize", e);
      }
      ptr = nullptr;
    }
    if (!send_reply(fd, reply)) { return 1; }
  }
  if (ptr != nullptr) { cudaFreeAsync(ptr, stream); }
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  cudaMemPoolDestroy(pool);
  return 0;
}

std::vector<std::string> self_env()
{
  return {"RMMD_BENCH_PARENT=" + std::to_string(::getpid())};
}

std::string self_path()
{
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

void steps_against_exporter(config const& cfg,
                            summary const& rpc,
                            std::map<std::pair<std::string, std::size_t>, double> const& pair_p50,
                            results::DirectSteps& out,
                            run_state& st);

void section_steps(config const& cfg,
                   rmmd::session const& session,
                   std::map<std::pair<std::string, std::size_t>, double> const& pair_p50,
                   run_state& st)
{
  std::printf(
      "\nb) the direct path against its bare steps (p50 us): export in an exporter process, "
      "import + free (cudaFreeAsync + stream sync) here, one round trip on the session socket "
      "(Ping, the transport the direct path uses)\n");
  results::DirectSteps out;

  auto round_trips = [&](auto&& call) {
    std::vector<double> ns;
    for (std::size_t i = 0; i < cfg.rpc_reps + 50; ++i) {
      auto t0 = steady::now();
      call();
      auto t1 = steady::now();
      if (i >= 50) { ns.push_back(ns_between(t0, t1)); }
    }
    return summarize(ns);
  };
  auto rpc             = round_trips([&] {
    if (auto st = session.impl().ping(); !st.ok()) {
      throw bench_error("Ping on the session socket failed: " + st.error_message());
    }
  });
  auto set_round_trips = [](results::RoundTrips& r, summary const& s) {
    r.set_count(u32(s.count));
    r.set_p50_us(s.p50_us);
    r.set_p99_us(s.p99_us);
  };
  set_round_trips(*out.mutable_rpc_session_ping(), rpc);
  // For reference: a gRPC round trip, what each call of the gRPC transport pays.
  auto grpc_rpc = round_trips([&] { (void)get_stats(session); });
  set_round_trips(*out.mutable_rpc_grpc_getstats(), grpc_rpc);
  std::printf(
      "  one round trip: session socket (Ping) p50 %.2f us, p99 %.2f us; gRPC (GetStats) "
      "p50 %.2f us, p99 %.2f us\n",
      rpc.p50_us,
      rpc.p99_us,
      grpc_rpc.p50_us,
      grpc_rpc.p99_us);
  try {
    steps_against_exporter(cfg, rpc, pair_p50, out, st);
  } catch (std::exception const& e) {
    out.set_error(e.what());
    *st.doc.mutable_direct_steps() = std::move(out);
    throw;
  }
  *st.doc.mutable_direct_steps() = std::move(out);
}

void steps_against_exporter(config const& cfg,
                            summary const& rpc,
                            std::map<std::pair<std::string, std::size_t>, double> const& pair_p50,
                            results::DirectSteps& out,
                            run_state& st)
{
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    throw bench_error(std::string("socketpair: ") + std::strerror(errno));
  }
  struct fd_closer {
    int fd;
    ~fd_closer()
    {
      if (fd >= 0) { ::close(fd); }
    }
  } parent_end{sv[0]}, child_end{sv[1]};
  child_process exporter({self_path(), "--exporter"}, self_env(), {.fds = {{exporter_fd, sv[1]}}});
  ::close(child_end.fd);
  child_end.fd = -1;

  int pool_fd = -1;
  exporter_reply hello;
  if (!receive(parent_end.fd, hello, std::chrono::milliseconds(60'000), &pool_fd)) {
    throw bench_error("the exporter process sent no pool fd within 60 s (exit status " +
                      std::to_string(exporter.finish(1s)) + ")");
  }
  if (hello.cuda_error != 0 || pool_fd < 0) {
    if (pool_fd >= 0) { ::close(pool_fd); }
    throw bench_error(std::string(hello.message[0] ? hello.message : "exporter: no pool fd"));
  }
  cudaMemPool_t imported{};
  auto t_pool0    = steady::now();
  auto import_err = cudaMemPoolImportFromShareableHandle(
      &imported,
      reinterpret_cast<void*>(static_cast<std::uintptr_t>(pool_fd)),
      cudaMemHandleTypePosixFileDescriptor,
      0);
  auto t_pool1 = steady::now();
  ::close(pool_fd);
  BENCH_CUDA(import_err);
  out.set_pool_import_us(ns_between(t_pool0, t_pool1) / 1000.0);
  struct pool_closer {
    cudaMemPool_t p;
    ~pool_closer()
    {
      cudaMemPoolDestroy(p);
    }
  } imported_closer{imported};

  stream_holder stream;
  auto step = [&](exporter_request req, exporter_reply& reply) {
    if (::send(parent_end.fd, &req, sizeof(req), MSG_NOSIGNAL) != sizeof(req)) {
      throw bench_error("the exporter process is gone (send failed)");
    }
    if (!receive(parent_end.fd, reply, std::chrono::milliseconds(20'000))) {
      throw bench_error("the exporter process did not answer within 20 s");
    }
    if (reply.cuda_error != 0) { throw bench_error(reply.message); }
  };

  std::printf("%7s %6s %8s %8s %8s %8s %8s %9s %8s  %s\n",
              "size",
              "steps",
              "export",
              "import",
              "free",
              "rpc",
              "sum",
              "direct",
              "x sum",
              "target");
  bool broken = false;  // after an error the exporter's replies may be out of step: stop
  for (auto bytes : pair_sizes) {
    auto& row = *out.add_sizes();
    row.set_size_bytes(u32(bytes));
    if (broken) {
      row.set_error("skipped after the error above");
      continue;
    }
    try {
      auto reps = bytes >= (std::size_t{64} << 20) ? cfg.step_reps_64mib : cfg.step_reps;
      std::vector<double> export_ns, import_ns, free_ns;
      auto const deadline = steady::now() + cfg.cell_budget;
      for (std::size_t i = 0; i < reps + 20 && steady::now() < deadline; ++i) {
        exporter_reply reply;
        step({1, bytes}, reply);
        void* p = nullptr;
        auto t0 = steady::now();
        BENCH_CUDA(cudaMemPoolImportPointer(&p, imported, &reply.data));
        auto t1 = steady::now();
        BENCH_CUDA(cudaFreeAsync(p, stream.get()));
        BENCH_CUDA(cudaStreamSynchronize(stream.get()));
        auto t2 = steady::now();
        exporter_reply freed;
        step({2, 0}, freed);
        if (i >= 20) {  // the first 20 warm up
          export_ns.push_back(static_cast<double>(reply.export_ns));
          import_ns.push_back(ns_between(t0, t1));
          free_ns.push_back(ns_between(t1, t2));
        }
      }
      auto ex = summarize(export_ns), im = summarize(import_ns), fr = summarize(free_ns);
      double sum = ex.p50_us + im.p50_us + fr.p50_us + rpc.p50_us;
      std::optional<double> direct_p50, ratio;
      if (auto d = pair_p50.find({"rmmd_direct", bytes}); d != pair_p50.end()) {
        direct_p50 = d->second;
        ratio      = d->second / sum;
      }
      std::string verdict = "(no direct figure from a)";
      if (ratio) {
        target_row t{"direct p50 / sum of bare steps at " + size_name(bytes),
                     *ratio,
                     true,
                     direct_steps_target,
                     "x"};
        verdict               = format("<= %.1fx %s", direct_steps_target, st.check(t).c_str());
        *row.mutable_target() = target_result(t);
      }
      std::printf("%7s %6zu %8.2f %8.2f %8.2f %8.2f %8.2f %9s %8s  %s\n",
                  size_name(bytes).c_str(),
                  ex.count,
                  ex.p50_us,
                  im.p50_us,
                  fr.p50_us,
                  rpc.p50_us,
                  sum,
                  direct_p50 ? format("%.2f", *direct_p50).c_str() : "-",
                  ratio ? format("%.2f", *ratio).c_str() : "-",
                  verdict.c_str());
      std::fflush(stdout);
      auto set_latency = [](results::Latency& l, summary const& s) {
        l.set_p50_us(s.p50_us);
        l.set_p99_us(s.p99_us);
      };
      row.set_steps(u32(ex.count));
      set_latency(*row.mutable_export_(), ex);
      set_latency(*row.mutable_import(), im);
      set_latency(*row.mutable_free_sync(), fr);
      row.set_rpc_p50_us(rpc.p50_us);
      row.set_sum_p50_us(sum);
      // A direct pair makes two round trips today (Allocate, Free); the
      // target counts one, as the issue states it.
      row.set_sum_with_two_rpcs_p50_us(sum + rpc.p50_us);
      if (direct_p50) { row.set_direct_p50_us(*direct_p50); }
      if (ratio) { row.set_direct_over_sum(*ratio); }
    } catch (std::exception const& e) {
      row.set_error(e.what());
      st.error("b " + size_name(bytes), e.what());
      broken = true;
    }
  }
  exporter_request quit{0, 0};
  ::send(parent_end.fd, &quit, sizeof(quit), MSG_NOSIGNAL);
  exporter.finish(10s);
}

// ------------------------------------------- c) many client processes at once

// ------------------------- b2) the daemon's CUDA work per direct pair, T threads

// What the daemon does per direct pair, without sockets or the core: from an
// exportable pool, allocate 256 B on the thread's stream, synchronise, export
// the pointer, free. T threads at once, each on a stream of its own, as the
// daemon's call threads do. If the figure does not grow with T, the driver
// serialises these calls, and this rate bounds the direct path's throughput
// however many clients and daemon threads there are.
void section_daemon_side(config const& cfg, run_state& st)
{
  std::printf(
      "\nb2) the daemon's CUDA work per direct pair (allocate 256 B, stream sync, pointer export, "
      "free) in one process, T threads at once for %.1f s\n",
      cfg.worker_seconds / 2);
  std::printf("%7s %12s %12s %14s\n", "threads", "pairs", "pairs/s", "us per pair");
  BENCH_CUDA(cudaSetDevice(0));
  cudaMemPool_t pool{};
  BENCH_CUDA(make_exportable_pool(&pool, cfg.release_threshold));
  struct pool_closer {
    cudaMemPool_t p;
    ~pool_closer()
    {
      cudaMemPoolDestroy(p);
    }
  } closer{pool};
  int pool_fd = -1;  // exporting the pool once makes its pointers exportable
  BENCH_CUDA(
      cudaMemPoolExportToShareableHandle(&pool_fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
  ::close(pool_fd);
  for (int threads : {1, 2, 4, 8}) {
    std::atomic<std::uint64_t> pairs{0};
    std::atomic<bool> failed{false};
    std::atomic<bool> go{false};
    auto const seconds = cfg.worker_seconds / 2;
    std::vector<std::thread> workers;
    steady::time_point start{};
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        if (cudaSetDevice(0) != cudaSuccess) {
          failed = true;
          return;
        }
        stream_holder stream;
        while (!go.load()) { std::this_thread::yield(); }
        auto const stop = start + std::chrono::duration_cast<steady::duration>(
                                      std::chrono::duration<double>(seconds));
        std::uint64_t mine = 0;
        while (steady::now() < stop) {
          void* p = nullptr;
          cudaMemPoolPtrExportData data{};
          if (cudaMallocFromPoolAsync(&p, 256, pool, stream.get()) != cudaSuccess ||
              cudaStreamSynchronize(stream.get()) != cudaSuccess ||
              cudaMemPoolExportPointer(&data, p) != cudaSuccess ||
              cudaFreeAsync(p, stream.get()) != cudaSuccess) {
            failed = true;
            return;
          }
          ++mine;
        }
        pairs += mine;
      });
    }
    start = steady::now();
    go    = true;
    for (auto& w : workers) { w.join(); }
    auto const wall = seconds_between(start, steady::now());
    auto& row       = *st.doc.add_daemon_side_pairs();
    row.set_threads(u32(static_cast<std::size_t>(threads)));
    if (failed) {
      row.set_error("a CUDA call failed");
      st.error("b2 x" + std::to_string(threads), "a CUDA call failed");
    } else {
      auto const rate = static_cast<double>(pairs.load()) / wall;
      row.set_pairs(static_cast<double>(pairs.load()));
      row.set_pairs_per_s(rate);
      std::printf("%7d %12llu %12.0f %14.2f\n",
                  threads,
                  static_cast<unsigned long long>(pairs.load()),
                  rate,
                  1e6 / rate);
    }
    std::fflush(stdout);
  }
}

// A client process of section c: a session and a resource of `mode`, a
// warm-up, "ready"; then, on the line "go" from the bench, pairs of `bytes`
// for `seconds`, and "done PAIRS NANOSECONDS".
int worker_main(client_kind kind, std::size_t bytes, double seconds, int device = 0)
{
  die_with_parent();
  try {
    BENCH_CUDA(cudaSetDevice(device));
    auto s  = open_session("rmmd-bench-worker", kind.transport);
    auto mr = make_ipc_resource(s, kind.mode);
    stream_holder stream;
    cuda::stream_ref ref{stream.get()};
    for (int i = 0; i < 100; ++i) {
      void* p = mr.allocate(ref, bytes, alignment);
      mr.deallocate(ref, p, bytes, alignment);
    }
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    say("ready");
    if (!wait_for_stdin_line(std::chrono::milliseconds(180'000))) { return 3; }
    auto const start = steady::now();
    auto const stop  = start + std::chrono::duration_cast<steady::duration>(
                                  std::chrono::duration<double>(seconds));
    std::uint64_t pairs = 0;
    auto now            = start;
    while (now < stop) {
      for (int i = 0; i < 64; ++i) {
        void* p = mr.allocate(ref, bytes, alignment);
        mr.deallocate(ref, p, bytes, alignment);
      }
      pairs += 64;
      now = steady::now();
    }
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    say(format("done %llu %.0f", static_cast<unsigned long long>(pairs), ns_between(start, now)));
    return 0;
  } catch (std::exception const& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    say("error " + what);
    return 1;
  }
}

/// Reads lines from `p` until one of the helper protocol's (ready, done,
/// holding, error, samples, first: anything else a library printed is
/// skipped); throws naming `who` and `want` at EOF or the deadline.
std::string next_protocol_line(child_process& p,
                               std::string const& who,
                               std::string const& want,
                               steady::time_point deadline)
{
  auto is_protocol = [](std::string const& l) {
    for (char const* w : {"ready", "done ", "holding", "error ", "samples ", "first "}) {
      if (l.rfind(w, 0) == 0) { return true; }
    }
    return false;
  };
  auto line = p.read_line(deadline);
  while (line && !is_protocol(*line)) { line = p.read_line(deadline); }
  if (!line) {
    auto status = p.wait(steady::now());
    throw bench_error(
        who + " (pid " + std::to_string(p.pid()) + ") sent no '" + want + "' line " +
        (status ? "and exited with status " + std::to_string(*status) : "before its deadline"));
  }
  return *line;
}

/// The next protocol line of `p`; throws naming `who` unless it starts with `want`.
std::string expect_line(child_process& p,
                        std::string const& who,
                        std::string const& want,
                        steady::time_point deadline)
{
  auto line = next_protocol_line(p, who, want, deadline);
  if (line.rfind(want, 0) != 0) {
    throw bench_error(who + " (pid " + std::to_string(p.pid()) + ") said: " + line);
  }
  return line;
}

/// Section c; and, with `devices` (c2), 16 direct processes only, worker i
/// on GPU devices[i % size], its row's mode "direct-Ngpu".
void section_processes(config const& cfg,
                       daemon_process& daemon,
                       run_state& st,
                       std::vector<int> const& devices = {})
{
  bool const spread = !devices.empty();
  if (!spread) {
    std::printf(
        "\nc) N client processes at once against the one daemon, %s pairs for %.1f s each\n",
        size_name(cfg.worker_bytes).c_str(),
        cfg.worker_seconds);
  }
  std::printf("%-11s %6s %14s %12s %14s %10s  %s\n",
              "mode",
              "procs",
              "pairs",
              "pairs/s",
              "daemon cpu s",
              "cpu/wall",
              "target (16 procs)");
  auto env = self_env();
  env.push_back("RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string());
  auto const kinds  = spread
                          ? std::vector<client_kind>{direct_client}
                          : std::vector<client_kind>{fast_client, direct_client, direct_grpc_client};
  auto const counts = spread ? std::vector<int>{16} : cfg.process_counts;
  for (auto kind : kinds) {
    for (int n : counts) {
      auto& row = *st.doc.add_processes();
      row.set_mode(kind_name(kind) + (spread ? "-" + std::to_string(devices.size()) + "gpu" : ""));
      row.set_processes(u32(static_cast<std::size_t>(n)));
      row.set_size_bytes(u32(cfg.worker_bytes));
      row.set_seconds_each(cfg.worker_seconds);
      try {
        std::vector<std::unique_ptr<child_process>> workers;
        for (int i = 0; i < n; ++i) {
          workers.push_back(std::make_unique<child_process>(
              std::vector<std::string>{
                  self_path(),
                  "--worker",
                  kind_name(kind),
                  std::to_string(cfg.worker_bytes),
                  format("%g", cfg.worker_seconds),
                  std::to_string(spread ? devices[static_cast<std::size_t>(i) % devices.size()]
                                        : 0)},
              env));
        }
        auto const ready_by = steady::now() + 180s;
        for (int i = 0; i < n; ++i) {
          expect_line(*workers[static_cast<std::size_t>(i)],
                      "worker " + std::to_string(i),
                      "ready",
                      ready_by);
        }
        double cpu0 = cpu_seconds(daemon.pid());
        auto t0     = steady::now();
        for (auto& w : workers) { w->write_line("go"); }
        auto const done_by = steady::now() + std::chrono::seconds(60) +
                             std::chrono::duration_cast<steady::duration>(
                                 std::chrono::duration<double>(cfg.worker_seconds));
        std::uint64_t pairs = 0;
        double aggregate    = 0;
        for (int i = 0; i < n; ++i) {
          auto line            = expect_line(*workers[static_cast<std::size_t>(i)],
                                  "worker " + std::to_string(i),
                                  "done",
                                  done_by);
          unsigned long long p = 0;
          double ns            = 0;
          if (std::sscanf(line.c_str(), "done %llu %lf", &p, &ns) != 2 || ns <= 0) {
            throw bench_error("worker " + std::to_string(i) + " said: " + line);
          }
          pairs += p;
          aggregate += static_cast<double>(p) / (ns / 1e9);
        }
        auto t1     = steady::now();
        double cpu1 = cpu_seconds(daemon.pid());
        for (auto& w : workers) {
          if (w->finish(30s) != 0) {
            throw bench_error("a worker exited with status " + std::to_string(w->finish(0ms)));
          }
        }
        double wall = seconds_between(t0, t1);
        std::string verdict;
        // The gRPC transport is shown for comparison; the target is the default's.
        if (n == 16 && kind.transport == call_transport::session_socket && !spread) {
          bool fast    = kind.mode == allocation_mode::slab;
          double limit = fast ? fast_aggregate_target : direct_aggregate_target;
          target_row t{kind_name(kind) + " aggregate pairs/s, 16 processes",
                       aggregate,
                       false,
                       limit,
                       "pairs/s"};
          verdict               = format(">= %.0f %s", limit, st.check(t).c_str());
          *row.mutable_target() = target_result(t);
          // Issue 14: the direct path at the driver's pace, b2's one thread in this run.
          if (!fast) {
            double b2_rate = 0;
            for (auto const& b2 : st.doc.daemon_side_pairs()) {
              if (b2.threads() == 1 && b2.has_pairs_per_s()) { b2_rate = b2.pairs_per_s(); }
            }
            if (b2_rate > 0) {
              target_row r{"direct aggregate pairs/s, 16 processes / b2 one thread",
                           aggregate / b2_rate,
                           false,
                           direct_over_b2_target,
                           "x b2"};
              verdict += format(
                  "; %.2fx b2 >= %.2f %s", r.measured, direct_over_b2_target, st.check(r).c_str());
              row.set_over_b2_one_thread(r.measured);
              *row.mutable_b2_target() = target_result(r);
            } else {
              verdict += "; no b2 figure in this run (run b2 with c)";
            }
          }
        }
        row.set_pairs(static_cast<double>(pairs));
        row.set_aggregate_pairs_per_s(aggregate);
        row.set_wall_s(wall);
        row.set_daemon_cpu_s(cpu1 - cpu0);
        row.set_daemon_cpu_per_wall((cpu1 - cpu0) / wall);
        std::printf("%-11s %6d %14llu %12.0f %14.3f %10.2f  %s\n",
                    row.mode().c_str(),
                    n,
                    static_cast<unsigned long long>(pairs),
                    aggregate,
                    cpu1 - cpu0,
                    (cpu1 - cpu0) / wall,
                    verdict.c_str());
      } catch (std::exception const& e) {
        row.set_error(e.what());
        st.error(std::string(spread ? "c2 " : "c ") + row.mode() + " x" + std::to_string(n),
                 e.what());
      }
      std::fflush(stdout);
    }
  }
}

// ------------------------------------------- d) session set-up, SIGKILL to memory back

// Section d's victim: holds `bytes` from the daemon (written once), says
// "holding", and waits for stdin to close (the bench SIGKILLs it first).
int holder_main(allocation_mode mode, std::size_t bytes)
{
  die_with_parent();
  try {
    BENCH_CUDA(cudaSetDevice(0));
    rmmd::session s(rmmd::session::options{.client_name = "rmmd-bench-holder"});
    auto mr = make_ipc_resource(s, mode);
    stream_holder stream;
    void* p = mr.allocate(cuda::stream_ref{stream.get()}, bytes, alignment);
    BENCH_CUDA(cudaMemsetAsync(p, 1, bytes, stream.get()));
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    say("holding");
    wait_for_stdin_line(std::chrono::milliseconds(180'000));
    mr.deallocate(cuda::stream_ref{stream.get()}, p, bytes, alignment);
    return 0;
  } catch (std::exception const& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    say("error " + what);
    return 1;
  }
}

void section_setup_and_reclaim(config const& cfg,
                               daemon_process& daemon,
                               rmmd::session const& session,
                               run_state& st)
{
  std::printf("\nd) session set-up (connect, hello, pool import) and SIGKILL to memory back\n");
  auto& out = *st.doc.mutable_setup_and_reclaim();
  try {
    std::vector<double> ns;
    for (std::size_t i = 0; i < cfg.setup_sessions + 2; ++i) {
      std::optional<rmmd::session> s;
      std::optional<rmmd::ipc_memory_resource> mr;
      auto t0 = steady::now();
      s.emplace(rmmd::session::options{.runtime_dir = daemon.runtime_dir(),
                                       .client_name = "rmmd-bench-setup"});
      mr.emplace(make_ipc_resource(*s, allocation_mode::direct));
      auto t1 = steady::now();
      mr.reset();
      s.reset();
      if (i >= 2) { ns.push_back(ns_between(t0, t1)); }
    }
    auto sum = summarize(ns);
    target_row t{"session set-up p50", sum.p50_us / 1000.0, true, setup_target_ms, "ms"};
    auto verdict = st.check(t);
    std::printf(
        "  session + first ipc_memory_resource: p50 %.3f ms, p99 %.3f ms over %zu  "
        "(target <= %.1f ms: %s)\n",
        sum.p50_us / 1000.0,
        sum.p99_us / 1000.0,
        sum.count,
        setup_target_ms,
        verdict.c_str());
    auto& setup = *out.mutable_session_setup();
    setup.set_sessions(u32(sum.count));
    setup.set_p50_ms(sum.p50_us / 1000.0);
    setup.set_p99_ms(sum.p99_us / 1000.0);
    *setup.mutable_target() = target_result(t);
  } catch (std::exception const& e) {
    out.mutable_session_setup()->set_error(e.what());
    st.error("d session set-up", e.what());
  }
  std::fflush(stdout);

  auto const pool_id = session.device_pool(0).id;
  auto env           = self_env();
  env.push_back("RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string());
  for (auto mode : {allocation_mode::direct, allocation_mode::slab}) {
    auto& row = *out.add_sigkill_to_memory_back();
    row.set_mode(mode_name(mode));
    row.set_held_bytes(u32(cfg.kill_hold_bytes));
    try {
      std::vector<double> ns;
      for (std::size_t trial = 0; trial < cfg.kill_trials; ++trial) {
        auto const before = pool_in_use(get_stats(session), pool_id);
        child_process holder(
            {self_path(), "--holder", mode_name(mode), std::to_string(cfg.kill_hold_bytes)}, env);
        expect_line(holder, "holder", "holding", steady::now() + 120s);
        auto const holding = pool_in_use(get_stats(session), pool_id);
        if (holding < before + cfg.kill_hold_bytes) {
          throw bench_error(
              format("the daemon counts %llu bytes in use while the holder holds "
                     "%zu (before: %llu)",
                     static_cast<unsigned long long>(holding),
                     cfg.kill_hold_bytes,
                     static_cast<unsigned long long>(before)));
        }
        auto t0 = steady::now();
        holder.kill(SIGKILL);
        auto const give_up = t0 + 10s;
        bool back          = false;
        auto t1            = t0;
        while (!back && steady::now() < give_up) {
          back = pool_in_use(get_stats(session), pool_id) <= before;
          t1   = steady::now();
          // A poll interval (GetStats itself takes tens of us), not a wait.
          if (!back) { std::this_thread::sleep_for(100us); }
        }
        holder.finish(10s);
        if (!back) { throw bench_error("the memory was not back in the pool 10 s after SIGKILL"); }
        ns.push_back(ns_between(t0, t1));
      }
      auto sum      = summarize(ns);
      double p50_ms = sum.p50_us / 1000.0, max_ms = sum.max_us / 1000.0;
      target_row t{
          mode_name(mode) + " SIGKILL to memory back p50", p50_ms, true, reclaim_target_ms, "ms"};
      auto verdict = st.check(t);
      std::printf(
          "  SIGKILL of a %s client holding %s to memory back: p50 %.2f ms, max %.2f ms "
          "over %zu  (target <= %.0f ms: %s)\n",
          mode_name(mode).c_str(),
          size_name(cfg.kill_hold_bytes).c_str(),
          p50_ms,
          max_ms,
          sum.count,
          reclaim_target_ms,
          verdict.c_str());
      row.set_trials(u32(sum.count));
      row.set_p50_ms(p50_ms);
      row.set_max_ms(max_ms);
      *row.mutable_target() = target_result(t);
    } catch (std::exception const& e) {
      row.set_error(e.what());
      st.error("d reclaim " + mode_name(mode), e.what());
    }
    std::fflush(stdout);
  }
}

// ------------------------------------------- e) the daemon's resident memory

void section_rss(config const& cfg,
                 daemon_process& daemon,
                 rmmd::session const& session,
                 std::uint64_t rss_fresh,
                 run_state& st)
{
  std::printf("\ne) the daemon's resident memory (VmRSS)\n");
  auto& out = *st.doc.mutable_daemon_rss();
  out.set_idle_fresh_bytes(static_cast<double>(rss_fresh));
  auto const rss_idle = rss_bytes(daemon.pid());
  out.set_idle_after_load_bytes(static_cast<double>(rss_idle));
  std::printf("  idle at start %.1f MiB; idle after sections a-d %.1f MiB\n",
              static_cast<double>(rss_fresh) / (1 << 20),
              static_cast<double>(rss_idle) / (1 << 20));
  try {
    // The floor: what a bare process with a CUDA context and one pool holds.
    child_process probe({self_path(), "--context-rss"}, self_env());
    auto const line = expect_line(probe, "the context-RSS probe", "ready", steady::now() + 60s);
    unsigned long long context = 0, with_pool = 0;
    if (std::sscanf(line.c_str(), "ready %llu %llu", &context, &with_pool) != 2) {
      throw bench_error("the context-RSS probe said: " + line);
    }
    probe.finish(5s);
    out.set_cuda_context_process_bytes(static_cast<double>(context));
    out.set_cuda_context_and_pool_process_bytes(static_cast<double>(with_pool));
    std::printf(
        "  for reference, a bare process: CUDA context %.1f MiB, with an RMM pool %.1f MiB\n",
        static_cast<double>(context) / (1 << 20),
        static_cast<double>(with_pool) / (1 << 20));
  } catch (std::exception const& e) {
    out.set_cuda_context_error(e.what());
    st.error("e context", e.what());
  }
  auto mr      = make_ipc_resource(session, allocation_mode::direct);
  auto pool_id = session.device_pool(0).id;
  stream_holder stream;
  cuda::stream_ref ref{stream.get()};
  std::vector<void*> held;
  held.reserve(cfg.leases);
  auto release_all = [&] {
    for (auto* p : held) { mr.deallocate(ref, p, 256, alignment); }
    held.clear();
    cudaStreamSynchronize(stream.get());
  };
  try {
    auto const deadline = steady::now() + 120s;
    auto t0             = steady::now();
    while (held.size() < cfg.leases && steady::now() < deadline) {
      held.push_back(mr.allocate(ref, 256, alignment));
    }
    auto t1 = steady::now();
    if (held.size() < cfg.leases) {
      throw bench_error(format("only %zu of %zu leases made in 120 s", held.size(), cfg.leases));
    }
    auto const live = pool_allocations(get_stats(session), pool_id);
    auto const rss  = rss_bytes(daemon.pid());
    target_row t{"daemon RSS with " + std::to_string(cfg.leases) + " leases",
                 static_cast<double>(rss) / (1 << 20),
                 true,
                 rss_target_bytes / (1 << 20),
                 "MiB"};
    auto verdict = st.check(t);
    std::printf(
        "  with %zu live leases (daemon counts %llu, made in %.2f s): %.1f MiB  "
        "(target <= %.0f MiB: %s)\n",
        held.size(),
        static_cast<unsigned long long>(live),
        seconds_between(t0, t1),
        static_cast<double>(rss) / (1 << 20),
        rss_target_bytes / (1 << 20),
        verdict.c_str());
    out.set_leases(u32(held.size()));
    out.set_daemon_live_allocations(static_cast<double>(live));
    out.set_with_leases_bytes(static_cast<double>(rss));
    out.set_per_lease_bytes((static_cast<double>(rss) - static_cast<double>(rss_idle)) /
                            static_cast<double>(held.size()));
    *out.mutable_target() = target_result(t);
    release_all();
    out.set_after_free_bytes(static_cast<double>(rss_bytes(daemon.pid())));
  } catch (std::exception const& e) {
    release_all();
    out.set_error(e.what());
    st.error("e", e.what());
  }
  std::fflush(stdout);
}

// ------------------------------------------- f) named shared buffers (issue 12)

// A producer process creates and writes one buffer; consumer processes time
// the cycle every consumer's start-up pays: open it (to a pointer they can
// use), read from it, close it. Against the same consumers without rmmd:
// legacy CUDA IPC of the producer's cudaMalloc buffer, and a copy of the
// bytes from a pinned host copy into an allocation of their own.

constexpr double share_open_target_ms = 1.0;    // open p50, every size
constexpr double share_speedup_target = 100.0;  // x the host copy's p50, at 4 GiB
constexpr unsigned char share_fill    = 0x5a;   // what the producers write
constexpr std::uint64_t share_word    = 0x5a5a5a5a5a5a5a5aULL;

/// How a consumer of section f gets the producer's bytes.
enum class share_method { rmmd, rmmd_grpc, cuda_ipc, host_copy };

std::string method_name(share_method m)
{
  switch (m) {
    case share_method::rmmd:
      return "rmmd";
    case share_method::rmmd_grpc:
      return "rmmd_grpc";
    case share_method::cuda_ipc:
      return "cuda_ipc";
    case share_method::host_copy:
      return "host_copy";
  }
  return "?";
}

std::optional<share_method> parse_method(std::string const& s)
{
  for (auto m : {share_method::rmmd,
                 share_method::rmmd_grpc,
                 share_method::cuda_ipc,
                 share_method::host_copy}) {
    if (s == method_name(m)) { return m; }
  }
  return std::nullopt;
}

std::string to_hex(void const* data, std::size_t n)
{
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    auto const b = static_cast<unsigned char const*>(data)[i];
    out += digits[b >> 4];
    out += digits[b & 0xf];
  }
  return out;
}

bool from_hex(std::string const& text, void* out, std::size_t n)
{
  if (text.size() != 2 * n) { return false; }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') { return c - '0'; }
    if (c >= 'a' && c <= 'f') { return c - 'a' + 10; }
    return -1;
  };
  for (std::size_t i = 0; i < n; ++i) {
    int const hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) { return false; }
    static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

/// Returns when stdin closes (the bench is done with this helper).
void wait_for_stdin_eof()
{
  char buf[256];
  while (true) {
    auto n = ::read(STDIN_FILENO, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno != EINTR)) { return; }
  }
}

int helper_failed(std::exception const& e)
{
  std::string what = e.what();
  std::replace(what.begin(), what.end(), '\n', ' ');
  say("error " + what);
  return 1;
}

/// Section f's rmmd producer: creates NAME (BYTES) in GPU 0's pool, writes it
/// (cudaMemsetAsync) and publishes it on its stream; says "ready CREATE_NS
/// WRITE_AND_PUBLISH_NS" once the daemon has it published, closes it when
/// its stdin closes.
int share_producer_main(std::string const& name, std::size_t bytes)
{
  die_with_parent();
  try {
    BENCH_CUDA(cudaSetDevice(0));
    BENCH_CUDA(cudaFree(nullptr));
    auto s = open_session("rmmd-bench-share-producer");
    stream_holder stream;
    auto const t0 = steady::now();
    auto buffer   = rmmd::shared_buffer::create(s, name, bytes, {.device = 0});
    auto const t1 = steady::now();
    BENCH_CUDA(cudaMemsetAsync(buffer.data(), share_fill, bytes, stream.get()));
    buffer.publish(cuda::stream_ref{stream.get()});
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    // A host function sent the publication without waiting for a reply; the
    // daemon answers a session's calls in order, so this round trip's answer
    // comes after the publication is done.
    if (auto status = s.impl().ping(); !status.ok()) {
      throw bench_error("Ping after the publication failed: " + status.error_message());
    }
    auto const t2 = steady::now();
    say(format("ready %.0f %.0f", ns_between(t0, t1), ns_between(t1, t2)));
    wait_for_stdin_eof();
    buffer.close(cuda::stream_ref{stream.get()});
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

/// Section f's legacy producer: cudaMalloc BYTES, write them, export the
/// buffer with cudaIpcGetMemHandle; says "ready HANDLE_HEX", frees it when
/// its stdin closes.
int ipc_producer_main(std::size_t bytes)
{
  die_with_parent();
  try {
    BENCH_CUDA(cudaSetDevice(0));
    void* p = nullptr;
    BENCH_CUDA(cudaMalloc(&p, bytes));
    BENCH_CUDA(cudaMemset(p, share_fill, bytes));
    BENCH_CUDA(cudaDeviceSynchronize());
    cudaIpcMemHandle_t handle{};
    BENCH_CUDA(cudaIpcGetMemHandle(&handle, p));
    say("ready " + to_hex(&handle, sizeof(handle)));
    wait_for_stdin_eof();
    cudaFree(p);
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

std::string ns_list(std::vector<double> const& ns)
{
  std::string out;
  for (double v : ns) { out += format(" %.0f", v); }
  return out;
}

/// Section f's consumer: sets up (CUDA context, stream; a session for rmmd;
/// the pinned host copy and its own allocation for host_copy), says "ready",
/// and on "go" runs WARMUP + REPS cycles (host_copy: 1 + REPS copies), up to
/// SECONDS once one is measured: open, read 8 bytes on its stream and check
/// them, close. Then "samples KIND NS..." for open, open_and_read, close and
/// close_and_sync, "first NS" (the first open), and "done MEASURED".
/// ARG: the buffer's name (rmmd), the handle in hex (cuda_ipc), "-" (host_copy).
int share_consumer_main(share_method method,
                        std::size_t bytes,
                        std::size_t reps,
                        std::size_t warmup,
                        double seconds,
                        std::string const& arg)
{
  die_with_parent();
  void* pinned = nullptr;
  void* own    = nullptr;
  struct freer {
    void*& pinned;
    void*& own;
    ~freer()
    {
      if (own != nullptr) { cudaFree(own); }
      if (pinned != nullptr) { cudaFreeHost(pinned); }
    }
  } free_at_exit{pinned, own};
  try {
    BENCH_CUDA(cudaSetDevice(0));
    BENCH_CUDA(cudaFree(nullptr));
    stream_holder stream;
    std::optional<rmmd::session> session;
    cudaIpcMemHandle_t handle{};
    switch (method) {
      case share_method::rmmd:
      case share_method::rmmd_grpc:
        session.emplace(open_session("rmmd-bench-share-consumer",
                                     method == share_method::rmmd_grpc
                                         ? call_transport::grpc
                                         : call_transport::session_socket));
        break;
      case share_method::cuda_ipc:
        if (!from_hex(arg, &handle, sizeof(handle))) {
          throw bench_error("not a cudaIpcMemHandle_t in hex: " + arg);
        }
        break;
      case share_method::host_copy:
        BENCH_CUDA(cudaMallocHost(&pinned, bytes));
        std::memset(pinned, share_fill, bytes);
        BENCH_CUDA(cudaMalloc(&own, bytes));
        break;
    }
    say("ready");
    if (!wait_for_stdin_line(std::chrono::milliseconds(180'000))) { return 3; }

    std::uint64_t word = 0;
    auto read_word     = [&](void const* p) {
      word = 0;
      BENCH_CUDA(cudaMemcpyAsync(&word, p, sizeof(word), cudaMemcpyDeviceToHost, stream.get()));
      BENCH_CUDA(cudaStreamSynchronize(stream.get()));
      if (word != share_word) {
        throw bench_error(format("read %016llx, not what the producer wrote",
                                 static_cast<unsigned long long>(word)));
      }
    };
    std::vector<double> open_ns, read_ns, close_ns, close_sync_ns;
    double first_ns  = 0;
    auto const total = (method == share_method::host_copy ? 1 : warmup) + reps;
    auto const stop  = steady::now() + std::chrono::duration_cast<steady::duration>(
                                          std::chrono::duration<double>(seconds));
    std::size_t measured = 0;
    for (std::size_t i = 0; i < total; ++i) {
      steady::time_point t0, t1, t2, t3, t4, t5;
      if (method == share_method::host_copy) {
        t0 = steady::now();
        BENCH_CUDA(cudaMemcpyAsync(own, pinned, bytes, cudaMemcpyHostToDevice, stream.get()));
        BENCH_CUDA(cudaStreamSynchronize(stream.get()));
        t1 = steady::now();
        read_word(own);
        t2 = t3 = t4 = t5 = steady::now();
      } else if (method == share_method::cuda_ipc) {
        void* p = nullptr;
        t0      = steady::now();
        BENCH_CUDA(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
        t1 = steady::now();
        read_word(p);
        t2 = t3 = steady::now();
        BENCH_CUDA(cudaIpcCloseMemHandle(p));
        t4 = t5 = steady::now();
      } else {
        t0          = steady::now();
        auto buffer = rmmd::shared_buffer::open(*session, arg);
        t1          = steady::now();
        read_word(buffer.data());
        t2 = t3 = steady::now();
        buffer.close(cuda::stream_ref{stream.get()});
        t4 = steady::now();
        BENCH_CUDA(cudaStreamSynchronize(stream.get()));
        t5 = steady::now();
      }
      if (i == 0) { first_ns = ns_between(t0, t1); }
      if (i + reps >= total) {
        open_ns.push_back(ns_between(t0, t1));
        read_ns.push_back(ns_between(t0, t2));
        close_ns.push_back(ns_between(t3, t4));
        close_sync_ns.push_back(ns_between(t3, t5));
        ++measured;
      }
      if (measured > 0 && steady::now() >= stop) { break; }
    }
    say("samples open" + ns_list(open_ns));
    say("samples open_and_read" + ns_list(read_ns));
    say("samples close" + ns_list(close_ns));
    say("samples close_and_sync" + ns_list(close_sync_ns));
    say(format("first %.0f", first_ns));
    say(format("done %zu", measured));
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

/// What N consumers of one method measured, all together.
struct share_samples {
  std::map<std::string, std::vector<double>> ns;  // by KIND of the samples lines
  std::vector<double> first_ns;
  std::size_t measured{};
  std::size_t asked{};  // reps per consumer x consumers
};

share_samples run_share_consumers(config const& cfg,
                                  share_method method,
                                  std::size_t bytes,
                                  int consumers,
                                  std::string const& arg,
                                  std::vector<std::string> const& env)
{
  auto const reps     = method == share_method::host_copy ? cfg.share_copy_reps : cfg.share_reps;
  auto const budget_s = static_cast<double>(cfg.cell_budget.count());
  std::vector<std::unique_ptr<child_process>> procs;
  for (int i = 0; i < consumers; ++i) {
    procs.push_back(
        std::make_unique<child_process>(std::vector<std::string>{self_path(),
                                                                 "--share-consumer",
                                                                 method_name(method),
                                                                 std::to_string(bytes),
                                                                 std::to_string(reps),
                                                                 std::to_string(cfg.share_warmup),
                                                                 format("%g", budget_s),
                                                                 arg},
                                        env));
  }
  auto who = [](std::size_t i) { return "consumer " + std::to_string(i); };
  // Set-up may pin and fill GiBs of host memory (host_copy).
  auto const ready_by = steady::now() + 180s;
  for (std::size_t i = 0; i < procs.size(); ++i) {
    expect_line(*procs[i], who(i), "ready", ready_by);
  }
  for (auto& p : procs) { p->write_line("go"); }
  share_samples out;
  out.asked          = reps * procs.size();
  auto const done_by = steady::now() + cfg.cell_budget + 120s;
  for (std::size_t i = 0; i < procs.size(); ++i) {
    while (true) {
      auto line = next_protocol_line(*procs[i], who(i), "done", done_by);
      std::istringstream words(line);
      std::string word;
      words >> word;
      if (word == "samples") {
        std::string kind;
        words >> kind;
        double v   = 0;
        auto& list = out.ns[kind];
        while (words >> v) { list.push_back(v); }
      } else if (word == "first") {
        double v = 0;
        words >> v;
        out.first_ns.push_back(v);
      } else if (word == "done") {
        std::size_t n = 0;
        words >> n;
        out.measured += n;
        break;
      } else {
        throw bench_error(who(i) + " (pid " + std::to_string(procs[i]->pid()) + ") said: " + line);
      }
    }
  }
  for (std::size_t i = 0; i < procs.size(); ++i) {
    if (auto rc = procs[i]->finish(30s); rc != 0) {
      throw bench_error(who(i) + " exited with status " + std::to_string(rc));
    }
  }
  return out;
}

void section_sharing(config const& cfg, daemon_process& daemon, run_state& st)
{
  std::printf(
      "\nf) named shared buffers: a producer process creates and writes one buffer; 1 or %d "
      "consumer processes at once open it, read 8 bytes on their stream, close it (us; "
      "open = to a usable pointer). Without rmmd: cudaIpcOpenMemHandle of the producer's "
      "cudaMalloc buffer, and a copy from a pinned host copy into the consumer's own cudaMalloc "
      "buffer (the copy alone)\n",
      cfg.share_consumers.back());
  auto& out = *st.doc.mutable_sharing();
  out.set_reps(u32(cfg.share_reps));
  out.set_copy_reps(u32(cfg.share_copy_reps));
  out.set_warmup(u32(cfg.share_warmup));
  auto env = self_env();
  env.push_back("RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string());
  std::printf("%-10s %5s %7s %6s %10s %10s %10s %10s %10s %10s\n",
              "method",
              "procs",
              "size",
              "reps",
              "open p50",
              "open p99",
              "+read p50",
              "close p50",
              "+sync p50",
              "1st open");
  std::fflush(stdout);

  // Row index of each cell by (method, size, consumers), for the targets.
  std::map<std::tuple<share_method, std::size_t, int>, int> rows;
  auto cell = [&](share_method method,
                  std::size_t bytes,
                  int consumers,
                  std::string const& arg,
                  std::string const& skipped) {
    rows[{method, bytes, consumers}] = out.cells_size();
    auto& row                        = *out.add_cells();
    row.set_method(method_name(method));
    row.set_size_bytes(static_cast<double>(bytes));
    row.set_consumers(u32(static_cast<std::size_t>(consumers)));
    if (!skipped.empty()) {
      row.set_error(skipped);
      return;
    }
    try {
      auto got  = run_share_consumers(cfg, method, bytes, consumers, arg, env);
      auto open = summarize(got.ns["open"]), read = summarize(got.ns["open_and_read"]),
           close = summarize(got.ns["close"]), close_sync = summarize(got.ns["close_and_sync"]),
           first = summarize(got.first_ns);
      auto set   = [](results::Latency& l, summary const& s) {
        l.set_p50_us(s.p50_us);
        l.set_p99_us(s.p99_us);
      };
      row.set_reps(u32(got.measured));
      row.set_cut_short_by_budget(got.measured < got.asked);
      set(*row.mutable_open(), open);
      set(*row.mutable_open_and_read(), read);
      bool const opens = method != share_method::host_copy;
      if (opens) {
        set(*row.mutable_close(), close);
        set(*row.mutable_close_and_sync(), close_sync);
        row.set_first_open_p50_us(first.p50_us);
      }
      std::printf("%-10s %5d %7s %6zu %10.1f %10.1f %10.1f %10s %10s %10s%s\n",
                  method_name(method).c_str(),
                  consumers,
                  size_name(bytes).c_str(),
                  got.measured,
                  open.p50_us,
                  open.p99_us,
                  read.p50_us,
                  opens ? format("%.1f", close.p50_us).c_str() : "-",
                  opens ? format("%.1f", close_sync.p50_us).c_str() : "-",
                  opens ? format("%.1f", first.p50_us).c_str() : "-",
                  got.measured < got.asked ? "  (cut short by the time budget)" : "");
    } catch (std::exception const& e) {
      row.set_error(e.what());
      st.error(
          "f " + method_name(method) + " " + size_name(bytes) + " x" + std::to_string(consumers),
          e.what());
    }
    std::fflush(stdout);
  };

  for (auto bytes : cfg.share_sizes) {
    // rmmd: one producer per size, then every consumer count, both transports.
    {
      auto const name    = format("rmmd-bench/share/%zu", bytes);
      auto& producer_row = *out.add_producers();
      producer_row.set_size_bytes(static_cast<double>(bytes));
      std::optional<child_process> producer;
      std::string skipped;
      try {
        producer.emplace(
            std::vector<std::string>{self_path(), "--share-producer", name, std::to_string(bytes)},
            env);
        auto line = expect_line(*producer, "the rmmd producer", "ready", steady::now() + 120s);
        double create_ns = 0, publish_ns = 0;
        if (std::sscanf(line.c_str(), "ready %lf %lf", &create_ns, &publish_ns) != 2) {
          throw bench_error("the rmmd producer said: " + line);
        }
        producer_row.set_create_ms(create_ns / 1e6);
        producer_row.set_write_and_publish_ms(publish_ns / 1e6);
        std::printf("  rmmd producer, %s: create %.3f ms, write + publish + sync %.3f ms\n",
                    size_name(bytes).c_str(),
                    create_ns / 1e6,
                    publish_ns / 1e6);
      } catch (std::exception const& e) {
        producer_row.set_error(e.what());
        st.error("f rmmd producer " + size_name(bytes), e.what());
        skipped = "no rmmd producer: " + std::string(e.what());
      }
      for (int n : cfg.share_consumers) {
        for (auto m : {share_method::rmmd, share_method::rmmd_grpc}) {
          cell(m, bytes, n, name, skipped);
        }
      }
      if (producer) {
        producer->close_stdin();
        if (auto rc = producer->finish(30s); rc != 0) {
          st.error("f rmmd producer " + size_name(bytes),
                   "exited with status " + std::to_string(rc));
        }
      }
    }
    // Legacy CUDA IPC of a cudaMalloc buffer.
    {
      std::optional<child_process> producer;
      std::string handle, skipped;
      try {
        producer.emplace(
            std::vector<std::string>{self_path(), "--ipc-producer", std::to_string(bytes)}, env);
        auto line = expect_line(*producer, "the CUDA IPC producer", "ready ", steady::now() + 120s);
        handle    = line.substr(6);
      } catch (std::exception const& e) {
        st.error("f cuda_ipc producer " + size_name(bytes), e.what());
        skipped = "no CUDA IPC producer: " + std::string(e.what());
      }
      for (int n : cfg.share_consumers) { cell(share_method::cuda_ipc, bytes, n, handle, skipped); }
      if (producer) {
        producer->close_stdin();
        producer->finish(30s);
      }
    }
    // Each consumer copies its own pinned host copy into its own allocation.
    for (int n : cfg.share_consumers) { cell(share_method::host_copy, bytes, n, "-", {}); }
  }

  // The targets: rmmd's open (calls on the session socket, the default).
  auto p50_of = [&](share_method m, std::size_t bytes, int n) -> std::optional<double> {
    auto it = rows.find({m, bytes, n});
    if (it == rows.end()) { return std::nullopt; }
    auto const& row = out.cells(it->second);
    if (row.has_error() || !row.open().has_p50_us()) { return std::nullopt; }
    return row.open().p50_us();
  };
  auto const largest = *std::max_element(cfg.share_sizes.begin(), cfg.share_sizes.end());
  for (auto bytes : cfg.share_sizes) {
    for (int n : cfg.share_consumers) {
      auto const open = p50_of(share_method::rmmd, bytes, n);
      if (!open) { continue; }
      auto& row = *out.mutable_cells(rows.at({share_method::rmmd, bytes, n}));
      target_row t{format("rmmd open p50, %s, %d consumer(s)", size_name(bytes).c_str(), n),
                   *open / 1000.0,
                   true,
                   share_open_target_ms,
                   "ms"};
      auto verdict          = st.check(t);
      *row.mutable_target() = target_result(t);
      std::printf("  %-44s %10.3f ms  (target <= %g ms: %s)\n",
                  t.what.c_str(),
                  t.measured,
                  share_open_target_ms,
                  verdict.c_str());
      auto const copy = p50_of(share_method::host_copy, bytes, n);
      if (!copy || *open <= 0) { continue; }
      row.set_host_copy_over_open_p50(*copy / *open);
      if (bytes != largest) { continue; }
      target_row speedup{
          format("host copy p50 / rmmd open p50, %s, %d consumer(s)", size_name(bytes).c_str(), n),
          *copy / *open,
          false,
          share_speedup_target,
          "x"};
      verdict                       = st.check(speedup);
      *row.mutable_speedup_target() = target_result(speedup);
      std::printf("  %-44s %10.0f x   (target >= %g x: %s)\n",
                  speedup.what.c_str(),
                  speedup.measured,
                  share_speedup_target,
                  verdict.c_str());
    }
  }
  std::fflush(stdout);
}

// ------------------------------------------- main

std::string gpu_slug(std::string const& name)
{
  std::string slug;
  for (unsigned char c : name) {
    if (std::isalnum(c)) {
      slug += static_cast<char>(std::tolower(c));
    } else if (!slug.empty() && slug.back() != '-') {
      slug += '-';
    }
  }
  while (!slug.empty() && slug.back() == '-') { slug.pop_back(); }
  return slug.empty() ? "gpu" : slug;
}

/// The GPU count, or 0 with the reason in `why`.
int visible_gpus(std::string& why)
{
  int n = 0;
  if (auto e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
          ")";
    cudaGetLastError();
    return 0;
  }
  if (n == 0) { why = "CUDA sees no device"; }
  return n;
}

std::string driver_version()
{
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  std::getline(in, line);
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Thu ..." or
  // "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  ...":
  // the first word made of digits and dots.
  std::istringstream words(line);
  std::string v;
  while (words >> v) {
    if (!v.empty() && v.find_first_not_of("0123456789.") == std::string::npos &&
        v.find('.') != std::string::npos) {
      return v;
    }
  }
  return line;
}

results::Gpu gpu_result(std::string& name_out)
{
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  name_out = prop.name;
  results::Gpu gpu;
  gpu.set_device(0);
  gpu.set_name(prop.name);
  gpu.set_slug(gpu_slug(prop.name));
  gpu.set_compute_capability(format("%d.%d", prop.major, prop.minor));
  gpu.set_memory_bytes(static_cast<double>(prop.totalGlobalMem));
  gpu.set_driver(driver_version());
  gpu.set_cuda_driver_api(format("%d.%d", driver / 1000, (driver % 1000) / 10));
  gpu.set_cuda_runtime(format("%d.%d", runtime / 1000, (runtime % 1000) / 10));
  return gpu;
}

std::string utc_now()
{
  auto t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

extern "C" void on_fatal_signal(int sig)
{
  kill_all_children();
  char const* msg = sig == SIGALRM ? "\nrmmd_bench: --max-seconds passed; children killed\n"
                                   : "\nrmmd_bench: interrupted; children killed\n";
  auto rc         = ::write(STDERR_FILENO, msg, std::strlen(msg));
  (void)rc;
  std::_Exit(sig == SIGALRM ? 3 : 128 + sig);
}

int bench_main(int argc, char** argv)
{
  CLI::App app{
      "rmmd_bench: rmmd's direct and fast paths against in-process RMM on one GPU, in one run "
      "(bench/README.md)"};
  std::string rmmd_path, out_path, pool_bytes = "16GiB";
  bool quick      = false;
  int max_seconds = 540;
  std::vector<std::string> const all_sections{
      "a", "a8", "b", "b2", "c", "c2", "d", "e", "f", "g", "h"};
  std::vector<std::string> sections = all_sections;
  app.add_option("--rmmd", rmmd_path, "The rmmd binary to start")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--out", out_path, "Where to write the results as JSON")->required();
  app.add_flag("--quick", quick, "Fewer pairs and trials (a smoke run, about a minute)");
  app.add_option("--cuda-pool-bytes", pool_bytes, "rmmd's --cuda-pool-bytes")
      ->capture_default_str();
  std::string buffer_memory = "own";
  app.add_option("--cuda-shared-buffer-memory",
                 buffer_memory,
                 "rmmd's --cuda-shared-buffer-memory (section f: pool or own)")
      ->capture_default_str()
      ->check(CLI::IsMember({"pool", "own"}));
  std::uint64_t release_threshold = 0;
  app.add_option("--cuda-release-threshold",
                 release_threshold,
                 "Bytes: rmmd's --cuda-release-threshold and b2's pool's (0, rmmd's default, "
                 "gives memory back at every synchronisation)")
      ->capture_default_str();
  app.add_option("--max-seconds", max_seconds, "Kill everything and exit 3 after this long")
      ->capture_default_str()
      ->check(CLI::Range(10, 3600));
  std::vector<int> a8_threads{1, 8};
  app.add_option("--a8-threads", a8_threads, "Section a8's thread counts, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  std::size_t a8_rounds = 0;
  app.add_option(
         "--a8-rounds", a8_rounds, "Section a8's rounds (0: 16, --quick 4; more for a profile)")
      ->capture_default_str();
  app.add_option("--sections",
                 sections,
                 "The sections to run, comma-separated (bench/README.md); b takes the direct "
                 "path's figures from a")
      ->delimiter(',')
      ->check(CLI::IsMember(all_sections))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }

  std::string why;
  if (visible_gpus(why) == 0 && sections == std::vector<std::string>{"h"}) {
    std::string command;
    for (int i = 0; i < argc; ++i) { command += (i ? " " : "") + std::string(argv[i]); }
    ::signal(SIGPIPE, SIG_IGN);
    return section_scale_without_gpu(
        {.rmmd = rmmd_path, .self = self_path(), .helper_env = self_env(), .quick = quick},
        out_path,
        command);
  }
  if (visible_gpus(why) == 0) {
    std::fprintf(stderr,
                 "rmmd_bench: no CUDA GPU here (%s). It measures rmmd against in-process RMM on "
                 "a GPU: run it on the GPU host (bench/README.md); `--sections h` alone runs "
                 "section h's host figures without one.\n",
                 why.c_str());
    return 2;
  }
  {  // fail now, not after the run, if the JSON cannot be written
    auto dir = std::filesystem::path(out_path).parent_path();
    if (dir.empty()) { dir = "."; }
    if (!std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0 ||
        std::filesystem::is_directory(out_path)) {
      std::fprintf(stderr,
                   "rmmd_bench: cannot write --out %s: %s is not a writable directory (or the "
                   "path is a directory)\n",
                   out_path.c_str(),
                   dir.c_str());
      return 2;
    }
  }
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGALRM}) { ::sigaction(sig, &sa, nullptr); }
  ::signal(SIGPIPE, SIG_IGN);
  ::alarm(static_cast<unsigned>(max_seconds));

  auto const cfg = [&] {
    auto c              = config::make(quick);
    c.release_threshold = release_threshold;
    return c;
  }();
  auto const started = steady::now();
  run_state st;
  std::string command;
  for (int i = 0; i < argc; ++i) { command += (i ? " " : "") + std::string(argv[i]); }
  st.doc.set_schema("rmmd-bench/1");
  st.doc.set_command(command);
  st.doc.set_started_utc(utc_now());
  st.doc.set_quick(quick);
  auto const selected = [&](std::string const& name) {
    return std::find(sections.begin(), sections.end(), name) != sections.end();
  };
  for (auto const& name : all_sections) {
    if (selected(name)) { st.doc.add_sections(name); }
  }
  auto& c = *st.doc.mutable_config();
  c.set_pairs(u32(cfg.pairs));
  c.set_pairs_direct_64mib(u32(cfg.pairs_direct_64mib));
  c.set_warmup_pairs(u32(cfg.warmup));
  c.set_cell_budget_s(u32(static_cast<std::size_t>(cfg.cell_budget.count())));
  c.set_alignment(u32(alignment));
  c.set_step_reps(u32(cfg.step_reps));
  c.set_step_reps_64mib(u32(cfg.step_reps_64mib));
  c.set_rpc_reps(u32(cfg.rpc_reps));
  c.set_worker_seconds(cfg.worker_seconds);
  c.set_worker_bytes(u32(cfg.worker_bytes));
  c.set_setup_sessions(u32(cfg.setup_sessions));
  c.set_kill_trials(u32(cfg.kill_trials));
  c.set_kill_hold_bytes(u32(cfg.kill_hold_bytes));
  c.set_leases(u32(cfg.leases));
  if (cfg.release_threshold != 0) {
    c.set_cuda_release_threshold_bytes(static_cast<double>(cfg.release_threshold));
  }
  utsname uts{};
  ::uname(&uts);
  char host[256]{};
  ::gethostname(host, sizeof(host) - 1);
  st.doc.mutable_host()->set_hostname(host);
  st.doc.mutable_host()->set_kernel(uts.release);
  st.doc.mutable_host()->set_cpus(std::thread::hardware_concurrency());

  BENCH_CUDA(cudaSetDevice(0));
  BENCH_CUDA(cudaFree(nullptr));  // the context now, not inside a measurement
  std::string gpu_name;
  *st.doc.mutable_gpu() = gpu_result(gpu_name);

  std::vector<std::string> daemon_args{"--backend=cuda",
                                       "--cuda-pool-bytes",
                                       pool_bytes,
                                       "--cuda-shared-buffer-memory",
                                       buffer_memory};
  if (release_threshold != 0) {
    daemon_args.push_back("--cuda-release-threshold");
    daemon_args.push_back(std::to_string(release_threshold));
  }
  daemon_process daemon(bench_daemon(rmmd_path, daemon_args, std::chrono::seconds(60)));
  for (auto const& arg : daemon.argv()) { st.doc.mutable_daemon()->add_argv(arg); }
  auto const rss_fresh = rss_bytes(daemon.pid());
  rmmd::session session(
      rmmd::session::options{.runtime_dir = daemon.runtime_dir(), .client_name = "rmmd-bench"});
  (void)session.device_pool(0);  // throws, naming the pools, if GPU 0 has none
  std::string section_list;
  for (auto const& name : st.doc.sections()) {
    section_list += (section_list.empty() ? "" : ",") + name;
  }
  std::printf("rmmd_bench on %s (driver %s), rmmd pid %d%s, sections %s\n",
              gpu_name.c_str(),
              driver_version().c_str(),
              static_cast<int>(daemon.pid()),
              quick ? ", --quick" : "",
              section_list.c_str());
  std::fflush(stdout);

  auto guarded = [&](char const* name, auto&& body) {
    if (!selected(name)) { return; }
    try {
      if (!daemon.alive()) {
        throw bench_error("rmmd has exited; its log ends:\n" + daemon.log_tail());
      }
      body();
    } catch (std::exception const& e) {
      st.error(name, e.what());
    }
  };
  std::map<std::pair<std::string, std::size_t>, double> pair_p50;
  rmmd::session grpc_session(rmmd::session::options{.runtime_dir = daemon.runtime_dir(),
                                                    .client_name = "rmmd-bench-grpc",
                                                    .lease_calls = call_transport::grpc});
  guarded("a", [&] { pair_p50 = section_pairs(cfg, session, grpc_session, st); });
  guarded("a8", [&] {
    fast_vs_pool_options o;
    if (cfg.quick) {
      o.warmup = 20;
      o.pairs  = 300;
      o.rounds = 4;
    }
    o.threads = a8_threads;
    if (a8_rounds != 0) { o.rounds = a8_rounds; }
    auto const got = section_fast_vs_pool(session, o, st.doc);
    for (auto const& t : got.targets) {
      st.targets.push_back({t.what, t.measured, true, fast_vs_pool_target, "x"});
    }
    for (auto const& e : got.errors) { st.error("a8", e); }
  });
  guarded("b", [&] { section_steps(cfg, session, pair_p50, st); });
  guarded("b2", [&] { section_daemon_side(cfg, st); });
  guarded("c", [&] { section_processes(cfg, daemon, st); });
  guarded("c2", [&] {
    std::string why;
    if (visible_gpus(why) < 2) {
      std::printf("\nc2) skipped: it needs 2 GPUs, %d visible\n", visible_gpus(why));
      return;
    }
    std::printf(
        "\nc2) 16 direct client processes, all on GPU 0, then spread over GPUs 0 and 1 "
        "(worker i on GPU i %% 2): does the driver serialise per device?\n");
    section_processes(cfg, daemon, st, {0});
    section_processes(cfg, daemon, st, {0, 1});
  });
  guarded("d", [&] { section_setup_and_reclaim(cfg, daemon, session, st); });
  guarded("e", [&] { section_rss(cfg, daemon, session, rss_fresh, st); });
  guarded("f", [&] { section_sharing(cfg, daemon, st); });
  guarded("g", [&] {
    // Memory that moves (section_g.cpp), with a daemon of its own.
    auto const g = section_mobility(mobility_config{.trials = quick ? 5 : 20},
                                    rmmd_path,
                                    self_path(),
                                    self_env(),
                                    st.doc.mutable_mobility());
    st.check({.what     = "g) idle slabs reach a request: p50",
              .measured = g.p50_ms,
              .limit    = 50,
              .unit     = "ms"});
    st.check({.what     = "g) requests idle slabs could serve, refused",
              .measured = static_cast<double>(g.refused),
              .limit    = 0,
              .unit     = "requests"});
  });
  guarded("h", [&] {
    auto const targets = section_scale({.rmmd        = rmmd_path,
                                        .self        = self_path(),
                                        .helper_env  = self_env(),
                                        .quick       = quick,
                                        .cuda_daemon = &daemon},
                                       *st.doc.mutable_scale());
    for (auto const& t : targets) { (void)st.check(t); }
  });

  print_targets("Targets (issues 5, 12 and 14)", st.targets, st.doc);
  for (auto const& e : st.errors) { st.doc.add_errors(e); }
  st.doc.set_seconds(seconds_between(started, steady::now()));
  st.doc.set_daemon_log_tail(daemon.log_tail(40));

  auto tmp = out_path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << results_json(st.doc);
    if (!out) {
      std::fprintf(stderr, "rmmd_bench: writing %s failed\n", tmp.c_str());
      return 1;
    }
  }
  std::filesystem::rename(tmp, out_path);
  std::printf("\nwrote %s (%zu section error(s)) in %.0f s\n",
              out_path.c_str(),
              st.errors.size(),
              seconds_between(started, steady::now()));
  return st.errors.empty() ? 0 : 1;
}

int internal_main(int argc, char** argv)
{
  std::string const mode = argv[1];
  auto usage             = [&](char const* text) {
    std::fprintf(
        stderr, "rmmd_bench %s: internal mode; usage: rmmd_bench %s\n", mode.c_str(), text);
    return 2;
  };
  if (mode == "--exporter") { return exporter_main(); }
  if (int rc = section_scale_helper_main(argc, argv); rc >= 0) { return rc; }
  if (mode == "--context-rss") {
    // What any process that owns a CUDA pool pays, rmmd or not: the context,
    // and an RMM pool with posix-fd export (as rmmd makes), one allocation made.
    using handle = rmm::mr::cuda_async_memory_resource::allocation_handle_type;
    if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) { return 4; }
    auto const context_only = rss_bytes(::getpid());
    rmm::mr::cuda_async_memory_resource mr(
        std::nullopt, std::nullopt, handle::posix_file_descriptor);
    mr.deallocate_sync(mr.allocate_sync(1 << 20, 256), 1 << 20, 256);
    std::printf("ready %llu %llu\n",
                static_cast<unsigned long long>(context_only),
                static_cast<unsigned long long>(rss_bytes(::getpid())));
    return 0;
  }
  if (mode == "--gpu-slug") {
    std::string why;
    if (visible_gpus(why) == 0) {
      std::fprintf(stderr, "rmmd_bench: no CUDA GPU here (%s)\n", why.c_str());
      return 2;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) { return 2; }
    std::printf("%s\n", gpu_slug(prop.name).c_str());
    return 0;
  }
  if (mode == "--mobility-worker") {
    char* end  = nullptr;
    auto bytes = argc == 3 ? std::strtoull(argv[2], &end, 10) : 0;
    if (argc != 3 || *end != '\0' || bytes == 0) { return usage("--mobility-worker SLAB_BYTES"); }
    return mobility_worker_main(bytes);
  }
  if (mode == "--worker") {
    if (argc != 5 && argc != 6) {
      return usage("--worker fast|direct|direct-grpc BYTES SECONDS [DEVICE]");
    }
    auto m = parse_kind(argv[2]);
    char* end1;
    char* end2;
    char* end3   = nullptr;
    auto bytes   = std::strtoull(argv[3], &end1, 10);
    auto seconds = std::strtod(argv[4], &end2);
    auto device  = argc == 6 ? std::strtol(argv[5], &end3, 10) : 0;
    if (!m || *end1 != '\0' || *end2 != '\0' || (end3 != nullptr && *end3 != '\0') || bytes == 0 ||
        seconds <= 0 || device < 0) {
      return usage("--worker fast|direct|direct-grpc BYTES SECONDS [DEVICE]");
    }
    return worker_main(*m, bytes, seconds, static_cast<int>(device));
  }
  if (mode == "--share-producer") {
    char* end  = nullptr;
    auto bytes = argc == 4 ? std::strtoull(argv[3], &end, 10) : 0;
    if (argc != 4 || *end != '\0' || bytes == 0) { return usage("--share-producer NAME BYTES"); }
    return share_producer_main(argv[2], bytes);
  }
  if (mode == "--ipc-producer") {
    char* end  = nullptr;
    auto bytes = argc == 3 ? std::strtoull(argv[2], &end, 10) : 0;
    if (argc != 3 || *end != '\0' || bytes == 0) { return usage("--ipc-producer BYTES"); }
    return ipc_producer_main(bytes);
  }
  if (mode == "--share-consumer") {
    constexpr char const* text =
        "--share-consumer rmmd|rmmd_grpc|cuda_ipc|host_copy BYTES REPS WARMUP SECONDS ARG";
    if (argc != 8) { return usage(text); }
    auto method = parse_method(argv[2]);
    char *e1, *e2, *e3, *e4;
    auto bytes   = std::strtoull(argv[3], &e1, 10);
    auto reps    = std::strtoull(argv[4], &e2, 10);
    auto warmup  = std::strtoull(argv[5], &e3, 10);
    auto seconds = std::strtod(argv[6], &e4);
    if (!method || *e1 != '\0' || *e2 != '\0' || *e3 != '\0' || *e4 != '\0' || bytes == 0 ||
        reps == 0 || seconds <= 0) {
      return usage(text);
    }
    return share_consumer_main(*method, bytes, reps, warmup, seconds, argv[7]);
  }
  if (mode == "--holder") {
    if (argc != 4) { return usage("--holder fast|direct BYTES"); }
    auto m = parse_kind(argv[2]);
    char* end;
    auto bytes = std::strtoull(argv[3], &end, 10);
    if (!m || *end != '\0' || bytes == 0) { return usage("--holder fast|direct BYTES"); }
    return holder_main(m->mode, bytes);
  }
  return -1;
}

}  // namespace
}  // namespace rmmd::bench

int main(int argc, char** argv)
{
  using namespace rmmd::bench;
  if (argc > 1) {
    if (int rc = internal_main(argc, argv); rc >= 0) { return rc; }
  }
  try {
    return bench_main(argc, argv);
  } catch (std::exception const& e) {
    // Every child and the daemon are gone by now (their destructors ran).
    std::fprintf(stderr, "rmmd_bench: %s\n", e.what());
    return 1;
  }
}
