#include "tests/tools/daemon_process.hpp"

#include "client/detail/session_impl.hpp"

#include <gtest/gtest.h>

#include <google/protobuf/util/json_util.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace rmmd::test {
namespace {

/// A datagram socket like systemd's notify socket; returns its fd.
int notify_socket(std::filesystem::path const& path)
{
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    throw std::runtime_error("bind notify socket " + path.string());
  }
  return fd;
}

/// Waits for READY=1 on `fd`; false at the deadline or once `daemon` has exited.
bool wait_ready(int fd, child_process& daemon, std::chrono::milliseconds timeout)
{
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline && !daemon.wait(0ms)) {
    // Wake now and then to notice a daemon that died before it was ready.
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) { continue; }
    char buf[4096];
    auto n = ::recv(fd, buf, sizeof(buf) - 1, 0);
    if (n > 0 && std::string_view(buf, static_cast<std::size_t>(n)).find("READY=1") !=
                     std::string_view::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

daemon_process::daemon_process(std::vector<std::string> extra_args)
{
  char tmpl[] = "/tmp/rmmd-test-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) { throw std::runtime_error("mkdtemp"); }
  dir_          = tmpl;
  auto notify   = dir_ / "notify.sock";
  int notify_fd = notify_socket(notify);
  std::vector<std::string> argv{program_path("rmmd").string(), "--runtime-dir", dir_.string()};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  daemon_ = std::make_unique<child_process>(
      argv, std::vector<std::string>{"NOTIFY_SOCKET=" + notify.string()});
  daemon_->close_stdin();
  bool ready = wait_ready(notify_fd, *daemon_, 30s);
  ::close(notify_fd);
  if (!ready) {
    throw std::runtime_error("rmmd did not report READY=1 (it exited, or 30 s passed): " + argv[0]);
  }
}

daemon_process::~daemon_process()
{
  observer_.reset();
  stop();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

rmmd::session daemon_process::open_session(std::string client_name) const
{
  return rmmd::session(
      rmmd::session::options{.runtime_dir = dir_, .client_name = std::move(client_name)});
}

std::optional<int> daemon_process::stop()
{
  observer_.reset();
  if (auto s = daemon_->wait(0ms)) { return s; }
  daemon_->kill(SIGTERM);
  return daemon_->wait(30s);
}

v1::Stats daemon_process::rmmctl_stats() const
{
  auto r =
      run({program_path("rmmctl").string(), "--runtime-dir", dir_.string(), "stats", "--json"});
  EXPECT_EQ(r.status, 0) << r.out;
  v1::Stats stats;
  auto status = google::protobuf::util::JsonStringToMessage(r.out, &stats);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << r.out;
  return stats;
}

v1::Stats daemon_process::stats() const
{
  if (!observer_) { observer_ = std::make_unique<rmmd::session>(open_session("observer")); }
  auto& impl = observer_->impl();
  v1::Stats stats;
  auto ctx    = impl.context();
  auto status = impl.stub().GetStats(ctx.get(), v1::GetStatsRequest{}, &stats);
  if (!status.ok()) { throw std::runtime_error("GetStats: " + status.error_message()); }
  return stats;
}

std::uint64_t in_use(v1::Stats const& stats, std::uint32_t pool_id)
{
  for (auto const& p : stats.pools()) {
    if (p.pool().id() == pool_id) { return p.in_use_bytes(); }
  }
  return 0;
}

}  // namespace rmmd::test
