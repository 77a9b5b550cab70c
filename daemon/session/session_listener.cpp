#include "daemon/session/session_listener.hpp"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>
#include <utility>

namespace rmmd::session_socket {
namespace {

[[noreturn]] void throw_errno(std::string const& what)
{
  throw std::system_error(errno, std::generic_category(), what);
}

}  // namespace

session_listener::session_listener(core::daemon_core& core, listener_options options)
    : core_(core),
      options_(std::move(options)),
      admission_(options_.admission, options_.admission_metrics),
      calls_(core_, options_, admission_, open_sessions_),
      hellos_(core_,
              options_,
              admission_,
              open_sessions_,
              [this](int fd, core::session_id session, core::peer_credentials const& peer) {
                calls_.serve(fd, session, peer);
              })
{
}

session_listener::~session_listener()
{
  stop();
}

int session_listener::listen_on_path() const
{
  auto const& path = options_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof(addr.sun_path)) {
    throw std::system_error(std::make_error_code(std::errc::filename_too_long),
                            "session socket path " + path.native());
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);

  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) { throw_errno("socket"); }
  auto fail = [fd](std::string const& what) {
    auto const saved = errno;
    ::close(fd);
    errno = saved;
    throw_errno(what);
  };
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) { ::unlink(path.c_str()); }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    fail("bind " + path.native());
  }
  if (::chmod(path.c_str(), options_.socket_mode) != 0) { fail("chmod " + path.native()); }
  if (::listen(fd, 128) != 0) { fail("listen " + path.native()); }
  return fd;
}

void session_listener::start()
{
  int const listen_fd = listen_on_path();
  wake_fd_            = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    ::close(listen_fd);
    throw_errno("eventfd");
  }
  calls_.start();
  core_.leases().set_reclaim_notifier(
      [this](core::session_id session, core::pool_id pool, std::size_t bytes) {
        calls_.push_reclaim(session, pool, bytes);
      });
  core_.leases().set_retire_notifier(
      [this](core::session_id session, core::pool_id pool, std::vector<core::block_id> const& ids) {
        return calls_.push_retire(session, pool, ids);
      });
  thread_ = std::thread(
      [this, listen_fd] { hellos_.run(listen_fd, wake_fd_, stop_accepting_, stopping_); });
}

void session_listener::stop_accepting()
{
  stop_accepting_ = true;
  if (wake_fd_ >= 0) { ::eventfd_write(wake_fd_, 1); }
}

void session_listener::stop() noexcept
{
  if (!thread_.joinable()) { return; }
  stopping_ = true;
  ::eventfd_write(wake_fd_, 1);
  thread_.join();
  calls_.stop_threads();
  core_.leases().set_reclaim_notifier({});
  core_.leases().set_retire_notifier({});
  calls_.end_all_sessions();
  ::close(wake_fd_);
  wake_fd_ = -1;
}

}  // namespace rmmd::session_socket
