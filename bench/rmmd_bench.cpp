// rmmd_bench: rmmd against in-process RMM on one GPU, in one run.
//
//   rmmd_bench --rmmd PATH_TO_rmmd --out FILE.json [--quick] [--sections
//   a,a8,b,b2,c,c2,d,e,f,g,h,t,r]
//              [--a8-threads 1,8] [--a8-rounds N]
//              [--restart-buffers N] [--restart-buffer-bytes S]
//
// Starts its own rmmd (temporary runtime directory, --backend=cuda), runs the
// sections (bench/README.md says what each one is; `sections` below lists
// them, each in a file of its own), prints a table per section with its
// targets beside the figures, and writes every figure to FILE.json
// (bench_results.proto). Exit status: 0 when every section ran (a missed
// target is a result, not a failure), 1 when a section failed (the JSON says
// which and why), 2 when there is no GPU or the command line is wrong, 3 when
// the whole run passed --max-seconds.
//
// The same binary is its own helper process, given a helper name first
// (helper_mains.cpp). Without a GPU, `--sections h`, `--sections t` or
// `--sections r` alone runs that section's host figures.

#include "bench/helper_mains.hpp"
#include "bench/section_a8.hpp"
#include "bench/section_g.hpp"
#include "bench/section_h.hpp"
#include "bench/section_l.hpp"
#include "bench/section_p.hpp"
#include "bench/section_r.hpp"
#include "bench/section_t.hpp"
#include "bench/sections.hpp"

#include <CLI/CLI.hpp>

#include <signal.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::bench {
namespace {

/// The command line of a run.
struct bench_options {
  std::string rmmd_path, out_path, pool_bytes = "16GiB";
  bool quick                      = false;
  int max_seconds                 = 540;
  std::string buffer_memory       = "own";
  std::uint64_t release_threshold = 0;
  std::vector<int> a8_threads{1, 8};
  std::size_t a8_rounds = 0;
  // Section r's buffers; bytes 0: 1 GiB on a GPU, 1 MiB on a host pool.
  std::size_t restart_buffers      = 100;
  std::size_t restart_buffer_bytes = 0;
  std::vector<std::string> sections;
  std::string command;  // argv, joined
};

/// What the sections run against, and what they pass on to the next.
struct bench_context {
  bench_options const& options;
  config const& cfg;
  daemon_process& daemon;
  rmmd::session& session;
  rmmd::session& grpc_session;
  std::uint64_t rss_fresh;
  run_state& st;
  pair_p50_map pair_p50;  // section a's, for b
};

void run_a(bench_context& c)
{
  c.pair_p50 = section_pairs(c.cfg, c.session, c.grpc_session, c.st);
}

void run_a8(bench_context& c)
{
  fast_vs_pool_options o;
  if (c.cfg.quick) {
    o.warmup = 20;
    o.pairs  = 300;
    o.rounds = 4;
  }
  o.threads = c.options.a8_threads;
  if (c.options.a8_rounds != 0) { o.rounds = c.options.a8_rounds; }
  auto const got = section_fast_vs_pool(c.session, o, c.st.doc);
  for (auto const& t : got.targets) {
    c.st.targets.push_back({t.what, t.measured, true, t.limit, "x"});
  }
  for (auto const& e : got.errors) { c.st.error("a8", e); }
}

void run_b(bench_context& c)
{
  section_steps(c.cfg, c.session, c.pair_p50, c.st);
}

void run_b2(bench_context& c)
{
  section_daemon_side(c.cfg, c.st);
}

void run_c(bench_context& c)
{
  section_processes(c.cfg, c.daemon, c.st);
}

void run_c2(bench_context& c)
{
  std::string why;
  if (visible_gpus(why) < 2) {
    std::printf("\nc2) skipped: it needs 2 GPUs, %d visible\n", visible_gpus(why));
    return;
  }
  std::printf(
      "\nc2) 16 direct client processes, all on GPU 0, then spread over GPUs 0 and 1 "
      "(worker i on GPU i %% 2): does the driver serialise per device?\n");
  section_processes(c.cfg, c.daemon, c.st, {0});
  section_processes(c.cfg, c.daemon, c.st, {0, 1});
}

void run_d(bench_context& c)
{
  section_setup_and_reclaim(c.cfg, c.daemon, c.session, c.st);
}

void run_e(bench_context& c)
{
  section_rss(c.cfg, c.daemon, c.session, c.rss_fresh, c.st);
}

void run_f(bench_context& c)
{
  section_sharing(c.cfg, c.daemon, c.st);
}

void run_g(bench_context& c)
{
  // Memory that moves, with a daemon of its own.
  auto const g = section_mobility(mobility_config{.trials = c.cfg.quick ? 5 : 20},
                                  c.options.rmmd_path,
                                  self_path(),
                                  self_env(),
                                  c.st.doc.mutable_mobility());
  c.st.check({.what     = "g) idle slabs reach a request: p50",
              .measured = g.p50_ms,
              .limit    = 50,
              .unit     = "ms"});
  c.st.check({.what     = "g) requests idle slabs could serve, refused",
              .measured = static_cast<double>(g.refused),
              .limit    = 0,
              .unit     = "requests"});
}

void run_h(bench_context& c)
{
  auto const targets = section_scale({.rmmd        = c.options.rmmd_path,
                                      .self        = self_path(),
                                      .helper_env  = self_env(),
                                      .quick       = c.cfg.quick,
                                      .cuda_daemon = &c.daemon},
                                     *c.st.doc.mutable_scale());
  for (auto const& t : targets) { (void)c.st.check(t); }
}

void run_t(bench_context& c)
{
  auto const targets = section_tenants({.rmmd       = c.options.rmmd_path,
                                        .self       = self_path(),
                                        .helper_env = self_env(),
                                        .quick      = c.cfg.quick,
                                        .cuda       = true},
                                       *c.st.doc.mutable_tenants());
  for (auto const& t : targets) { (void)c.st.check(t); }
}

/// Section r's options. Without --restart-buffer-bytes: 1 MiB on a host pool;
/// on a GPU 1 GiB, halved until the buffers take at most 60% of GPU 0's free
/// memory (100 GiB fits an H200, not an H100).
restart_options restart_options_of(bench_options const& o, bool cuda)
{
  auto fallback    = cuda ? std::size_t{1} << 30 : std::size_t{1} << 20;
  std::size_t free = 0, total = 0;
  if (cuda && cudaMemGetInfo(&free, &total) == cudaSuccess) {
    while (fallback > (std::size_t{1} << 20) && o.restart_buffers * fallback > free / 10 * 6) {
      fallback /= 2;
    }
  }
  return {.rmmd         = o.rmmd_path,
          .self         = self_path(),
          .helper_env   = self_env(),
          .cuda         = cuda,
          .buffers      = o.restart_buffers,
          .buffer_bytes = o.restart_buffer_bytes != 0 ? o.restart_buffer_bytes : fallback};
}

void run_r(bench_context& c)
{
  auto const targets =
      section_restart(restart_options_of(c.options, true), *c.st.doc.mutable_restart());
  for (auto const& t : targets) { (void)c.st.check(t); }
}

void run_l(bench_context& c)
{
  auto const targets = section_lease({.rmmd       = c.options.rmmd_path,
                                      .self       = self_path(),
                                      .helper_env = self_env(),
                                      .cuda       = true,
                                      .quick      = c.cfg.quick},
                                     *c.st.doc.mutable_lease());
  for (auto const& t : targets) { (void)c.st.check(t); }
}

void run_p(bench_context& c)
{
  section_peering(c.cfg, c.options.rmmd_path, c.st);
}

/// The sections, in the order they run (a run runs those --sections names).
struct section_entry {
  char const* name;
  void (*run)(bench_context&);
};
constexpr std::array<section_entry, 15> sections{{{"a", run_a},
                                                  {"a8", run_a8},
                                                  {"b", run_b},
                                                  {"b2", run_b2},
                                                  {"c", run_c},
                                                  {"c2", run_c2},
                                                  {"d", run_d},
                                                  {"e", run_e},
                                                  {"f", run_f},
                                                  {"g", run_g},
                                                  {"h", run_h},
                                                  {"t", run_t},
                                                  {"r", run_r},
                                                  {"l", run_l},
                                                  {"p", run_p}}};

std::vector<std::string> section_names()
{
  std::vector<std::string> out;
  for (auto const& s : sections) { out.emplace_back(s.name); }
  return out;
}

/// Fills `o` from the command line; returns the exit status when the run
/// ends here (--help: 0; a wrong command line: 2).
std::optional<int> parse_options(int argc, char** argv, bench_options& o)
{
  CLI::App app{
      "rmmd_bench: rmmd's direct and fast paths against in-process RMM on one GPU, in one run "
      "(bench/README.md)"};
  auto const all_sections = section_names();
  o.sections              = all_sections;
  app.add_option("--rmmd", o.rmmd_path, "The rmmd binary to start")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_option("--out", o.out_path, "Where to write the results as JSON")->required();
  app.add_flag("--quick", o.quick, "Fewer pairs and trials (a smoke run, about a minute)");
  app.add_option("--cuda-pool-bytes", o.pool_bytes, "rmmd's --cuda-pool-bytes")
      ->capture_default_str();
  app.add_option("--cuda-shared-buffer-memory",
                 o.buffer_memory,
                 "rmmd's --cuda-shared-buffer-memory (section f: pool or own)")
      ->capture_default_str()
      ->check(CLI::IsMember({"pool", "own"}));
  app.add_option("--cuda-release-threshold",
                 o.release_threshold,
                 "Bytes: rmmd's --cuda-release-threshold and b2's pool's (0, rmmd's default, "
                 "gives memory back at every synchronisation)")
      ->capture_default_str();
  app.add_option("--max-seconds", o.max_seconds, "Kill everything and exit 3 after this long")
      ->capture_default_str()
      ->check(CLI::Range(10, 3600));
  app.add_option("--a8-threads", o.a8_threads, "Section a8's thread counts, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option(
         "--a8-rounds", o.a8_rounds, "Section a8's rounds (0: 24, --quick 4; more for a profile)")
      ->capture_default_str();
  app.add_option("--restart-buffers",
                 o.restart_buffers,
                 "Section r: persistent buffers the restarted daemon serves again")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  app.add_option("--restart-buffer-bytes",
                 o.restart_buffer_bytes,
                 "Section r: each buffer's size (e.g. 1GiB; default 1GiB on a GPU, 1MiB on a "
                 "host pool)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--sections",
                 o.sections,
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
  for (int i = 0; i < argc; ++i) { o.command += (i ? " " : "") + std::string(argv[i]); }
  return std::nullopt;
}

/// Fails now, not after the run, if the JSON cannot be written.
bool out_path_writable(std::string const& out_path)
{
  auto dir = std::filesystem::path(out_path).parent_path();
  if (dir.empty()) { dir = "."; }
  if (!std::filesystem::is_directory(dir) || ::access(dir.c_str(), W_OK) != 0 ||
      std::filesystem::is_directory(out_path)) {
    std::fprintf(stderr,
                 "rmmd_bench: cannot write --out %s: %s is not a writable directory (or the "
                 "path is a directory)\n",
                 out_path.c_str(),
                 dir.c_str());
    return false;
  }
  return true;
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

bool selected(bench_options const& o, std::string const& name)
{
  return std::find(o.sections.begin(), o.sections.end(), name) != o.sections.end();
}

/// The run's description in the results: command, sections, counts, host.
void describe_run(bench_options const& o, config const& cfg, results::Run& doc)
{
  doc.set_schema("rmmd-bench/1");
  doc.set_command(o.command);
  doc.set_started_utc(utc_now());
  doc.set_quick(o.quick);
  for (auto const& s : sections) {
    if (selected(o, s.name)) { doc.add_sections(s.name); }
  }
  auto& c = *doc.mutable_config();
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
  doc.mutable_host()->set_hostname(host);
  doc.mutable_host()->set_kernel(uts.release);
  doc.mutable_host()->set_cpus(std::thread::hardware_concurrency());
}

std::vector<std::string> daemon_args(bench_options const& o)
{
  std::vector<std::string> args{"--backend=cuda",
                                "--cuda-pool-bytes",
                                o.pool_bytes,
                                "--cuda-shared-buffer-memory",
                                o.buffer_memory};
  if (o.release_threshold != 0) {
    args.push_back("--cuda-release-threshold");
    args.push_back(std::to_string(o.release_threshold));
  }
  return args;
}

/// Runs each selected section; one that throws (or finds the daemon gone)
/// is recorded as the section's error and the run goes on.
void run_sections(bench_context& c)
{
  for (auto const& s : sections) {
    if (!selected(c.options, s.name)) { continue; }
    try {
      if (!c.daemon.alive()) {
        throw bench_error("rmmd has exited; its log ends:\n" + c.daemon.log_tail());
      }
      s.run(c);
    } catch (std::exception const& e) {
      c.st.error(s.name, e.what());
    }
  }
}

/// Writes the results to `path` (through a temporary file); false if it cannot.
bool write_results(results::Run const& doc, std::string const& path)
{
  auto tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << results_json(doc);
    if (!out) {
      std::fprintf(stderr, "rmmd_bench: writing %s failed\n", tmp.c_str());
      return false;
    }
  }
  std::filesystem::rename(tmp, path);
  return true;
}

/// Starts the daemon and the bench's sessions, runs the sections and writes
/// the results; returns the exit status.
int run_bench(bench_options const& o, config const& cfg, run_state& st)
{
  auto const started = steady::now();
  BENCH_CUDA(cudaSetDevice(0));
  BENCH_CUDA(cudaFree(nullptr));  // the context now, not inside a measurement
  std::string gpu_name;
  *st.doc.mutable_gpu() = gpu_result(gpu_name);

  daemon_process daemon(bench_daemon(o.rmmd_path, daemon_args(o), std::chrono::seconds(60)));
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
              o.quick ? ", --quick" : "",
              section_list.c_str());
  std::fflush(stdout);
  rmmd::session grpc_session(rmmd::session::options{.runtime_dir = daemon.runtime_dir(),
                                                    .client_name = "rmmd-bench-grpc",
                                                    .lease_calls = call_transport::grpc});
  bench_context context{o, cfg, daemon, session, grpc_session, rss_fresh, st, {}};
  run_sections(context);

  print_targets("Targets (issues 5, 12 and 14)", st.targets, st.doc);
  for (auto const& e : st.errors) { st.doc.add_errors(e); }
  st.doc.set_seconds(seconds_between(started, steady::now()));
  st.doc.set_daemon_log_tail(daemon.log_tail(40));
  if (!write_results(st.doc, o.out_path)) { return 1; }
  std::printf("\nwrote %s (%zu section error(s)) in %.0f s\n",
              o.out_path.c_str(),
              st.errors.size(),
              seconds_between(started, steady::now()));
  return st.errors.empty() ? 0 : 1;
}

int bench_main(int argc, char** argv)
{
  bench_options o;
  if (auto rc = parse_options(argc, argv, o)) { return *rc; }
  std::string why;
  if (visible_gpus(why) == 0 && o.sections == std::vector<std::string>{"h"}) {
    ::signal(SIGPIPE, SIG_IGN);
    return section_scale_without_gpu(
        {.rmmd = o.rmmd_path, .self = self_path(), .helper_env = self_env(), .quick = o.quick},
        o.out_path,
        o.command);
  }
  if (visible_gpus(why) == 0 && o.sections == std::vector<std::string>{"t"}) {
    ::signal(SIGPIPE, SIG_IGN);
    return section_tenants_without_gpu(
        {.rmmd = o.rmmd_path, .self = self_path(), .helper_env = self_env(), .quick = o.quick},
        o.out_path,
        o.command);
  }
  if (visible_gpus(why) == 0 && o.sections == std::vector<std::string>{"r"}) {
    ::signal(SIGPIPE, SIG_IGN);
    return section_restart_without_gpu(restart_options_of(o, false), o.out_path, o.command);
  }
  if (visible_gpus(why) == 0 && o.sections == std::vector<std::string>{"l"}) {
    ::signal(SIGPIPE, SIG_IGN);
    return section_lease_without_gpu(
        {.rmmd = o.rmmd_path, .self = self_path(), .helper_env = self_env(), .quick = o.quick},
        o.out_path,
        o.command);
  }
  if (visible_gpus(why) == 0) {
    std::fprintf(stderr,
                 "rmmd_bench: no CUDA GPU here (%s). It measures rmmd against in-process RMM on "
                 "a GPU: run it on the GPU host (bench/README.md); `--sections h`, `--sections t`, "
                 "`--sections r` or `--sections l` alone runs that section's host figures without "
                 "one.\n",
                 why.c_str());
    return 2;
  }
  if (!out_path_writable(o.out_path)) { return 2; }
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGALRM}) { ::sigaction(sig, &sa, nullptr); }
  ::signal(SIGPIPE, SIG_IGN);
  ::alarm(static_cast<unsigned>(o.max_seconds));

  auto cfg              = config::make(o.quick);
  cfg.release_threshold = o.release_threshold;
  run_state st;
  describe_run(o, cfg, st.doc);
  return run_bench(o, cfg, st);
}

}  // namespace
}  // namespace rmmd::bench

int main(int argc, char** argv)
{
  using namespace rmmd::bench;
  if (int rc = run_helper(argc, argv); rc >= 0) { return rc; }
  try {
    return bench_main(argc, argv);
  } catch (std::exception const& e) {
    // Every child and the daemon are gone by now (their destructors ran).
    std::fprintf(stderr, "rmmd_bench: %s\n", e.what());
    return 1;
  }
}
