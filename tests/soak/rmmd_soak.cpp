// rmmd_soak: the kill -9 soak. Starts the real rmmd, then for each of R
// rounds runs N rmmd_soak_client processes at once (posix_spawn) with random
// modes, sizes, lifetimes and endings, SIGKILLs a random share of them at
// random moments, and waits until the daemon's ledger is back at 0 B with no
// session but the soak's own. After the warm-up rounds (first use allocates)
// it takes the daemon's open fds and VmRSS as the baseline; at the end the fd
// count must be back at it and VmRSS within --rss-slack-kib of it, and
// `rmmctl stats --json` must show the ledger at 0.
//
// Every random choice comes from one seeded generator (the seed is printed;
// --seed repeats the choices, though not the timing). Progress goes to
// stderr; the last line on stdout is a JSON summary (one object: counts as
// numbers, the seed as a string).
//
// Exit status: 0 pass, 1 fail (why on stderr and in the summary), 2 bad
// flags, 77 skipped (a CUDA backend where CUDA sees no GPU: ctest's
// SKIP_RETURN_CODE).
//
// CI runs short ones (tests/CMakeLists.txt: soak.host_pool, soak.cuda_pool).
// The long runs:
//   rmmd_soak --backend host --rounds 1000 --clients 8
//   rmmd_soak --backend cuda --rounds 1000 --clients 8   # host, pinned, cuda-direct, cuda-slab
// It finds rmmd, rmmctl and rmmd_soak_client beside itself, in $RMMD_BIN_DIR,
// or in the build tree it was built in.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "harness/daemon_process.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/tools/child_process.hpp"

#include <rmmd/session.hpp>

#include <google/protobuf/util/json_util.h>
#include <CLI/CLI.hpp>

#include <cuda_runtime_api.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rmmd::soak {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using steady = std::chrono::steady_clock;
using test::child_process;

constexpr int exit_skipped = 77;

struct soak_options {
  std::string backend{"host"};
  std::vector<std::string> modes;  // default: by backend
  int clients{8};
  int rounds{20};
  int warmup_rounds{1};
  std::uint64_t seed{0};  // 0: a random one
  int min_lifetime_ms{20};
  int max_lifetime_ms{300};
  int kill_percent{50};
  std::size_t max_bytes{0};  // 0: by backend
  double duration_s{0};      // 0: no limit
  std::size_t rss_slack_kib{1024};
  int progress_every{100};
  std::size_t host_pool_bytes{std::size_t{256} << 20};
  std::size_t cuda_pool_bytes{std::size_t{4} << 30};
  int settle_timeout_s{30};
};

/// What the soak saw; the JSON summary.
struct soak_summary {
  std::string result{"fail"};
  std::string failure;
  std::uint64_t seed{};
  std::string backend;
  std::vector<std::string> modes;
  int clients_per_round{};
  int rounds{};  // measured rounds completed, after the warm-up
  int warmup_rounds{};
  std::uint64_t clients_started{};
  std::uint64_t clients_killed{};
  std::uint64_t clients_completed{};
  std::uint64_t client_ops{};          // reported by clients that completed
  std::uint64_t daemon_allocations{};  // the pools' total_allocations, warm-up included
  std::uint64_t ledger_in_use_bytes{};
  std::uint64_t ledger_allocations{};
  std::uint64_t sessions_left{};  // besides the soak's own
  std::uint64_t fd_baseline{};
  std::uint64_t fd_end{};
  std::uint64_t rss_baseline_kib{};
  std::uint64_t rss_end_kib{};
  std::uint64_t rss_max_kib{};
  std::int64_t daemon_exit_status{-1};
  double wall_seconds{};
};

/// `text` as a JSON string literal.
std::string json_string(std::string_view text)
{
  std::string out = "\"";
  for (char const c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {  // a newline too: \u000a
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// The summary as one line of JSON. Written here, not through
/// google.protobuf.Struct: Struct's code is compiled into the system's
/// libprotobuf, built without ThreadSanitizer, and protobuf's map_field.h
/// gives MapFieldBase two more members when its includer is built with it, so
/// a tsan build's inline map code looks for Struct's map 8 bytes from where
/// libprotobuf put it (DEVELOPERS.md, "Sanitizers").
std::string summary_json(soak_summary const& s)
{
  std::ostringstream out;
  char const* separator = "{";
  auto const field      = [&](std::string_view key, auto const& value) {
    out << separator << json_string(key) << ':' << value;
    separator = ",";
  };
  field("result", json_string(s.result));
  field("failure", json_string(s.failure));
  // A 64-bit seed does not fit a JSON number exactly: as a string.
  field("seed", json_string(std::to_string(s.seed)));
  field("backend", json_string(s.backend));
  std::string modes = "[";
  for (auto const& m : s.modes) { modes += (modes.size() > 1 ? "," : "") + json_string(m); }
  field("modes", modes + "]");
  field("clients_per_round", s.clients_per_round);
  field("rounds", s.rounds);
  field("warmup_rounds", s.warmup_rounds);
  field("clients_started", s.clients_started);
  field("clients_killed", s.clients_killed);
  field("clients_completed", s.clients_completed);
  field("client_ops", s.client_ops);
  field("daemon_allocations", s.daemon_allocations);
  field("ledger_in_use_bytes", s.ledger_in_use_bytes);
  field("ledger_allocations", s.ledger_allocations);
  field("sessions_left", s.sessions_left);
  field("fd_baseline", s.fd_baseline);
  field("fd_end", s.fd_end);
  field("rss_baseline_kib", s.rss_baseline_kib);
  field("rss_end_kib", s.rss_end_kib);
  field("rss_max_kib", s.rss_max_kib);
  field("rss_delta_kib",
        static_cast<long long>(s.rss_end_kib) - static_cast<long long>(s.rss_baseline_kib));
  field("daemon_exit_status", s.daemon_exit_status);
  char wall_seconds[32];
  std::snprintf(wall_seconds, sizeof wall_seconds, "%.1f", s.wall_seconds);
  field("wall_seconds", wall_seconds);
  out << '}';
  return out.str();
}

/// A failure of the soak: what went wrong, in words.
struct soak_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::uint64_t open_fds(pid_t pid)
{
  auto const dir = std::filesystem::path("/proc") / std::to_string(pid) / "fd";
  std::error_code ec;
  std::uint64_t n = 0;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    ++n;
  }
  if (ec) { throw soak_failure("cannot list " + dir.string() + ": " + ec.message()); }
  return n;
}

std::uint64_t rss_kib(pid_t pid)
{
  auto const path = "/proc/" + std::to_string(pid) + "/status";
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) { return std::stoull(line.substr(6)); }  // "... kB"
  }
  throw soak_failure("no VmRSS in " + path);
}

/// The real rmmd, and the soak's own session to read its stats through gRPC.
class daemon_under_test {
 public:
  explicit daemon_under_test(soak_options const& o)
  {
    std::vector<std::string> args{"--backend", o.backend};
    args.insert(args.end(), {"--host-pool-bytes", std::to_string(o.host_pool_bytes)});
    if (o.backend == "cuda") {
      args.insert(args.end(), {"--cuda-pool-bytes", std::to_string(o.cuda_pool_bytes)});
    }
    daemon_ = std::make_unique<harness::daemon_process>(
        harness::daemon_process::options{.program     = test::program_path("rmmd"),
                                         .args        = std::move(args),
                                         .dir_prefix  = "rmmd-soak-",
                                         .log_to_file = true,
                                         .kill_last   = true});
    observer_ = std::make_unique<rmmd::session>(
        rmmd::session::options{.runtime_dir = daemon_->runtime_dir(), .client_name = "rmmd_soak"});
  }

  [[nodiscard]] harness::daemon_process& process() noexcept
  {
    return *daemon_;
  }
  [[nodiscard]] std::filesystem::path const& runtime_dir() const noexcept
  {
    return daemon_->runtime_dir();
  }

  [[nodiscard]] v1::Stats stats() const
  {
    auto& impl = rmmd::detail::impl_of(*observer_);
    v1::Stats stats;
    auto ctx    = impl.context();
    auto status = impl.stub().GetStats(ctx.get(), v1::GetStatsRequest{}, &stats);
    if (!status.ok()) { throw soak_failure("GetStats failed: " + status.error_message()); }
    return stats;
  }

  /// `rmmctl stats --json`, parsed back with protobuf's JSON mapping.
  [[nodiscard]] v1::Stats rmmctl_stats() const
  {
    auto r = test::run({test::program_path("rmmctl").string(),
                        "--runtime-dir",
                        runtime_dir().string(),
                        "stats",
                        "--json"});
    if (r.status != 0) {
      throw soak_failure("rmmctl stats --json exited with " + std::to_string(r.status) + ": " +
                         r.out);
    }
    v1::Stats stats;
    if (auto s = google::protobuf::util::JsonStringToMessage(r.out, &stats); !s.ok()) {
      throw soak_failure("rmmctl stats --json printed no Stats (" + s.ToString() + "): " + r.out);
    }
    return stats;
  }

  /// What still differs from an idle daemon with only our session; empty
  /// when the ledger is at 0.
  [[nodiscard]] std::string not_settled(v1::Stats const& stats) const
  {
    std::ostringstream why;
    for (auto const& p : stats.pools()) {
      if (p.in_use_bytes() != 0 || p.allocation_count() != 0 || p.carved_bytes() != 0 ||
          p.carved_allocations() != 0) {
        why << "pool '" << p.pool().name() << "' holds " << p.in_use_bytes() << " B in "
            << p.allocation_count() << " allocation(s), " << p.carved_bytes() << " B carved; ";
      }
      if (p.has_backend_used_bytes() && p.backend_used_bytes() != 0) {
        why << "pool '" << p.pool().name() << "': the backend still counts "
            << p.backend_used_bytes() << " B used; ";
      }
    }
    for (auto const& s : stats.sessions()) {
      if (s.session_id() != observer_->id()) {
        why << "session " << s.session_id() << " (pid " << s.pid() << ", " << s.client_name()
            << ") is still open; ";
      }
    }
    return why.str();
  }

  [[nodiscard]] std::uint64_t observer_id() const noexcept
  {
    return observer_->id();
  }

  /// Closes our session, SIGTERM, and the exit status; nullopt if rmmd did
  /// not stop within 30 s.
  std::optional<int> stop()
  {
    observer_.reset();
    return daemon_->stop(30s);
  }

 private:
  std::unique_ptr<harness::daemon_process> daemon_;
  std::unique_ptr<rmmd::session> observer_;
};

/// One soak client: what was chosen for it, and its process.
struct client_run {
  std::string mode;
  std::string ending;
  std::uint64_t seed{};
  milliseconds lifetime{};
  std::optional<steady::time_point> kill_at;
  steady::time_point started;
  std::unique_ptr<child_process> process;
  std::string describe() const
  {
    return "client pid " + std::to_string(process->pid()) + " (" + mode + " " +
           std::to_string(seed) + " " + std::to_string(lifetime.count()) + " ms, " + ending + ")";
  }
};

class soak {
 public:
  soak(soak_options options, soak_summary& summary)
      : o_(std::move(options)), summary_(summary), rng_(o_.seed)
  {
    if (o_.modes.empty()) {
      o_.modes = o_.backend == "cuda"
                     ? std::vector<std::string>{"host", "pinned", "cuda-direct", "cuda-slab"}
                     : std::vector<std::string>{"host"};
    }
    if (o_.max_bytes == 0) { o_.max_bytes = o_.backend == "cuda" ? 16 << 20 : 1 << 20; }
    summary_.seed              = o_.seed;
    summary_.backend           = o_.backend;
    summary_.modes             = o_.modes;
    summary_.clients_per_round = o_.clients;
    summary_.warmup_rounds     = o_.warmup_rounds;
  }

  void run()
  {
    daemon_under_test daemon(o_);
    daemon_ = &daemon;
    try {
      run_rounds(daemon);
    } catch (soak_failure const&) {
      std::fprintf(stderr, "rmmd_soak: rmmd's log ends:\n%s", daemon.process().log_tail().c_str());
      throw;
    }
    auto const status           = daemon.stop();
    summary_.daemon_exit_status = status.value_or(-1);
    if (status != 0) {
      throw soak_failure("rmmd did not stop cleanly on SIGTERM (status " +
                         (status ? std::to_string(*status) : "none within 30 s") + ")");
    }
  }

 private:
  void run_rounds(daemon_under_test& daemon)
  {
    auto const start = steady::now();
    auto const pid   = daemon.process().pid();
    std::fprintf(stderr,
                 "rmmd_soak: seed %llu (rerun with --seed %llu), backend %s, %d clients a round, "
                 "%d+%d rounds; rmmd pid %d in %s\n",
                 static_cast<unsigned long long>(o_.seed),
                 static_cast<unsigned long long>(o_.seed),
                 o_.backend.c_str(),
                 o_.clients,
                 o_.warmup_rounds,
                 o_.rounds,
                 static_cast<int>(pid),
                 daemon.runtime_dir().c_str());

    for (int r = 0; r < o_.warmup_rounds; ++r) { round(); }
    summary_.fd_baseline      = open_fds(pid);
    summary_.rss_baseline_kib = rss_kib(pid);
    summary_.rss_max_kib      = summary_.rss_baseline_kib;
    std::fprintf(stderr,
                 "rmmd_soak: baseline after %d warm-up round(s): %llu fds, VmRSS %llu KiB\n",
                 o_.warmup_rounds,
                 static_cast<unsigned long long>(summary_.fd_baseline),
                 static_cast<unsigned long long>(summary_.rss_baseline_kib));

    for (int r = 1; r <= o_.rounds; ++r) {
      round();
      summary_.rounds      = r;
      auto const rss       = rss_kib(pid);
      summary_.rss_max_kib = std::max(summary_.rss_max_kib, rss);
      if (o_.progress_every > 0 && r % o_.progress_every == 0) {
        std::fprintf(stderr,
                     "rmmd_soak: round %d/%d: %llu clients, %llu killed; rmmd %llu fds, VmRSS "
                     "%llu KiB\n",
                     r,
                     o_.rounds,
                     static_cast<unsigned long long>(summary_.clients_started),
                     static_cast<unsigned long long>(summary_.clients_killed),
                     static_cast<unsigned long long>(open_fds(pid)),
                     static_cast<unsigned long long>(rss));
      }
      auto const elapsed = std::chrono::duration<double>(steady::now() - start).count();
      if (o_.duration_s > 0 && elapsed >= o_.duration_s && r < o_.rounds) {
        std::fprintf(stderr, "rmmd_soak: --duration-s reached after %d rounds\n", r);
        break;
      }
    }

    check_end(daemon, pid);
  }

  /// One round: N clients at once, some killed at random moments; then the
  /// ledger must come back to 0.
  void round()
  {
    auto const client = test::program_path("rmmd_soak_client").string();
    auto const env =
        std::vector<std::string>{"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()};
    std::uniform_int_distribution<std::size_t> pick_mode(0, o_.modes.size() - 1);
    std::uniform_int_distribution<int> pick_lifetime(o_.min_lifetime_ms, o_.max_lifetime_ms);
    std::bernoulli_distribution pick_victim(o_.kill_percent / 100.0);
    char const* const endings[] = {"free", "leave", "exit"};
    std::uniform_int_distribution<int> pick_ending(0, 2);

    std::vector<client_run> clients;
    clients.reserve(static_cast<std::size_t>(o_.clients));
    for (int i = 0; i < o_.clients; ++i) {
      client_run c;
      c.mode     = o_.modes[pick_mode(rng_)];
      c.ending   = endings[pick_ending(rng_)];
      c.seed     = rng_() >> 1;
      c.lifetime = milliseconds(pick_lifetime(rng_));
      // A kill lands anywhere from the start-up (CUDA clients take longer to
      // open their session) to just past the end of the client's work.
      auto const startup = c.mode == "host" ? 20ms : 300ms;
      auto const window  = c.lifetime + startup + 20ms;
      std::optional<milliseconds> kill_after;
      if (pick_victim(rng_)) {
        kill_after =
            milliseconds(std::uniform_int_distribution<milliseconds::rep>(0, window.count())(rng_));
      }
      c.started = steady::now();
      c.process = std::make_unique<child_process>(
          std::vector<std::string>{client,
                                   c.mode,
                                   std::to_string(c.seed),
                                   std::to_string(c.lifetime.count()),
                                   std::to_string(o_.max_bytes),
                                   c.ending},
          env,
          test::spawn_options{.merge_stderr = true});
      if (kill_after) { c.kill_at = c.started + *kill_after; }
      ++summary_.clients_started;
      clients.push_back(std::move(c));
    }

    // The victims in the order of their kill moments, then the rest.
    std::vector<client_run*> order;
    for (auto& c : clients) { order.push_back(&c); }
    std::stable_sort(order.begin(), order.end(), [](client_run const* a, client_run const* b) {
      if (a->kill_at.has_value() != b->kill_at.has_value()) { return a->kill_at.has_value(); }
      return a->kill_at && *a->kill_at < *b->kill_at;
    });
    for (auto* c : order) { finish(*c); }

    // Every session closed, every lease and slab freed.
    std::string why;
    bool const settled = test::eventually(
        [&] {
          if (!daemon_->process().alive()) { throw soak_failure("rmmd died"); }
          why = daemon_->not_settled(daemon_->stats());
          return why.empty();
        },
        std::chrono::seconds(o_.settle_timeout_s));
    if (!settled) {
      throw soak_failure("the ledger did not come back to 0 within " +
                         std::to_string(o_.settle_timeout_s) + " s: " + why + "\n" +
                         daemon_->stats().DebugString());
    }
  }

  /// Waits for a client to end (a victim: until its kill moment, then
  /// SIGKILL) and checks what it said.
  void finish(client_run& c)
  {
    auto& p     = *c.process;
    bool killed = false;
    std::optional<int> status;
    if (c.kill_at) {
      status = p.wait(*c.kill_at);
      if (!status) {
        p.kill(SIGKILL);
        killed = true;
        status = p.wait(30s);
      }
    } else {
      status = p.wait(c.started + c.lifetime + 60s);
    }
    if (!status) {
      p.kill(SIGKILL);
      throw soak_failure(c.describe() +
                         (killed ? " did not die of SIGKILL within 30 s"
                                 : " did not exit within 60 s of its lifetime") +
                         "; its output:\n" + p.read_all(1s));
    }
    if (killed && *status == 128 + SIGKILL) {
      ++summary_.clients_killed;
      return;
    }
    // It ended on its own (a victim may, just before its moment).
    auto const out = p.read_all(5s);
    std::istringstream lines(out);
    bool done = false;
    std::string unexpected;
    for (std::string line; std::getline(lines, line);) {
      unsigned long long ops = 0, allocations = 0;
      if (std::sscanf(line.c_str(), "done %llu %llu", &ops, &allocations) == 2) {
        done = true;
        summary_.client_ops += ops;
        continue;
      }
      // Documented: a slab resource destroyed while buffers are carved says so once.
      if (c.mode == "cuda-slab" && c.ending == "leave" &&
          line.find("still carved; its slabs stay leased") != std::string::npos) {
        continue;
      }
      unexpected += "  " + line + "\n";
    }
    if (*status != 0 || !done || !unexpected.empty()) {
      throw soak_failure(c.describe() + " exited with status " + std::to_string(*status) +
                         (done ? "" : " without reporting done") + "; its output:\n" + out);
    }
    ++summary_.clients_completed;
  }

  void check_end(daemon_under_test& daemon, pid_t pid)
  {
    // The daemon closes a session's fds as it notices the close: wait for it.
    bool const fds_back = test::eventually(
        [&] { return (summary_.fd_end = open_fds(pid)) == summary_.fd_baseline; }, 10s);
    auto const within_slack = [&] {
      summary_.rss_end_kib = rss_kib(pid);
      auto const delta     = static_cast<long long>(summary_.rss_end_kib) -
                         static_cast<long long>(summary_.rss_baseline_kib);
      return std::llabs(delta) <= static_cast<long long>(o_.rss_slack_kib);
    };
    bool const rss_back = test::eventually(within_slack, 5s);
    // Through rmmctl as an operator sees it, besides our own gRPC view.
    auto const stats = daemon.rmmctl_stats();
    for (auto const& p : stats.pools()) {
      summary_.ledger_in_use_bytes += p.in_use_bytes();
      summary_.ledger_allocations += p.allocation_count();
      summary_.daemon_allocations += p.total_allocations();
    }
    for (auto const& s : stats.sessions()) {
      if (s.session_id() != daemon.observer_id()) { ++summary_.sessions_left; }
    }
    if (auto why = daemon.not_settled(stats); !why.empty()) {
      throw soak_failure("rmmctl stats shows the ledger not at 0: " + why);
    }
    std::fprintf(stderr,
                 "rmmd_soak: end: %llu fds (baseline %llu), VmRSS %llu KiB (baseline %llu, max "
                 "%llu)\n",
                 static_cast<unsigned long long>(summary_.fd_end),
                 static_cast<unsigned long long>(summary_.fd_baseline),
                 static_cast<unsigned long long>(summary_.rss_end_kib),
                 static_cast<unsigned long long>(summary_.rss_baseline_kib),
                 static_cast<unsigned long long>(summary_.rss_max_kib));
    if (!fds_back) {
      throw soak_failure("rmmd holds " + std::to_string(summary_.fd_end) + " fds, " +
                         std::to_string(summary_.fd_baseline) + " after the warm-up");
    }
    if (!rss_back) {
      throw soak_failure("rmmd's VmRSS is " + std::to_string(summary_.rss_end_kib) + " KiB, " +
                         std::to_string(summary_.rss_baseline_kib) +
                         " KiB after the warm-up: more than " + std::to_string(o_.rss_slack_kib) +
                         " KiB apart");
    }
  }

  soak_options o_;
  soak_summary& summary_;
  std::mt19937_64 rng_;
  daemon_under_test* daemon_{};
};

int gpu_count()
{
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

void on_signal(int signal)
{
  harness::kill_all_children();
  ::signal(signal, SIG_DFL);
  ::raise(signal);
}

int soak_main(int argc, char** argv)
{
  soak_options o;
  CLI::App app{
      "rmmd_soak: SIGKILLs random rmmd clients at random moments, round after round, "
      "and checks that the daemon's ledger, fds and RSS come back"};
  app.add_option("--backend", o.backend, "host: the host pool only; cuda: CUDA pool and host pool")
      ->check(CLI::IsMember({"host", "cuda"}));
  app.add_option("--modes",
                 o.modes,
                 "Client modes to pick from (default host; with --backend cuda: host, pinned, "
                 "cuda-direct, cuda-slab)")
      ->delimiter(',')
      ->check(CLI::IsMember({"host", "pinned", "cuda-direct", "cuda-slab"}));
  app.add_option("-n,--clients", o.clients, "Clients at once in each round")
      ->check(CLI::Range(1, 200));
  app.add_option("-r,--rounds", o.rounds, "Rounds after the warm-up")
      ->check(CLI::Range(1, 10000000));
  app.add_option("--warmup-rounds", o.warmup_rounds, "Rounds before the baseline is taken")
      ->check(CLI::Range(1, 1000));
  app.add_option("--seed", o.seed, "Seed of every random choice; 0: a random one");
  app.add_option("--min-lifetime-ms", o.min_lifetime_ms, "Shortest client lifetime")
      ->check(CLI::Range(0, 600000));
  app.add_option("--max-lifetime-ms", o.max_lifetime_ms, "Longest client lifetime")
      ->check(CLI::Range(0, 600000));
  app.add_option("--kill-percent", o.kill_percent, "Share of the clients SIGKILLed")
      ->check(CLI::Range(0, 100));
  app.add_option("--max-bytes",
                 o.max_bytes,
                 "Largest allocation (default 1 MiB on the host backend, 16 MiB on cuda)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--duration-s", o.duration_s, "Stop after the round that passes this; 0: none")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rss-slack-kib", o.rss_slack_kib, "How far VmRSS may end from its baseline");
  app.add_option("--progress-every", o.progress_every, "A progress line every N rounds; 0: none");
  app.add_option("--host-pool-bytes", o.host_pool_bytes, "rmmd --host-pool-bytes")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--cuda-pool-bytes", o.cuda_pool_bytes, "rmmd --cuda-pool-bytes (--backend cuda)")
      ->transform(CLI::AsSizeValue(false));
  app.add_option("--settle-timeout-s",
                 o.settle_timeout_s,
                 "How long the ledger may take to come back to 0 after a round")
      ->check(CLI::Range(1, 3600));
  CLI11_PARSE(app, argc, argv);
  if (o.min_lifetime_ms > o.max_lifetime_ms) {
    std::fprintf(stderr, "rmmd_soak: --min-lifetime-ms is above --max-lifetime-ms\n");
    return 2;
  }
  bool const device_modes =
      std::any_of(o.modes.begin(), o.modes.end(), [](std::string const& m) { return m != "host"; });
  if (o.backend == "host" && device_modes) {
    std::fprintf(stderr, "rmmd_soak: modes other than host need --backend cuda\n");
    return 2;
  }
  if (o.backend == "cuda" && gpu_count() == 0) {
    std::printf("rmmd_soak: skipped: --backend cuda needs a CUDA GPU, and CUDA sees none\n");
    return exit_skipped;
  }
  if (o.seed == 0) {
    o.seed = (std::uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  }

  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGINT, on_signal);
  ::signal(SIGTERM, on_signal);

  soak_summary summary;
  auto const start = steady::now();
  int status       = 1;
  try {
    soak(o, summary).run();
    summary.result = "pass";
    status         = 0;
  } catch (std::exception const& e) {
    summary.failure = e.what();
    std::fprintf(stderr,
                 "rmmd_soak: FAILED after %d round(s) (seed %llu): %s\n",
                 summary.rounds,
                 static_cast<unsigned long long>(summary.seed),
                 e.what());
  }
  summary.wall_seconds = std::chrono::duration<double>(steady::now() - start).count();
  std::printf("%s\n", summary_json(summary).c_str());
  return status;
}

}  // namespace
}  // namespace rmmd::soak

int main(int argc, char** argv)
{
  return rmmd::soak::soak_main(argc, argv);
}
