#include "bench/section_support.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

namespace rmmd::bench {

void check_cuda(cudaError_t e, char const* call, char const* file, int line)
{
  if (e != cudaSuccess) {
    throw bench_error(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" +
                      cudaGetErrorString(e) + ") at " + file + ":" + std::to_string(line));
  }
}

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

int run_section_without_gpu(std::string const& section,
                            std::string const& title,
                            bool quick,
                            std::string const& out_path,
                            std::string const& command,
                            std::function<std::vector<target_row>(results::Run&)> const& measure)
{
  auto const started = steady::now();
  results::Run run;
  run.set_schema("rmmd-bench/1");
  run.set_command(command);
  auto const now = std::time(nullptr);
  char utc[32];
  std::strftime(utc, sizeof(utc), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  run.set_started_utc(utc);
  run.set_quick(quick);
  run.add_sections(section);
  char host[256]{};
  ::gethostname(host, sizeof(host) - 1);
  run.mutable_host()->set_hostname(host);
  run.mutable_host()->set_cpus(std::thread::hardware_concurrency());
  std::printf("rmmd_bench without a GPU: section %s's host figures only%s\n",
              section.c_str(),
              quick ? ", --quick" : "");
  std::vector<target_row> targets;
  try {
    targets = measure(run);
  } catch (std::exception const& e) {
    run.add_errors(section + ": " + e.what());
    std::printf("  ERROR (%s): %s\n", section.c_str(), e.what());
  }
  print_targets(title, targets, run);
  run.set_seconds(seconds_between(started, steady::now()));
  std::ofstream file(out_path, std::ios::trunc);
  file << results_json(run);
  if (!file) {
    std::fprintf(stderr, "rmmd_bench: writing %s failed\n", out_path.c_str());
    return 1;
  }
  std::printf("\nwrote %s in %.0f s\n", out_path.c_str(), seconds_between(started, steady::now()));
  return run.errors().empty() ? 0 : 1;
}

double ns_between(steady::time_point a, steady::time_point b)
{
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

double seconds_between(steady::time_point a, steady::time_point b)
{
  return std::chrono::duration<double>(b - a).count();
}

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

rmmd::session open_session(std::string name, call_transport transport)
{
  return rmmd::session(
      rmmd::session::options{.client_name = std::move(name), .lease_calls = transport});
}

ipc_memory_resource make_ipc_resource(session s, allocation_mode mode)
{
  ipc_resource_options options;
  options.mode = mode;
  return ipc_memory_resource(std::move(s), options);
}

v1::Stats get_stats(rmmd::session const& s, rmmd::session_listing which)
{
  return parse_json<v1::Stats>(rmmd::admin(s).stats_json(which));
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

stream_holder::stream_holder()
{
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

stream_holder::~stream_holder()
{
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

std::string run_state::check(target_row t)
{
  targets.push_back(t);
  return t.pass() ? "pass" : "MISS";
}

void run_state::error(std::string const& section, std::string const& what)
{
  errors.push_back(section + ": " + what);
  std::printf("  ERROR (%s): %s\n", section.c_str(), what.c_str());
  std::fflush(stdout);
}

results::Target target_result(target_row const& t)
{
  results::Target out;
  out.set_target(std::string(t.at_most ? "<= " : ">= ") + format("%g", t.limit) + " " + t.unit);
  out.set_pass(t.pass());
  return out;
}

std::uint32_t u32(std::size_t n)
{
  if (n > std::numeric_limits<std::uint32_t>::max()) {
    throw bench_error(std::to_string(n) + " does not fit the results' 32-bit count");
  }
  return static_cast<std::uint32_t>(n);
}

config config::make(bool quick)
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

std::vector<std::string> self_env()
{
  return {"RMMD_BENCH_PARENT=" + std::to_string(::getpid())};
}

std::string self_path()
{
  return std::filesystem::read_symlink("/proc/self/exe").string();
}

void die_with_parent()
{
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (char const* p = std::getenv("RMMD_BENCH_PARENT"); p != nullptr) {
    if (std::to_string(::getppid()) != p) { std::_Exit(4); }
  }
}

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

}  // namespace rmmd::bench
