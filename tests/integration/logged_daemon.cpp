#include "tests/integration/logged_daemon.hpp"

#include "client/detail/session_impl.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
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
  dir_        = tmpl;
  auto notify = dir_ / "notify.sock";
  notify_fd_  = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify.c_str(), sizeof(addr.sun_path) - 1);
  if (::bind(notify_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    throw std::system_error(errno, std::generic_category(), "bind " + notify.string());
  }
  std::vector<std::string> argv{program_path("rmmd").string(), "--runtime-dir", dir_.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  daemon_ = std::make_unique<child_process>(
      argv, std::vector<std::string>{"NOTIFY_SOCKET=" + notify.string()}, /*merge_stderr=*/true);
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
  ::close(notify_fd_);
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
  while (true) {
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) { return std::nullopt; }
    auto line = daemon_->read_line(left);
    if (!line) { return std::nullopt; }
    log_ += *line + "\n";
    if (line->find(text) != std::string::npos) { return line; }
  }
}

std::optional<std::string> logged_daemon::wait_notify(std::string_view text,
                                                      std::chrono::milliseconds timeout)
{
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) { return std::nullopt; }
    pollfd p{notify_fd_, POLLIN, 0};
    // Wake now and then to notice a daemon that died: it will say nothing more.
    if (::poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 100))) <= 0) {
      if (daemon_->wait(0ms)) { return std::nullopt; }
      continue;
    }
    char buf[4096];
    auto n = ::recv(notify_fd_, buf, sizeof(buf), 0);
    if (n <= 0) { continue; }
    std::string message(buf, static_cast<std::size_t>(n));
    if (message.find(text) != std::string::npos) { return message; }
  }
}

v1::Stats stats_of(rmmd::session const& s)
{
  auto& impl = s.impl();
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
