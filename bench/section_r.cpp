// Section r of rmmd_bench: a restarted daemon's time to serve its kept
// buffers. See section_r.hpp and bench/README.md.

#include "bench/section_r.hpp"
#include "bench/section_support.hpp"

#include "common/vmm.hpp"
#include "harness/service_manager.hpp"

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::bench {
namespace {

constexpr double serve_target_ms = 2000.0;  // start to every buffer opened, max

std::string buffer_name(std::size_t i)
{
  return "bench-r/" + std::to_string(i);
}

double ms_between(steady::time_point a, steady::time_point b)
{
  return std::chrono::duration<double, std::milli>(b - a).count();
}

steady::time_point from_ns(long long ns)
{
  return steady::time_point(std::chrono::nanoseconds(ns));
}

long long ns_of(steady::time_point t)
{
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// Nearest-rank p50 and the max of `ms`.
std::pair<double, double> p50_max(std::vector<double> ms)
{
  std::sort(ms.begin(), ms.end());
  return {ms[(ms.size() - 1) / 2], ms.back()};
}

/// rmmd under the service manager, in a directory of its own; its stderr in
/// a file there (log_tail()).
class kept_daemon {
 public:
  kept_daemon(std::filesystem::path rmmd, std::vector<std::string> args)
      : rmmd_(std::move(rmmd)), args_(std::move(args))
  {
    char tmpl[] = "/tmp/rmmd-bench-r-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) { throw bench_error("mkdtemp failed"); }
    dir_     = tmpl;
    manager_ = std::make_unique<harness::service_manager>(
        harness::service_manager_options{.notify_socket = dir_ / "notify"});
  }
  kept_daemon(kept_daemon const&)            = delete;
  kept_daemon& operator=(kept_daemon const&) = delete;
  ~kept_daemon()
  {
    manager_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  /// Starts rmmd with the stored fds; returns the start time (just before
  /// the fork). Waiting for READY=1 is the caller's.
  steady::time_point start()
  {
    // The shell redirects stderr and execs rmmd: the manager's main pid.
    std::vector<std::string> argv{"/bin/sh",
                                  "-c",
                                  "exec \"$0\" \"$@\" 2>>'" + (dir_ / "rmmd.log").string() + "'",
                                  rmmd_.string(),
                                  "--runtime-dir",
                                  runtime_dir().string(),
                                  "--state-file",
                                  (dir_ / "buffers.state").string()};
    argv.insert(argv.end(), args_.begin(), args_.end());
    auto const at = steady::now();
    manager_->start(argv);
    return at;
  }
  /// Waits for READY=1; the time it came. Throws with the log's tail.
  steady::time_point wait_ready()
  {
    if (!manager_->wait_for("READY=1", steady::now() + std::chrono::seconds(120))) {
      throw bench_error("rmmd did not say READY=1; its log ends:\n" + log_tail());
    }
    return steady::now();
  }
  void kill()
  {
    auto status = manager_->kill_service(SIGKILL);
    if (!status || !WIFSIGNALED(*status)) { throw bench_error("rmmd was not killed"); }
  }
  harness::service_manager& manager()
  {
    return *manager_;
  }
  [[nodiscard]] std::filesystem::path runtime_dir() const
  {
    return dir_ / "run";
  }
  [[nodiscard]] std::string log_tail() const
  {
    std::ifstream in(dir_ / "rmmd.log");
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) { lines.push_back(line); }
    std::string out;
    for (auto i = lines.size() > 20 ? lines.size() - 20 : 0; i < lines.size(); ++i) {
      out += lines[i] + "\n";
    }
    return out;
  }

 private:
  std::filesystem::path rmmd_;
  std::vector<std::string> args_;
  std::filesystem::path dir_;
  std::unique_ptr<harness::service_manager> manager_;
};

std::unique_ptr<child_process> helper(restart_options const& o, std::vector<std::string> args)
{
  args.insert(args.begin(), o.self.string());
  return std::make_unique<child_process>(args, o.helper_env);
}

/// What this process pays to make and export the buffers' memory anew.
double reallocate_ms(restart_options const& o)
{
  auto const start = steady::now();
  if (!o.cuda) {
    std::vector<int> fds;
    for (std::size_t i = 0; i < o.buffers; ++i) {
      int fd = ::memfd_create("bench-r", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(o.buffer_bytes)) != 0 ||
          ::fallocate(fd, 0, 0, static_cast<off_t>(o.buffer_bytes)) != 0) {
        if (fd >= 0) { ::close(fd); }
        for (int f : fds) { ::close(f); }
        throw bench_error("memfd_create, ftruncate or fallocate failed");
      }
      fds.push_back(fd);
    }
    auto const ms = ms_between(start, steady::now());
    for (int f : fds) { ::close(f); }
    return ms;
  }
  std::string why;
  auto const& api = gpu::vmm(&why);
  if (!api) { throw bench_error(why); }
  auto const prop         = gpu::device_allocation(0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  std::size_t granularity = 0;
  api->granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  auto const bytes = (o.buffer_bytes + granularity - 1) / granularity * granularity;
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<int> fds;
  auto release = [&] {
    for (int f : fds) { ::close(f); }
    for (auto h : handles) { api->mem_release(h); }
  };
  auto const begin = steady::now();
  for (std::size_t i = 0; i < o.buffers; ++i) {
    CUmemGenericAllocationHandle h{};
    int fd = -1;
    auto r = api->mem_create(&h, bytes, &prop, 0);
    if (r == CUDA_SUCCESS) {
      handles.push_back(h);
      r = api->export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    }
    if (r != CUDA_SUCCESS) {
      release();
      throw bench_error("cuMemCreate or export of buffer " + std::to_string(i) + ": " +
                        api->name(r));
    }
    fds.push_back(fd);
  }
  auto const ms = ms_between(begin, steady::now());
  release();
  return ms;
}

void print_row(char const* what, std::vector<double> const& ms)
{
  auto const [p50, max] = p50_max(ms);
  std::string each;
  for (double v : ms) { each += format(" %.1f", v); }
  std::printf("  %-38s p50 %8.1f ms  max %8.1f ms  (each:%s)\n", what, p50, max, each.c_str());
}

}  // namespace

std::vector<target_row> section_restart(restart_options const& o, results::RestartServing& out)
{
  out.set_backend(o.cuda ? "cuda" : "host");
  out.set_buffers(u32(o.buffers));
  out.set_buffer_bytes(static_cast<double>(o.buffer_bytes));
  out.set_repetitions(u32(o.repetitions));
  std::printf(
      "\nr) a restarted daemon's time to serve %zu kept buffers of %s (%s pool), %zu "
      "times\n",
      o.buffers,
      size_name(o.buffer_bytes).c_str(),
      o.cuda ? "GPU 0's" : "a host",
      o.repetitions);
  std::fflush(stdout);
  std::vector<std::string> args{"--drain-timeout-ms", "0"};
  std::string pool;
  if (o.cuda) {
    // Room for every buffer (each its own allocation, charged to the pool)
    // and the helpers' sessions.
    auto const pool_bytes = o.buffers * o.buffer_bytes + (std::size_t{1} << 30);
    args.insert(args.end(), {"--backend=cuda", "--cuda-pool-bytes", std::to_string(pool_bytes)});
  } else {
    auto const pool_bytes = o.buffers * o.buffer_bytes + (std::size_t{64} << 20);
    args.insert(args.end(), {"--backend=host", "--host-pool-bytes", std::to_string(pool_bytes)});
  }
  kept_daemon daemon(o.rmmd, args);
  daemon.start();
  daemon.wait_ready();
  {
    rmmd::session s(rmmd::session::options{.runtime_dir = daemon.runtime_dir(),
                                           .client_name = "rmmd-bench-r",
                                           .reconnect   = std::chrono::milliseconds(0)});
    pool = o.cuda ? s.device_pool(0).name : s.host_pool().name;
  }
  auto const dir = daemon.runtime_dir().string();
  {
    auto publisher      = helper(o,
                            {"--restart-publisher",
                                  dir,
                                  pool,
                                  std::to_string(o.buffers),
                                  std::to_string(o.buffer_bytes)});
    auto const deadline = steady::now() + std::chrono::seconds(600);
    (void)expect_line(*publisher, "the publisher", "ready", deadline);
    publisher->close_stdin();
    publisher->wait(deadline);
  }
  auto const n = o.buffers;
  if (!daemon.manager().wait_for_store(
          [&](std::vector<std::string> const& names) {
            return static_cast<std::size_t>(std::count_if(names.begin(), names.end(), [](auto& s) {
                     return s.starts_with("rmmd-buffer-");
                   })) == n;
          },
          steady::now() + std::chrono::seconds(120))) {
    throw bench_error("the store did not get " + std::to_string(n) +
                      " buffer fds; the log ends:\n" + daemon.log_tail());
  }

  std::vector<double> ready_ms, open_ms;
  for (std::size_t rep = 0; rep < o.repetitions; ++rep) {
    auto opener         = helper(o, {"--restart-opener", dir, std::to_string(n)});
    auto const deadline = steady::now() + std::chrono::seconds(300);
    (void)expect_line(*opener, "the opener", "ready", deadline);
    daemon.kill();
    auto const start = daemon.start();
    opener->write_line("go");
    ready_ms.push_back(ms_between(start, daemon.wait_ready()));
    auto const line          = expect_line(*opener, "the opener", "done", deadline);
    unsigned long long count = 0, readopted = 0;
    long long session_ns = 0, last_ns = 0;
    if (std::sscanf(
            line.c_str(), "done %llu %lld %lld %llu", &count, &session_ns, &last_ns, &readopted) !=
            4 ||
        count != n) {
      throw bench_error("the opener said: " + line);
    }
    open_ms.push_back(ms_between(start, from_ns(last_ns)));
    out.add_readopted_buffers(static_cast<double>(readopted));
    opener->close_stdin();
    opener->wait(deadline);
  }
  for (double v : ready_ms) { out.add_ready_ms(v); }
  for (double v : open_ms) { out.add_all_open_ms(v); }
  auto const [ready_p50, ready_max] = p50_max(ready_ms);
  auto const [open_p50, open_max]   = p50_max(open_ms);
  out.set_ready_p50_ms(ready_p50);
  out.set_ready_max_ms(ready_max);
  out.set_all_open_p50_ms(open_p50);
  out.set_all_open_max_ms(open_max);
  print_row("start to READY=1", ready_ms);
  print_row(format("start to %zu buffers opened by name", n).c_str(), open_ms);
  // The kept buffers go first (100 GiB twice does not fit an H200).
  daemon.kill();
  daemon.manager().clear_store();
  try {
    out.set_reallocate_ms(reallocate_ms(o));
    std::printf("  %-38s %8.1f ms  (%s)\n",
                "baseline: this process makes them anew",
                out.reallocate_ms(),
                o.cuda ? "cuMemCreate + export as POSIX fd" : "memfd + ftruncate + fallocate");
  } catch (std::exception const& e) {
    out.set_error(std::string("baseline: ") + e.what());
    std::printf("  baseline: ERROR %s\n", e.what());
  }
  std::fflush(stdout);
  target_row t{
      .what = format(
          "r) restart to %zu buffers of %s served: max", n, size_name(o.buffer_bytes).c_str()),
      .measured = open_max,
      .limit    = serve_target_ms,
      .unit     = "ms"};
  *out.mutable_target() = target_result(t);
  return {t};
}

int restart_publisher_main(std::string const& dir,
                           std::string const& pool,
                           std::size_t count,
                           std::size_t bytes)
{
  die_with_parent();
  try {
    rmmd::session s(rmmd::session::options{.runtime_dir = dir,
                                           .client_name = "rmmd-bench-r-publisher",
                                           .reconnect   = std::chrono::milliseconds(0)});
    for (std::size_t i = 0; i < count; ++i) {
      auto b = rmmd::shared_buffer::create(
          s, buffer_name(i), bytes, rmmd::shared_buffer_options{.pool = pool, .persistent = true});
      b.publish();
      b.close();
    }
    say("ready " + std::to_string(count));
    wait_for_stdin_eof();
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

int restart_opener_main(std::string const& dir, std::size_t count)
{
  die_with_parent();
  try {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0) {
      BENCH_CUDA(cudaSetDevice(0));
      BENCH_CUDA(cudaFree(nullptr));  // the context now, not in the measurement
    }
    cudaGetLastError();
    say("ready");
    if (!wait_for_stdin_line(std::chrono::seconds(300))) { return 1; }
    std::optional<rmmd::session> s;
    auto const give_up = steady::now() + std::chrono::seconds(120);
    while (!s) {
      try {
        s.emplace(rmmd::session::options{.runtime_dir = dir,
                                         .client_name = "rmmd-bench-r-opener",
                                         .reconnect   = std::chrono::milliseconds(0)});
      } catch (rmmd::session_error const&) {
        if (steady::now() > give_up) { throw; }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    auto const session_at = steady::now();
    std::vector<rmmd::shared_buffer> opened;
    for (std::size_t i = 0; i < count; ++i) {
      opened.push_back(rmmd::shared_buffer::open(*s, buffer_name(i)));
    }
    auto const last_at = steady::now();
    auto const stats   = get_stats(*s);
    say(format("done %zu %lld %lld %llu",
               opened.size(),
               ns_of(session_at),
               ns_of(last_at),
               static_cast<unsigned long long>(stats.restart().readopted_buffers())));
    wait_for_stdin_eof();
    opened.clear();
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

int section_restart_without_gpu(restart_options const& options,
                                std::string const& out_path,
                                std::string const& command)
{
  return run_section_without_gpu(
      "r", "Target (issue 27)", false, out_path, command, [&](results::Run& run) {
        return section_restart(options, *run.mutable_restart());
      });
}

}  // namespace rmmd::bench
