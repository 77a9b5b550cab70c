// rmmctl: the operator's view of the node's rmmd.
//
//   rmmctl [--runtime-dir DIR] COMMAND [--json] [--watch SECONDS [--count N]]
//   COMMAND: stats [--top N | --all] | pools | sessions [--top N | --all]
//            | buffers [--prefix P] [--label KEY=VALUE]... [--peer NODE] | buffers show NAME
//            | health
//            | trim [--pool NAME|ID]... | buffers delete NAME | peers | sleepers [drop NAME]
//
// Exit codes (docs/operations.md): 0 success, 1 an error the daemon reported
// (or another failure), 2 bad usage, 3 no daemon answers at the runtime
// directory (or it is shutting down), 4 permission denied.

#include "common/runtime_dir.hpp"
#include "rmmctl/daemon_connection.hpp"
#include "rmmctl/views.hpp"

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <iostream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace rmmd::ctl;

/// How each frame is printed, and how often.
struct output_options {
  bool json{false};
  double watch_seconds{0};  ///< 0: once
  int count{0};             ///< frames to print with --watch; 0: until interrupted
};

std::int64_t now_unix_ms()
{
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string local_time()
{
  auto const t = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S %Z", &tm);
  return buf;
}

/// Which sessions stats and sessions list: the `top` holding the most bytes
/// (the daemon orders them), or every one by id.
struct session_choice {
  std::uint32_t top{20};
  bool all{false};
};

/// Leaves rmmctl's own session out of a reply listing sessions (Stats,
/// ListSessionsResponse): it is an artefact of asking, so it is not counted
/// in session_count either. rmmctl asked for one more than `choice.top`, so
/// that its own session does not take another's place: the rest is cut.
template <typename Reply>
void drop_own_session(Reply* reply, std::uint64_t id, session_choice const& choice)
{
  auto* sessions = reply->mutable_sessions();
  for (int i = 0; i < sessions->size(); ++i) {
    if (sessions->Get(i).session_id() == id) {
      sessions->DeleteSubrange(i, 1);
      break;
    }
  }
  if (reply->session_count() > 0) { reply->set_session_count(reply->session_count() - 1); }
  if (!choice.all && sessions->size() > static_cast<int>(choice.top)) {
    for (int i = static_cast<int>(choice.top); i < sessions->size(); ++i) {
      reply->set_unlisted_session_bytes(reply->unlisted_session_bytes() + sessions->Get(i).bytes());
      reply->set_unlisted_session_allocations(reply->unlisted_session_allocations() +
                                              sessions->Get(i).allocation_count());
    }
    sessions->DeleteSubrange(static_cast<int>(choice.top),
                             sessions->size() - static_cast<int>(choice.top));
  }
}

/// What the daemon is asked to list for `choice`.
rmmd::session_listing listing(session_choice const& choice)
{
  if (choice.all) { return {}; }
  return {.top = choice.top + 1};
}

/// Adds --top and --all to a command that lists sessions.
void add_session_choice(CLI::App* command, session_choice& choice)
{
  auto* top = command
                  ->add_option("--top",
                               choice.top,
                               "List the N sessions holding the most bytes, most first (a line "
                               "says how many more there are)")
                  ->capture_default_str()
                  ->check(CLI::Range(1, 1000000));
  command->add_flag("--all", choice.all, "List every session, by id")->excludes(top);
}

/// One frame of a command: the text to print (a table, or JSON on one line or
/// indented).
using frame_function = std::function<std::string(bool json_one_line)>;

/// Prints one frame, or with --watch one every `watch_seconds`. The screen is
/// cleared between frames only when stdout is a terminal; elsewhere tables are
/// separated by a blank line and JSON comes one document per line.
int print_frames(std::string const& command, output_options const& out, frame_function frame)
{
  if (out.watch_seconds <= 0) {
    std::cout << frame(false) << std::flush;
    return ok;
  }
  bool const tty      = ::isatty(STDOUT_FILENO) == 1;
  auto const interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(out.watch_seconds));
  auto next = std::chrono::steady_clock::now();
  for (int n = 1;; ++n) {
    auto text = frame(out.json && !tty);
    std::string screen;
    if (tty) { screen += "\033[H\033[2J"; }
    if (!out.json) {
      if (!tty && n > 1) { screen += "\n"; }
      screen += "rmmctl " + command + " every " + CLI::detail::to_string(out.watch_seconds) +
                "s  " + local_time() + "\n\n";
    }
    std::cout << screen << text << std::flush;
    if (out.count > 0 && n >= out.count) { return ok; }
    next += interval;
    std::this_thread::sleep_until(next);
  }
}

/// The pool ids `selectors` (names or ids) name, or a usage error listing
/// the pools there are.
std::vector<std::uint32_t> resolve_pools(rmmd::session const& s,
                                         std::vector<std::string> const& selectors)
{
  std::vector<std::uint32_t> ids;
  for (auto const& sel : selectors) {
    bool found = false;
    for (auto const& p : s.pools()) {
      if (p.name == sel || std::to_string(p.id) == sel) {
        ids.push_back(p.id);
        found = true;
        break;
      }
    }
    if (!found) {
      std::string names;
      for (auto const& p : s.pools()) {
        names += (names.empty() ? "" : ", ") + p.name + " (" + std::to_string(p.id) + ")";
      }
      throw ctl_error(usage, "--pool " + sel + ": no such pool; this daemon has " + names);
    }
  }
  return ids;
}

/// What the command line asked for: the global options, each command's
/// own, and which command was given.
struct command_line {
  std::string runtime_dir = rmmd::session::default_runtime_dir().string();
  output_options out;
  session_choice stats_choice, sessions_choice;
  std::vector<std::string> trim_pools;
  std::string delete_name;
  std::string show_name;
  std::string buffer_prefix;
  std::vector<std::string> buffer_labels;  // "key=value"
  std::string buffer_peer;                 // another node's buffers
  CLI::App* stats{};
  CLI::App* pools{};
  CLI::App* sessions{};
  CLI::App* buffers{};
  CLI::App* buffers_delete{};
  CLI::App* buffers_show{};
  CLI::App* health{};
  CLI::App* trim{};
  CLI::App* peers{};
  CLI::App* sleepers{};
  CLI::App* sleepers_drop{};
  std::string drop_name;
};

void add_global_options(CLI::App& app, command_line& cl)
{
  app.set_version_flag("--version", "rmmctl " RMMD_VERSION);
  app.require_subcommand(1, 1);
  app.fallthrough();  // the options below work after the command too
  app.add_option("--runtime-dir",
                 cl.runtime_dir,
                 std::string("Where rmmd's sockets are (default: $") +
                     rmmd::runtime::runtime_dir_env + ", else " +
                     rmmd::runtime::default_runtime_dir + ")")
      ->capture_default_str();
  app.add_flag("--json", cl.out.json, "protobuf's JSON mapping of the reply instead of a table");
  auto* watch = app.add_option("--watch",
                               cl.out.watch_seconds,
                               "Print again every SECONDS (the screen is cleared between frames "
                               "when stdout is a terminal; JSON comes one document per line "
                               "otherwise)")
                    ->check(CLI::PositiveNumber);
  app.add_option("--count", cl.out.count, "With --watch: stop after N frames")
      ->check(CLI::PositiveNumber)
      ->needs(watch);
}

void add_commands(CLI::App& app, command_line& cl)
{
  cl.stats    = app.add_subcommand("stats", "Pools and sessions with what each holds");
  cl.pools    = app.add_subcommand("pools", "Every pool: configuration, usage, driver figures");
  cl.sessions = app.add_subcommand("sessions", "The live sessions: who, and what they hold");
  add_session_choice(cl.stats, cl.stats_choice);
  add_session_choice(cl.sessions, cl.sessions_choice);
  cl.buffers = app.add_subcommand(
      "buffers",
      "Named shared buffers: name, pool, bytes, creator, holders, state, persistence, write lease");
  cl.buffers_delete = cl.buffers->add_subcommand(
      "delete",
      "Take a buffer's name away now; its memory goes back after its last holder closes it "
      "(the creator's uid or root)");
  cl.buffers_delete->add_option("NAME", cl.delete_name, "The buffer's name")->required();
  cl.buffers->add_option("--prefix", cl.buffer_prefix, "Only buffers whose names start with this");
  cl.buffers->add_option("--label",
                         cl.buffer_labels,
                         "Only buffers whose manifest carries this label, as KEY=VALUE "
                         "(repeatable: all must match)");
  cl.buffers->add_option("--peer",
                         cl.buffer_peer,
                         "Another node's buffers (its name in peering.peers): those its grant "
                         "lets this node open, published and in a fabric pool");
  cl.buffers_show = cl.buffers->add_subcommand(
      "show",
      "One buffer: its figures, labels and tensor table (its manifest); for a model published "
      "per rank or GPU (NAME/rank<r>, NAME/gpu<d>), each part's");
  cl.buffers_show->add_option("NAME", cl.show_name, "The buffer's name")->required();
  cl.health = app.add_subcommand(
      "health", "Serving or draining, uptime, version, pool and session counts (no session)");
  cl.trim = app.add_subcommand(
      "trim",
      "Give memory the pools hold but do not lend back to the driver (root or the daemon's uid)");
  cl.trim->add_option(
      "--pool", cl.trim_pools, "A pool to trim, by name or id (repeatable; default: all)");
  cl.peers    = app.add_subcommand("peers",
                                "Other nodes' daemons this one peers with: state, fabric probe "
                                   "both ways, holds and bytes each way, last contact, problem");
  cl.sleepers = app.add_subcommand(
      "sleepers",
      "Who sleeps (docs/sleep.md): per session or kept backup name, the tags, device bytes given "
      "back, host backup bytes, since when; the node's wake waits and failures");
  cl.sleepers_drop = cl.sleepers->add_subcommand(
      "drop", "Free the host backups kept under a name (its uid's, or any as root)");
  cl.sleepers_drop->add_option("NAME", cl.drop_name, "The backup name")->required();
}

/// Commands that change the daemon's state run once.
void refuse_watching_changes(command_line const& cl)
{
  if (cl.out.watch_seconds <= 0) { return; }
  if (cl.trim->parsed()) {
    throw ctl_error(usage, "--watch does not apply to trim: it changes the pools; run it once");
  }
  if (cl.sleepers_drop->parsed()) {
    throw ctl_error(usage,
                    "--watch does not apply to sleepers drop: it frees backups; run it once");
  }
  if (cl.buffers_delete->parsed()) {
    throw ctl_error(usage,
                    "--watch does not apply to buffers delete: it changes the buffers; run it "
                    "once");
  }
}

int show_stats(daemon_connection& daemon, command_line const& cl)
{
  return print_frames("stats", cl.out, [&](bool one_line) {
    auto const& choice = cl.stats_choice;
    auto reply         = parse_json<rmmd::v1::Stats>(
        ask("stats", [&] { return daemon.admin().stats_json(listing(choice)); }));
    drop_own_session(&reply, daemon.session().id(), choice);
    return cl.out.json ? to_json(reply, one_line) : format_stats(reply);
  });
}

int show_pools(daemon_connection& daemon, command_line const& cl)
{
  return print_frames("pools", cl.out, [&](bool one_line) {
    auto const reply = parse_json<rmmd::v1::ListPoolsResponse>(
        ask("pools", [&] { return daemon.admin().pools_json(); }));
    return cl.out.json ? to_json(reply, one_line) : format_pools(reply);
  });
}

int show_sessions(daemon_connection& daemon, command_line const& cl)
{
  return print_frames("sessions", cl.out, [&](bool one_line) {
    auto const& choice = cl.sessions_choice;
    auto reply         = parse_json<rmmd::v1::ListSessionsResponse>(
        ask("sessions", [&] { return daemon.admin().sessions_json(listing(choice)); }));
    drop_own_session(&reply, daemon.session().id(), choice);
    return cl.out.json ? to_json(reply, one_line) : format_sessions(reply, now_unix_ms());
  });
}

int delete_buffer(daemon_connection& daemon, command_line const& cl)
{
  rmmd::v1::DeleteBufferResponse reply;
  reply.set_holders(static_cast<std::uint32_t>(
      ask("buffers delete", [&] { return daemon.admin().delete_buffer(cl.delete_name); })));
  std::cout << (cl.out.json ? to_json(reply, false) : format_delete(cl.delete_name, reply))
            << std::flush;
  return ok;
}

/// The filters of `rmmctl buffers`.
rmmd::buffer_filter buffer_filter(command_line const& cl)
{
  rmmd::buffer_filter filter{.name_prefix = cl.buffer_prefix, .peer = cl.buffer_peer};
  for (auto const& label : cl.buffer_labels) {
    auto eq = label.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ctl_error(usage, "--label " + label + ": give KEY=VALUE (a value may be empty)");
    }
    filter.labels.insert_or_assign(label.substr(0, eq), label.substr(eq + 1));
  }
  return filter;
}

int show_buffers(daemon_connection& daemon, command_line const& cl)
{
  auto const filter = buffer_filter(cl);
  return print_frames("buffers", cl.out, [&](bool one_line) {
    auto reply = parse_json<rmmd::v1::ListBuffersResponse>(
        ask("buffers", [&] { return daemon.admin().buffers_json(filter); }));
    sort_buffers(&reply);
    if (cl.out.json) { return to_json(reply, one_line); }
    return filter.peer.empty() ? format_buffers(reply, now_unix_ms())
                               : format_peer_buffers(reply, filter.peer, now_unix_ms());
  });
}

/// The buffers of a model published one per rank or per GPU
/// (rmmd.safetensors.publish_dir: NAME/rank<r>, NAME/gpu<d>), by name; none
/// when `name` is not such a model.
std::vector<std::string> model_parts(daemon_connection& daemon, std::string const& name)
{
  auto const listed = parse_json<rmmd::v1::ListBuffersResponse>(ask(
      "buffers show", [&] { return daemon.admin().buffers_json({.name_prefix = name + "/"}); }));
  std::vector<std::string> parts;
  for (auto const& b : listed.buffers()) {
    auto const rest   = std::string_view(b.name()).substr(name.size() + 1);
    auto const kind   = rest.starts_with("rank") ? 4 : rest.starts_with("gpu") ? 3 : 0;
    auto const digits = rest.substr(kind);
    if (kind != 0 && !digits.empty() &&
        digits.find_first_not_of("0123456789") == std::string_view::npos) {
      parts.push_back(b.name());
    }
  }
  std::sort(parts.begin(), parts.end(), [](auto const& x, auto const& y) {
    return std::pair(x.size(), x) < std::pair(y.size(), y);  // rank2 before rank10
  });
  return parts;
}

/// One buffer; or, for a model published per rank or GPU, each part's in
/// turn (under a line naming it; --json: an array of them).
int show_buffer(daemon_connection& daemon, command_line const& cl)
{
  return print_frames("buffers show", cl.out, [&](bool one_line) {
    std::vector<std::string> names{cl.show_name};
    try {
      auto const reply =
          parse_json<rmmd::v1::DescribeBufferResponse>(daemon.admin().buffer_json(cl.show_name));
      return cl.out.json ? to_json(reply, one_line) : format_buffer(reply, now_unix_ms());
    } catch (rmmd::not_found_error const&) {
      names = model_parts(daemon, cl.show_name);
      if (names.empty()) { throw call_failed("buffers show"); }
    } catch (...) {
      throw call_failed("buffers show");
    }
    std::string out = cl.out.json ? "[" : "";
    for (auto const& part : names) {
      auto const reply = parse_json<rmmd::v1::DescribeBufferResponse>(
          ask("buffers show", [&] { return daemon.admin().buffer_json(part); }));
      if (cl.out.json) {
        auto one = to_json(reply, true);
        if (!one.empty() && one.back() == '\n') { one.pop_back(); }
        out += (out.size() > 1 ? "," : "") + one;
      } else {
        out += (out.empty() ? "" : "\n") + std::string("== ") + part + "\n" +
               format_buffer(reply, now_unix_ms());
      }
    }
    return cl.out.json ? out + "]" + (one_line ? "" : "\n") : out;
  });
}

int show_peers(daemon_connection& daemon, command_line const& cl)
{
  return print_frames("peers", cl.out, [&](bool one_line) {
    auto const reply = parse_json<rmmd::v1::ListPeersResponse>(
        ask("peers", [&] { return daemon.admin().peers_json(); }));
    return cl.out.json ? to_json(reply, one_line) : format_peers(reply, now_unix_ms());
  });
}

int show_sleepers(daemon_connection& daemon, command_line const& cl)
{
  return print_frames("sleepers", cl.out, [&](bool one_line) {
    auto const reply = parse_json<rmmd::v1::ListSleepersResponse>(
        ask("sleepers", [&] { return daemon.admin().sleepers_json(); }));
    return cl.out.json ? to_json(reply, one_line) : format_sleepers(reply, now_unix_ms());
  });
}

int drop_backups(daemon_connection& daemon, command_line const& cl)
{
  rmmd::v1::DropBackupsResponse reply;
  reply.set_dropped_bytes(
      ask("sleepers drop", [&] { return daemon.admin().drop_backups(cl.drop_name); }));
  std::cout << (cl.out.json ? to_json(reply, false)
                            : "dropped the backups kept under '" + cl.drop_name +
                                  "': " + human_bytes(reply.dropped_bytes()) + "\n")
            << std::flush;
  return ok;
}

int show_health(daemon_connection& daemon, command_line const& cl)
{
  return print_frames("health", cl.out, [&](bool one_line) {
    auto reply = daemon.health();
    return cl.out.json ? to_json(reply, one_line) : format_health(reply);
  });
}

int trim_pools(daemon_connection& daemon, command_line const& cl)
{
  auto const pools = resolve_pools(daemon.session(), cl.trim_pools);
  auto const reply = parse_json<rmmd::v1::TrimResponse>(
      ask("trim", [&] { return daemon.admin().trim_json(pools); }));
  std::cout << (cl.out.json ? to_json(reply, false) : format_trim(reply)) << std::flush;
  return ok;
}

/// Runs the one command given; its exit code.
int run_command(command_line const& cl)
{
  refuse_watching_changes(cl);
  daemon_connection daemon(cl.runtime_dir);
  // buffers_delete and buffers_show before buffers: both are parsed when the
  // subcommand is.
  std::pair<CLI::App*, int (*)(daemon_connection&, command_line const&)> const commands[] = {
      {cl.stats, show_stats},
      {cl.pools, show_pools},
      {cl.sessions, show_sessions},
      {cl.buffers_delete, delete_buffer},
      {cl.buffers_show, show_buffer},
      {cl.buffers, show_buffers},
      {cl.health, show_health},
      {cl.trim, trim_pools},
      {cl.peers, show_peers},
      {cl.sleepers_drop, drop_backups},
      {cl.sleepers, show_sleepers},
  };
  for (auto const& [command, run] : commands) {
    if (command->parsed()) { return run(daemon, cl); }
  }
  return usage;
}

}  // namespace

int main(int argc, char** argv)
{
  CLI::App app{
      "rmmctl: look at and operate the node's rmmd.\n\n"
      "Exit codes: 0 success; 1 the daemon reported an error (or another failure); 2 bad usage;\n"
      "3 no daemon answers at the runtime directory (or it is shutting down); 4 permission "
      "denied."};
  command_line cl;
  add_global_options(app, cl);
  add_commands(app, cl);
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    return app.exit(e) == 0 ? ok : usage;
  }
  try {
    return run_command(cl);
  } catch (ctl_error const& e) {
    std::cerr << "rmmctl: " << e.what() << '\n';
    return e.code();
  } catch (std::exception const& e) {
    std::cerr << "rmmctl: " << e.what() << '\n';
    return failed;
  }
}
