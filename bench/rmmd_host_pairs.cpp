// rmmd_host_pairs: the direct path's cost outside the driver, on any machine.
// It starts `rmmd --backend host` and runs N client
// processes at once, each making direct pairs on the session socket (or,
// with --transport grpc, as gRPC calls: the direct-grpc mode of section c) as
// rmmd::ipc_memory_resource's direct mode makes them: an Allocate round trip,
// then the Free sent without waiting for a reply (what the CUDA host
// function sends once the stream passed the free). The host backend's own
// work per pair is an offset allocator's, well under a microsecond, so what
// this measures is everything between the client and the backend: the
// socket, the daemon's threads, protobuf, the core's ledger.
//
//   rmmd_host_pairs --rmmd PATH [--processes 1,16] [--seconds 2] [--size 256]
//                   [--free oneway|reply] [--transport socket|grpc]
//
// Prints, per process count, the aggregate pairs/s, the p50/p99 of a pair as
// one process saw it, and the daemon's CPU seconds per pair. Exit status 0,
// 1 when a cell failed, 2 on a wrong command line.
//
// Its own client processes: rmmd_host_pairs --worker FREE TRANSPORT SIZE SECONDS

#include "bench/bench_support.hpp"

#include <rmmd/session.hpp>

#include <CLI/CLI.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::bench {
namespace {

bool wait_for_go(std::chrono::milliseconds timeout)
{
  pollfd p{STDIN_FILENO, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) { return false; }
  char c = 0;
  return ::read(STDIN_FILENO, &c, 1) == 1;
}

void say(std::string const& line)
{
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

int worker_main(std::string const& free_mode,
                std::string const& transport,
                std::size_t bytes,
                double seconds)
{
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  try {
    rmmd::session s(rmmd::session::options{
        .client_name = "rmmd-host-pairs",
        .lease_calls = transport == "grpc" ? rmmd::call_transport::grpc
                                           : rmmd::call_transport::session_socket});
    auto const pool   = s.host_pool().id;
    bool const oneway = free_mode == "oneway";
    auto pair         = [&] {
      auto lease = s.allocate(pool, bytes, 256);
      if (oneway) {
        s.free_without_reply(lease.id);
      } else {
        s.free(lease.id);
      }
    };
    for (int i = 0; i < 200; ++i) { pair(); }
    say("ready");
    if (!wait_for_go(std::chrono::seconds(120))) { return 3; }
    std::vector<double> ns;
    ns.reserve(1 << 20);
    auto const start = steady::now();
    auto const stop  = start + std::chrono::duration_cast<steady::duration>(
                                  std::chrono::duration<double>(seconds));
    auto now = start;
    while (now < stop) {
      auto const t0 = now;
      pair();
      now = steady::now();
      ns.push_back(static_cast<double>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - t0).count()));
    }
    auto const sum = summarize(ns);
    char line[200];
    std::snprintf(line,
                  sizeof(line),
                  "done %zu %.0f %.3f %.3f",
                  ns.size(),
                  static_cast<double>(
                      std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count()),
                  sum.p50_us,
                  sum.p99_us);
    say(line);
    return 0;
  } catch (std::exception const& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    say("error " + what);
    return 1;
  }
}

std::string next_line(child_process& p, std::string const& want, steady::time_point deadline)
{
  while (true) {
    auto line = p.read_line(deadline);
    if (!line) {
      throw bench_error("a worker exited or said nothing in time (waiting for " + want + ")");
    }
    if (line->rfind(want, 0) == 0) { return *line; }
    if (line->rfind("error", 0) == 0) { throw bench_error("a worker said: " + *line); }
  }
}

int bench_main(int argc, char** argv)
{
  CLI::App app{"rmmd_host_pairs: direct pairs against rmmd --backend host (bench/README.md)"};
  std::string rmmd_path, free_mode = "oneway", transport = "socket";
  std::vector<int> processes{1, 16};
  double seconds   = 2.0;
  std::size_t size = 256;
  app.add_option("--rmmd", rmmd_path, "The rmmd binary to start")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--processes", processes, "Client process counts, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--seconds", seconds, "Pairs per process for this long")->capture_default_str();
  app.add_option("--size", size, "Bytes per allocation")->capture_default_str();
  app.add_option("--free", free_mode, "oneway: Free without a reply (as direct mode); reply")
      ->check(CLI::IsMember({"oneway", "reply"}))
      ->capture_default_str();
  app.add_option("--transport", transport, "socket: the session socket; grpc: gRPC calls")
      ->check(CLI::IsMember({"socket", "grpc"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  std::vector<std::string> args{"--backend=host", "--host-pool-bytes", "1GiB"};
  daemon_process daemon(bench_daemon(rmmd_path, args, std::chrono::seconds(30)));
  auto const self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::printf("rmmd_host_pairs: %s pairs of %zu B, Free %s, %.1f s per cell; rmmd %s\n",
              transport == "grpc" ? "direct-grpc" : "direct",
              size,
              free_mode == "oneway" ? "without a reply" : "with a reply",
              seconds,
              [&] {
                std::string a;
                for (auto const& s : daemon.argv()) { a += (a.empty() ? "" : " ") + s; }
                return a;
              }()
                  .c_str());
  std::printf("%6s %12s %12s %10s %10s %16s %14s\n",
              "procs",
              "pairs",
              "pairs/s",
              "p50 us",
              "p99 us",
              "daemon cpu us/pair",
              "daemon cpu/wall");
  int failed = 0;
  for (int n : processes) {
    try {
      std::vector<std::unique_ptr<child_process>> workers;
      for (int i = 0; i < n; ++i) {
        workers.push_back(std::make_unique<child_process>(
            std::vector<std::string>{self,
                                     "--worker",
                                     free_mode,
                                     transport,
                                     std::to_string(size),
                                     std::to_string(seconds)},
            std::vector<std::string>{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()}));
      }
      for (auto& w : workers) { next_line(*w, "ready", steady::now() + 60s); }
      auto const cpu0 = cpu_seconds(daemon.pid());
      auto const t0   = steady::now();
      for (auto& w : workers) { w->write_line("go"); }
      double aggregate = 0, pairs = 0, p50 = 0, p99 = 0;
      for (auto& w : workers) {
        auto line = next_line(
            *w, "done", steady::now() + 60s + std::chrono::seconds(static_cast<long>(seconds)));
        double count = 0, ns = 0, a = 0, b = 0;
        if (std::sscanf(line.c_str(), "done %lf %lf %lf %lf", &count, &ns, &a, &b) != 4 ||
            ns <= 0) {
          throw bench_error("a worker said: " + line);
        }
        pairs += count;
        aggregate += count / (ns / 1e9);
        p50 = std::max(p50, a);  // the slowest process's median
        p99 = std::max(p99, b);
      }
      auto const wall = std::chrono::duration<double>(steady::now() - t0).count();
      auto const cpu  = cpu_seconds(daemon.pid()) - cpu0;
      for (auto& w : workers) { w->finish(30s); }
      std::printf("%6d %12.0f %12.0f %10.2f %10.2f %16.2f %14.2f\n",
                  n,
                  pairs,
                  aggregate,
                  p50,
                  p99,
                  cpu / pairs * 1e6,
                  cpu / wall);
    } catch (std::exception const& e) {
      std::printf("%6d ERROR: %s\n", n, e.what());
      failed = 1;
    }
    std::fflush(stdout);
  }
  return failed;
}

}  // namespace
}  // namespace rmmd::bench

int main(int argc, char** argv)
{
  if (argc == 6 && std::string(argv[1]) == "--worker") {
    return rmmd::bench::worker_main(argv[2], argv[3], std::stoull(argv[4]), std::stod(argv[5]));
  }
  return rmmd::bench::bench_main(argc, argv);
}
