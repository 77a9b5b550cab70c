#include "tests/integration/logged_daemon.hpp"

#include "tests/tools/daemon_process.hpp"

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"

#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <system_error>

namespace rmmd::test {

using namespace std::chrono_literals;

logged_daemon::logged_daemon(std::vector<std::string> args)
{
  char tmpl[] = "/tmp/rmmd-ops-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    throw std::system_error(errno, std::generic_category(), "mkdtemp");
  }
  dir_    = tmpl;
  notify_ = std::make_unique<harness::notify_socket>(dir_ / "notify.sock");
  std::vector<std::string> argv{program_path("rmmd").string(), "--runtime-dir", dir_.string()};
  args = with_default_backend(std::move(args));
  argv.insert(argv.end(), args.begin(), args.end());
  daemon_ = std::make_unique<child_process>(
      argv, std::vector<std::string>{notify_->env()}, spawn_options{.merge_stderr = true});
  daemon_->close_stdin();
  if (!wait_notify("READY=1", 30s)) {
    throw std::runtime_error("rmmd did not report READY=1; its log:\n" + daemon_->read_all(2s));
  }
}

logged_daemon::~logged_daemon()
{
  if (!daemon_->wait(0ms)) {
    daemon_->kill(SIGTERM);
    daemon_->wait(30s);
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

rmmd::session logged_daemon::open_session(std::string client_name) const
{
  return rmmd::session(
      rmmd::session::options{.runtime_dir = dir_, .client_name = std::move(client_name)});
}

std::optional<std::string> logged_daemon::wait_log(std::string_view text,
                                                   std::chrono::milliseconds timeout)
{
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (auto line = daemon_->read_line(deadline)) {
    log_ += *line + "\n";
    if (line->find(text) != std::string::npos) { return line; }
  }
  return std::nullopt;
}

std::optional<std::string> logged_daemon::wait_notify(std::string_view text,
                                                      std::chrono::milliseconds timeout)
{
  return notify_->wait_for(text, *daemon_, std::chrono::steady_clock::now() + timeout);
}

v1::Stats stats_of(rmmd::session const& s)
{
  auto& impl = rmmd::detail::impl_of(s);
  v1::Stats stats;
  auto ctx    = impl.context();
  auto status = impl.stub().GetStats(ctx.get(), v1::GetStatsRequest{}, &stats);
  if (!status.ok()) { throw std::runtime_error("GetStats: " + status.error_message()); }
  return stats;
}

scratch_dir::scratch_dir()
{
  char tmpl[] = "/tmp/rmmd-conf-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    throw std::system_error(errno, std::generic_category(), "mkdtemp");
  }
  path_ = tmpl;
}

scratch_dir::~scratch_dir()
{
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::filesystem::path scratch_dir::write(std::string const& name, std::string const& text) const
{
  auto path = path_ / name;
  // Write a new file and rename it over the old one, as an editor would:
  // a reload never reads half a file.
  auto tmp = path_ / (name + ".new");
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, path);
  return path;
}

}  // namespace rmmd::test
