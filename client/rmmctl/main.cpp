// rmmctl: the operator's view of the node's rmmd.
//
// Exit codes: 0 success, 1 an error the daemon reported, 2 bad usage,
// 3 no daemon answers at the runtime directory, 4 permission denied.

#include "client/detail/session_impl.hpp"
#include "client/rmmctl/stats_table.hpp"

#include <rmmd/session.hpp>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <string>

namespace {

enum exit_code : int { ok = 0, daemon_error = 1, usage = 2, no_daemon = 3, denied = 4 };

int run_stats(rmmd::session const& s, bool json)
{
  auto& impl = s.impl();
  rmmd::v1::GetStatsRequest request;
  rmmd::v1::Stats stats;
  auto ctx    = impl.context();
  auto status = impl.stub().GetStats(ctx.get(), request, &stats);
  if (!status.ok()) { rmmd::detail::throw_status(status, "get stats"); }
  // Our own session is an artefact of asking: leave it out of the view.
  auto* sessions = stats.mutable_sessions();
  for (int i = 0; i < sessions->size(); ++i) {
    if (sessions->Get(i).session_id() == s.id()) {
      sessions->DeleteSubrange(i, 1);
      break;
    }
  }
  std::cout << (json ? rmmd::ctl::to_json(stats) : rmmd::ctl::format_stats(stats));
  return ok;
}

}  // namespace

int main(int argc, char** argv)
{
  CLI::App app{"rmmctl: look at and operate the node's rmmd"};
  app.require_subcommand(1);
  std::string runtime_dir = rmmd::session::default_runtime_dir().string();
  bool json               = false;
  app.add_option("--runtime-dir", runtime_dir, "Where rmmd's sockets are (env RMMD_RUNTIME_DIR)")
      ->capture_default_str();
  auto* stats = app.add_subcommand("stats", "Pools and sessions with what each holds");
  stats->add_flag("--json", json, "protobuf JSON instead of a table");
  try {
    app.parse(argc, argv);
  } catch (CLI::ParseError const& e) {
    return app.exit(e) == 0 ? ok : usage;
  }

  try {
    rmmd::session s(rmmd::session::options{.runtime_dir = runtime_dir, .client_name = "rmmctl"});
    if (stats->parsed()) { return run_stats(s, json); }
  } catch (rmmd::session_error const& e) {
    std::cerr << "rmmctl: " << e.what() << '\n';
    return no_daemon;
  } catch (rmmd::permission_error const& e) {
    std::cerr << "rmmctl: " << e.what() << '\n';
    return denied;
  } catch (std::exception const& e) {
    std::cerr << "rmmctl: " << e.what() << '\n';
    return daemon_error;
  }
  return usage;
}
