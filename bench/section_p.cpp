// Section p of rmmd_bench: peering (section_p.hpp says what it measures).

#include "bench/section_p.hpp"

#include "harness/child_process.hpp"
#include "harness/daemon_process.hpp"
#include "harness/peer_setup.hpp"

#include <rmmd/admin.hpp>
#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <cuda_runtime_api.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::bench {
namespace {

namespace fs = std::filesystem;

constexpr double open_target_ms = 5.0;  // p50, open+map+close, every size
// p50 of an open after every remote buffer was closed, the session's anchor
// of A's GPU still mapped: no mapping between the GPUs to make again.
constexpr double reopen_target_ms = 2.0;

std::string tls(fs::path const& certs, std::string const& stem)
{
  return "  tls { certificate_file: \"" + (certs / (stem + ".pem")).string() +
         "\" private_key_file: \"" + (certs / (stem + ".key")).string() + "\" trusted_ca_file: \"" +
         (certs / "ca.pem").string() + "\" }\n";
}

std::string pools(std::uint64_t limit)
{
  return "pools { name: \"host\" backend: HOST capacity_bytes: 67108864 }\n"
         "pools { name: \"gpu\" backend: CUDA device: 0 handle_types: [POSIX_FD, FABRIC] "
         "limit_bytes: " +
         std::to_string(limit) + " }\n";
}

void check_cuda(cudaError_t e, char const* what)
{
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e));
  }
}

/// GB/s of `reps` copies of `bytes` that `copy(stream)` enqueues on GPU 1.
template <typename Copy>
double copy_gbps(std::size_t bytes, int reps, Copy&& copy)
{
  check_cuda(cudaSetDevice(1), "cudaSetDevice(1)");
  cudaStream_t stream{};
  cudaEvent_t start{}, stop{};
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  copy(stream);  // warm-up
  check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < reps; ++i) { copy(stream); }
  check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return static_cast<double>(bytes) * reps / (static_cast<double>(ms) * 1e6);
}

/// Why section p cannot run here ("" when it can); `script` is set to
/// scripts/make-test-certs.sh when it can.
std::string skip_reason(fs::path* script)
{
  std::string why;
  if (int n = visible_gpus(why); n < 2) {
    return "it needs 2 GPUs, " + std::to_string(n) + " visible" +
           (why.empty() ? "" : " (" + why + ")");
  }
  if (!fs::exists("/dev/nvidia-caps-imex-channels/channel0")) {
    return "no IMEX channel (/dev/nvidia-caps-imex-channels/channel0): fabric handles cannot be "
           "imported";
  }
  *script = harness::find_certs_script(RMMD_SOURCE_DIR);
  if (script->empty()) {
    return "scripts/make-test-certs.sh not found (set RMMD_TEST_CERTS_SCRIPT)";
  }
  return {};
}

/// A directory of the section's own under /tmp, removed with what it holds.
class scratch_dir {
 public:
  scratch_dir()
  {
    char tmpl[] = "/tmp/rmmd-bench-peering-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) { throw std::runtime_error("mkdtemp failed"); }
    path_ = tmpl;
  }
  scratch_dir(scratch_dir const&)            = delete;
  scratch_dir& operator=(scratch_dir const&) = delete;
  ~scratch_dir()
  {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  [[nodiscard]] fs::path const& path() const noexcept
  {
    return path_;
  }

 private:
  fs::path path_;
};

/// Nodes A and B: A serves GPU 0 with a fabric pool and grants B "bench/";
/// B (on GPU 1) peers with A over mutual TLS on 127.0.0.1.
struct peered_daemons {
  std::unique_ptr<harness::daemon_process> a, b;
};

peered_daemons start_daemons(fs::path const& rmmd, fs::path const& dir, fs::path const& script)
{
  auto const certs = dir / "certs";
  harness::child_process made(
      {"/bin/bash", script.string(), certs.string()}, {}, {.merge_stderr = true});
  made.close_stdin();
  auto const said = made.read_all(std::chrono::seconds(60));
  if (made.wait(std::chrono::seconds(60)).value_or(-1) != 0) {
    throw std::runtime_error("make-test-certs.sh failed: " + said);
  }
  int const port = harness::free_loopback_port();
  std::ofstream(dir / "a.conf") << pools(std::uint64_t{16} << 30)
                                << "peering {\n  node_name: \"nodeA\"\n  listen_address: "
                                   "\"127.0.0.1:"
                                << port << "\"\n"
                                << tls(certs, "nodeA")
                                << "  grants { identity: \"CN=rmmd-nodeB\" name_prefixes: "
                                   "\"bench/\" }\n}\n";
  std::ofstream(dir / "b.conf") << pools(std::uint64_t{4} << 30)
                                << "peering {\n  node_name: \"nodeB\"\n"
                                << tls(certs, "nodeB")
                                << "  peers { name: \"nodeA\" address: \"127.0.0.1:" << port
                                << "\" identity: \"CN=rmmd-nodeA\" }\n}\n";
  auto start = [&](char const* conf, char const* devices) {
    return std::make_unique<harness::daemon_process>(
        harness::daemon_process::options{.program     = rmmd,
                                         .args        = {"--config", (dir / conf).string()},
                                         .dir_prefix  = "rmmd-bench-p-",
                                         .log_to_file = true,
                                         .env = {std::string("CUDA_VISIBLE_DEVICES=") + devices}});
  };
  auto a = start("a.conf", "0");
  auto b = start("b.conf", "1");
  return {std::move(a), std::move(b)};
}

/// Waits (30 s at most) until B, through session `sb`, sees A ready;
/// throws saying why not, with both daemons' logs.
void wait_until_peered(rmmd::session const& sb, peered_daemons const& d)
{
  rmmd::admin const admin(sb);
  std::string state, problem;
  auto const deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (state != "ready" && std::chrono::steady_clock::now() < deadline) {
    try {
      auto const listed = parse_json<v1::ListPeersResponse>(admin.peers_json());
      for (auto const& p : listed.peers()) {
        if (p.node_name() == "nodeA") {
          state   = p.state();
          problem = p.problem();
        }
      }
    } catch (std::exception const& e) {
      problem = e.what();  // asked again until the deadline
    }
    if (state != "ready") { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }
  }
  if (state != "ready") {
    throw std::runtime_error("B never saw A ready (state '" + state + "': " + problem +
                             ")\nA's log:\n" + d.a->log_tail(20) + "B's log:\n" +
                             d.b->log_tail(20));
  }
}

/// The sessions the section opens with: the producer on A, the consumer on
/// B, and on A the baseline's (a process on A's node opening the same
/// buffer by its fabric handle: the import a remote open pays, without the
/// hop to the other daemon).
struct sessions {
  rmmd::session a, b, local;
};

/// One size's samples, in ns.
struct samples {
  std::vector<double> open_close, close, answer, local;
};

double ns_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b)
{
  return std::chrono::duration<double, std::nano>(b - a).count();
}

/// One open of each kind of buffer `name`, timed, `reps` times after the
/// warm-up: the remote open (B asks A, this process imports the fabric
/// handle and maps it on GPU 1) and its close; the daemons' answer alone
/// (nothing imported or mapped); and, as the baseline in the same run, this
/// process opening the same buffer through A by its fabric handle, which
/// maps it on A's GPU 0 (the import without the hop, and without GPU 1
/// mapping GPU 0's memory).
samples measure_opens(config const& cfg,
                      sessions const& s,
                      std::string const& name,
                      std::size_t reps)
{
  rmmd::admin const b(s.b);
  samples out;
  for (std::size_t i = 0; i < reps + cfg.share_warmup; ++i) {
    auto const t0 = std::chrono::steady_clock::now();
    auto r = rmmd::shared_buffer::open(s.b, "nodeA:" + name, rmmd::open_options{.device = 1});
    auto const t_open = std::chrono::steady_clock::now();
    r.close();
    auto const t1 = std::chrono::steady_clock::now();
    auto l        = rmmd::shared_buffer::open(s.local, name);
    l.close();
    auto const t2     = std::chrono::steady_clock::now();
    auto const answer = b.probe_open(name, "nodeA").answer;
    if (i >= cfg.share_warmup) {
      out.open_close.push_back(ns_between(t0, t1));
      out.close.push_back(ns_between(t_open, t1));
      out.local.push_back(ns_between(t1, t2));
      out.answer.push_back(static_cast<double>(answer.count()));
    }
  }
  return out;
}

/// A fresh session's first remote open of buffer `name` and its close,
/// `reps` times (after one not counted: the process's first import), each
/// in a session of its own made and ended untimed: with nothing of GPU 0
/// mapped on GPU 1 in this process, each pays the driver's first mapping
/// between the two GPUs, as a process's first remote open does.
std::vector<double> measure_first_opens(fs::path const& b_runtime_dir,
                                        std::string const& name,
                                        std::size_t reps)
{
  std::vector<double> out;
  for (std::size_t i = 0; i < reps + 1; ++i) {
    rmmd::session const fresh({.runtime_dir = b_runtime_dir, .client_name = "bench-p-first"});
    auto const t0 = std::chrono::steady_clock::now();
    auto r = rmmd::shared_buffer::open(fresh, "nodeA:" + name, rmmd::open_options{.device = 1});
    r.close();
    auto const t1 = std::chrono::steady_clock::now();
    if (i > 0) { out.push_back(ns_between(t0, t1)); }
  }
  return out;
}

/// The opens of every size: a fresh session's first, after every close
/// (cold: only the session's anchor mapped), and warm.
struct open_samples {
  std::vector<std::vector<double>> first;
  std::vector<samples> cold, warm;
};

/// Creates A's buffers of every size (`made` keeps them), then measures
/// their opens: first opens of fresh sessions (nothing of GPU 0 mapped on
/// GPU 1 in this process, so each pays the driver's first mapping between
/// the two GPUs); cold, in the consumer's session, where no buffer of A is
/// mapped but the anchor of A's GPU the session keeps from its first remote
/// open; and warm (this process keeps another buffer of A mapped on GPU 1
/// meanwhile, as a consumer that holds any remote buffer does).
open_samples measure_cold_and_warm(config const& cfg,
                                   sessions const& s,
                                   fs::path const& b_runtime_dir,
                                   std::size_t reps,
                                   std::vector<rmmd::shared_buffer>& made)
{
  open_samples out;
  for (std::size_t bytes : cfg.share_sizes) {
    auto const name = "bench/p" + std::to_string(bytes >> 20);
    auto made_buf   = rmmd::shared_buffer::create(s.a, name, bytes, {.pool = "gpu"});
    check_cuda(cudaSetDevice(0), "cudaSetDevice(0)");
    check_cuda(cudaMemset(made_buf.data(), 0x5a, bytes), "cudaMemset");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    made_buf.publish();
    made.push_back(std::move(made_buf));
  }
  // Before the consumer's session maps anything of A: its anchor would keep
  // the fresh sessions' opens warm.
  std::size_t const first_reps = cfg.quick ? 3 : 10;
  for (std::size_t bytes : cfg.share_sizes) {
    out.first.push_back(
        measure_first_opens(b_runtime_dir, "bench/p" + std::to_string(bytes >> 20), first_reps));
  }
  for (std::size_t bytes : cfg.share_sizes) {
    out.cold.push_back(measure_opens(cfg, s, "bench/p" + std::to_string(bytes >> 20), reps));
  }
  auto keep_made =
      rmmd::shared_buffer::create(s.a, "bench/p-keep", std::size_t{2} << 20, {.pool = "gpu"});
  keep_made.publish();
  auto kept = rmmd::shared_buffer::open(s.b, "nodeA:bench/p-keep", rmmd::open_options{.device = 1});
  for (std::size_t bytes : cfg.share_sizes) {
    out.warm.push_back(measure_opens(cfg, s, "bench/p" + std::to_string(bytes >> 20), reps));
  }
  kept.close();
  keep_made.close();
  return out;
}

/// The opens' table, rows of `out` and their targets checked into `st`.
void report_opens(config const& cfg,
                  std::size_t reps,
                  open_samples const& opens,
                  results::Peering& out,
                  run_state& st)
{
  std::printf("  %-10s %6s %10s %10s %10s %8s %12s %8s %12s %12s %12s %12s\n",
              "size",
              "reps",
              "p50 ms",
              "p99 ms",
              "max ms",
              "target",
              "cold p50 ms",
              "target",
              "first p50 ms",
              "of it: close",
              "answer only",
              "local fabric");
  for (std::size_t k = 0; k < cfg.share_sizes.size(); ++k) {
    auto const bytes  = cfg.share_sizes[k];
    auto const s      = summarize(opens.warm[k].open_close);
    auto const closed = summarize(opens.warm[k].close);
    auto const answer = summarize(opens.warm[k].answer);
    auto const local  = summarize(opens.warm[k].local);
    auto const c      = summarize(opens.cold[k].open_close);
    auto const first  = summarize(opens.first[k]);
    auto* row         = out.add_opens();
    row->set_mib(u32(bytes >> 20));
    row->set_reps(u32(reps));
    row->set_p50_us(s.p50_us);
    row->set_p99_us(s.p99_us);
    row->set_max_us(s.max_us);
    row->set_close_p50_us(closed.p50_us);
    row->set_answer_p50_us(answer.p50_us);
    row->set_local_fabric_open_close_p50_us(local.p50_us);
    row->set_cold_p50_us(c.p50_us);
    row->set_cold_p99_us(c.p99_us);
    row->set_first_open_p50_us(first.p50_us);
    row->set_first_open_p99_us(first.p99_us);
    row->set_first_open_reps(u32(opens.first[k].size()));
    auto const verdict =
        st.check({.what = "p) remote open+map+close p50, " + std::to_string(bytes >> 20) + " MiB",
                  .measured = s.p50_us / 1000,
                  .limit    = open_target_ms,
                  .unit     = "ms"});
    auto const cold_verdict =
        st.check({.what = "p) remote open+map+close after every close (anchor kept) p50, " +
                          std::to_string(bytes >> 20) + " MiB",
                  .measured = c.p50_us / 1000,
                  .limit    = reopen_target_ms,
                  .unit     = "ms"});
    std::printf("  %6zu MiB %6zu %10.3f %10.3f %10.3f %8s %12.3f %8s %12.3f %12.3f %12.3f %12.3f\n",
                bytes >> 20,
                reps,
                s.p50_us / 1000,
                s.p99_us / 1000,
                s.max_us / 1000,
                verdict.c_str(),
                c.p50_us / 1000,
                cold_verdict.c_str(),
                first.p50_us / 1000,
                closed.p50_us / 1000,
                answer.p50_us / 1000,
                local.p50_us / 1000);
  }
}

/// Gives GPU 1 access to GPU 0's memory where it can (a peer copy without
/// it is staged through the host); whether it has it.
bool enable_peer_access()
{
  check_cuda(cudaSetDevice(1), "cudaSetDevice(1)");
  int can_access = 0;
  check_cuda(cudaDeviceCanAccessPeer(&can_access, 1, 0), "cudaDeviceCanAccessPeer");
  if (can_access != 0) {
    auto const e = cudaDeviceEnablePeerAccess(0, 0);
    if (e != cudaErrorPeerAccessAlreadyEnabled) {
      check_cuda(e, "cudaDeviceEnablePeerAccess(GPU 1 to GPU 0)");
    }
    cudaGetLastError();
  }
  return can_access != 0;
}

/// Read bandwidth: GPU 1 copies the largest remote buffer out of its
/// mapping, and cudaMemcpyPeer copies the same bytes from GPU 0 to GPU 1 at
/// its best (peer access on where the GPUs allow it).
void measure_read(config const& cfg, rmmd::session const& sb, results::Peering& out)
{
  std::size_t const read_bytes = cfg.share_sizes.back();
  auto const read_name         = "bench/p" + std::to_string(read_bytes >> 20);
  auto remote =
      rmmd::shared_buffer::open(sb, "nodeA:" + read_name, rmmd::open_options{.device = 1});
  void* dst  = nullptr;
  void* src0 = nullptr;
  check_cuda(cudaSetDevice(1), "cudaSetDevice(1)");
  check_cuda(cudaMalloc(&dst, read_bytes), "cudaMalloc on GPU 1");
  check_cuda(cudaSetDevice(0), "cudaSetDevice(0)");
  check_cuda(cudaMalloc(&src0, read_bytes), "cudaMalloc on GPU 0");
  int const copies         = cfg.quick ? 3 : 10;
  bool const peer          = enable_peer_access();
  double const remote_gbps = copy_gbps(read_bytes, copies, [&](cudaStream_t s) {
    check_cuda(cudaMemcpyAsync(dst, remote.data(), read_bytes, cudaMemcpyDeviceToDevice, s),
               "cudaMemcpyAsync from the remote mapping");
  });
  double const peer_gbps   = copy_gbps(read_bytes, copies, [&](cudaStream_t s) {
    check_cuda(cudaMemcpyPeerAsync(dst, 1, src0, 0, read_bytes, s), "cudaMemcpyPeerAsync");
  });
  remote.close();
  cudaFree(dst);
  cudaFree(src0);
  out.set_read_mib(u32(read_bytes >> 20));
  out.set_remote_read_gbps(remote_gbps);
  out.set_peer_copy_gbps(peer_gbps);
  out.set_peer_access(peer);
  std::printf(
      "  GPU 1 reads a remote %zu MiB buffer: %.1f GB/s; cudaMemcpyPeer GPU 0 -> 1: "
      "%.1f GB/s (same run, %s)\n",
      read_bytes >> 20,
      remote_gbps,
      peer_gbps,
      peer ? "peer access on" : "no peer access between these GPUs");
}

}  // namespace

void section_peering(config const& cfg, fs::path const& rmmd, run_state& st)
{
  auto& out = *st.doc.mutable_peering();
  fs::path script;
  if (auto const why = skip_reason(&script); !why.empty()) {
    out.set_skipped(why);
    std::printf("\np) skipped: %s\n", why.c_str());
    return;
  }
  std::printf(
      "\np) a buffer of another node: daemons A (GPU 0, fabric pool) and B "
      "(CUDA_VISIBLE_DEVICES=1) peering over mutual TLS on 127.0.0.1; this process opens "
      "nodeA:NAME through B and maps it on GPU 1\n");
  try {
    scratch_dir const dir;
    auto const daemons = start_daemons(rmmd, dir.path(), script);
    sessions const s{.a     = rmmd::session({.runtime_dir = daemons.a->runtime_dir(),
                                             .client_name = "bench-p-producer"}),
                     .b     = rmmd::session({.runtime_dir = daemons.b->runtime_dir(),
                                             .client_name = "bench-p-consumer"}),
                     .local = rmmd::session({.runtime_dir      = daemons.a->runtime_dir(),
                                             .client_name      = "bench-p-local",
                                             .import_by_fabric = true})};
    wait_until_peered(s.b, daemons);
    std::vector<rmmd::shared_buffer> made;  // alive until the read below
    std::size_t const reps = cfg.quick ? 20 : 200;
    auto const opens       = measure_cold_and_warm(cfg, s, daemons.b->runtime_dir(), reps, made);
    report_opens(cfg, reps, opens, out, st);
    measure_read(cfg, s.b, out);
  } catch (std::exception const& e) {
    st.error("p", e.what());
  }
}

}  // namespace rmmd::bench
