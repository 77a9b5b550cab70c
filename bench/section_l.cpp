// Section l of rmmd_bench: SIGKILL of a write lease's holder to the grant at
// the process waiting for it. See section_l.hpp and bench/README.md.

#include "bench/section_l.hpp"
#include "bench/section_support.hpp"

#include "rmmd/v1/rmmd.pb.h"

#include <rmmd/admin.hpp>
#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::bench {
namespace {

constexpr double takeover_target_ms = 100.0;  // SIGKILL to grant, p50
constexpr char const* buffer_name   = "bench-l/kv";

long long ns_of(steady::time_point t)
{
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// The buffer's lease as the daemon lists it.
v1::BufferLease lease_of(rmmd::admin const& admin)
{
  v1::DescribeBufferResponse described;
  auto const json = admin.buffer_json(buffer_name);
  if (!google::protobuf::util::JsonStringToMessage(json, &described).ok()) {
    throw bench_error("DescribeBuffer's JSON did not parse: " + json);
  }
  return described.info().lease();
}

/// Waits (up to 60 s) until `n` exclusive opens wait in line.
void wait_for_waiters(rmmd::admin const& admin, int n)
{
  auto const deadline = steady::now() + std::chrono::seconds(60);
  while (lease_of(admin).waiters_size() != n) {
    if (steady::now() > deadline) { throw bench_error("the waiter did not get in line"); }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

/// The daemon's takeover histogram, mean in ms (sum / count); nullopt where
/// /metrics cannot say.
std::optional<double> daemon_takeover_mean_ms(rmmd::admin const& admin)
{
  auto const address = admin.health().metrics_address;
  auto const colon   = address.rfind(':');
  if (address.empty() || colon == std::string::npos) { return std::nullopt; }
  httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  auto r = http.Get("/metrics");
  if (!r || r->status != 200) { return std::nullopt; }
  double sum = 0, count = 0;
  for (std::string_view rest = r->body; !rest.empty();) {
    auto const eol  = rest.find('\n');
    auto const line = rest.substr(0, eol);
    rest            = eol == std::string_view::npos ? std::string_view{} : rest.substr(eol + 1);
    auto value      = [&](std::string_view name, double* out) {
      if (line.starts_with(name) && line.size() > name.size() && line[name.size()] == ' ') {
        *out = std::strtod(std::string(line.substr(name.size() + 1)).c_str(), nullptr);
      }
    };
    value("rmmd_buffer_lease_takeover_seconds_sum", &sum);
    value("rmmd_buffer_lease_takeover_seconds_count", &count);
  }
  if (count <= 0) { return std::nullopt; }
  return sum / count * 1000;
}

/// A --lease-waiter helper that has said "ready".
std::unique_ptr<child_process> start_waiter(lease_options const& o, std::string const& dir)
{
  auto w = std::make_unique<child_process>(
      std::vector<std::string>{o.self.string(), "--lease-waiter", dir, buffer_name}, o.helper_env);
  (void)expect_line(*w, "a lease waiter", "ready", steady::now() + std::chrono::seconds(120));
  return w;
}

/// "holding GENERATION NS" from `w`.
std::pair<unsigned long long, long long> holding(child_process& w)
{
  auto const line =
      expect_line(w, "a lease waiter", "holding", steady::now() + std::chrono::seconds(120));
  unsigned long long generation = 0;
  long long ns                  = 0;
  if (std::sscanf(line.c_str(), "holding %llu %lld", &generation, &ns) != 2) {
    throw bench_error("a lease waiter said: " + line);
  }
  return {generation, ns};
}

}  // namespace

std::vector<target_row> section_lease(lease_options const& o, results::LeaseTakeover& out)
{
  std::size_t const bytes  = o.cuda ? std::size_t{1} << 30 : std::size_t{64} << 20;
  std::size_t const trials = o.quick ? 5 : 30;
  out.set_backend(o.cuda ? "cuda" : "host");
  out.set_buffer_bytes(static_cast<double>(bytes));
  out.set_trials(static_cast<std::uint32_t>(trials));
  out.mutable_target()->set_target(format("p50 <= %.0f ms", takeover_target_ms));
  std::printf(
      "\nl) a write lease from a SIGKILLed holder to the process waiting: %zu trials, "
      "a %s buffer (%s pool)\n",
      trials,
      size_name(bytes).c_str(),
      o.cuda ? "GPU 0's" : "a host");
  std::fflush(stdout);
  std::vector<std::string> args{"--metrics-address", "127.0.0.1:0"};
  if (o.cuda) {
    args.insert(args.end(), {"--backend=cuda", "--cuda-pool-bytes", std::to_string(2 * bytes)});
  } else {
    args.insert(args.end(), {"--backend=host", "--host-pool-bytes", std::to_string(2 * bytes)});
  }
  daemon_process daemon(bench_daemon(o.rmmd, args, std::chrono::seconds(60)));
  auto const dir = daemon.runtime_dir().string();
  rmmd::session s(rmmd::session::options{.runtime_dir = daemon.runtime_dir(),
                                         .client_name = "rmmd-bench-l",
                                         .reconnect   = std::chrono::milliseconds(0)});
  rmmd::admin const admin(s);
  {
    auto kv =
        rmmd::shared_buffer::create(s,
                                    buffer_name,
                                    bytes,
                                    {.pool = o.cuda ? s.device_pool(0).name : s.host_pool().name,
                                     .persistent    = true,
                                     .allow_writers = true});
    kv.publish();
  }
  auto holder     = start_waiter(o, dir);
  auto generation = holding(*holder).first;
  bool in_order   = generation == 1;
  std::vector<double> ms;
  for (std::size_t t = 0; t < trials; ++t) {
    auto waiter = start_waiter(o, dir);
    wait_for_waiters(admin, 1);
    auto const killed = steady::now();
    holder->kill(SIGKILL);
    auto const [next, granted_ns] = holding(*waiter);
    ms.push_back(static_cast<double>(granted_ns - ns_of(killed)) / 1e6);
    in_order   = in_order && next == generation + 1;
    generation = next;
    (void)holder->wait(steady::now() + std::chrono::seconds(30));
    holder = std::move(waiter);
  }
  holder->close_stdin();
  (void)holder->finish(std::chrono::seconds(30));
  for (double v : ms) { out.add_takeover_ms(v); }
  std::vector<double> ns(ms.size());
  std::transform(ms.begin(), ms.end(), ns.begin(), [](double v) { return v * 1e6; });
  auto const sm = summarize(ns);
  out.set_p50_ms(sm.p50_us / 1000);
  out.set_p99_ms(sm.p99_us / 1000);
  out.set_max_ms(sm.max_us / 1000);
  out.set_generations_in_order(in_order);
  if (auto mean = daemon_takeover_mean_ms(admin)) { out.set_daemon_takeover_mean_ms(*mean); }
  std::printf(
      "  SIGKILL to the grant at the waiter: p50 %.3f ms, p99 %.3f ms, max %.3f ms; "
      "the daemon's part (session end to grant), mean %.3f ms; generations %s\n",
      out.p50_ms(),
      out.p99_ms(),
      out.max_ms(),
      out.has_daemon_takeover_mean_ms() ? out.daemon_takeover_mean_ms() : -1.0,
      in_order ? "1, 2, 3, ... in order" : "OUT OF ORDER");
  std::fflush(stdout);
  if (!in_order) { out.set_error("a grant did not carry the next generation"); }
  target_row t{.what     = "l) SIGKILL of the lease holder to the grant at the waiter: p50",
               .measured = out.p50_ms(),
               .limit    = takeover_target_ms,
               .unit     = "ms"};
  out.mutable_target()->set_pass(t.pass() && in_order);
  std::vector<target_row> targets{t};
  if (!in_order) {
    targets.push_back(
        {.what = "l) grants out of generation order", .measured = 1, .limit = 0, .unit = "grants"});
  }
  return targets;
}

int lease_waiter_main(std::string const& dir, std::string const& name)
{
  die_with_parent();
  try {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0) {
      BENCH_CUDA(cudaSetDevice(0));
      BENCH_CUDA(cudaFree(nullptr));  // the context now, not in the measurement
    }
    cudaGetLastError();
    rmmd::session s(rmmd::session::options{.runtime_dir = dir,
                                           .client_name = "rmmd-bench-l-waiter",
                                           .reconnect   = std::chrono::milliseconds(0)});
    say("ready");
    auto buf              = rmmd::shared_buffer::open(s,
                                         name,
                                         {.wait      = std::chrono::seconds(120),
                                                       .access    = rmmd::buffer_access::read_write,
                                                       .exclusive = true});
    auto const at         = steady::now();
    auto const generation = buf.lease_generation();
    if (buf.is_host()) {
      std::memcpy(buf.data(), &generation, sizeof generation);
    } else {
      BENCH_CUDA(cudaMemcpy(buf.data(), &generation, sizeof generation, cudaMemcpyHostToDevice));
    }
    say(format("holding %llu %lld", static_cast<unsigned long long>(generation), ns_of(at)));
    wait_for_stdin_eof();
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

int section_lease_without_gpu(lease_options const& options,
                              std::string const& out_path,
                              std::string const& command)
{
  return run_section_without_gpu(
      "l", "Target (issue 37)", options.quick, out_path, command, [&](results::Run& run) {
        return section_lease(options, *run.mutable_lease());
      });
}

}  // namespace rmmd::bench
