#include "client/detail/session_hello.hpp"

#include "client/detail/daemon_message_checks.hpp"
#include "common/fd_passing.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

namespace rmmd::detail {

int connect_session_socket(std::filesystem::path const& dir)
{
  auto const path = dir / "rmmd-session.sock";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof(addr.sun_path)) {
    throw rmmd::logic_error("rmmd: runtime directory path too long: " + dir.string());
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) { throw session_error(std::string("rmmd: socket: ") + std::strerror(errno)); }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    if (err == EACCES || err == EPERM) {
      throw permission_error("rmmd: no permission to connect to " + path.string() +
                             ": ask the operator to add you to the rmmd group");
    }
    throw session_error("rmmd: no daemon is listening at " + path.string() + " (" +
                        std::strerror(err) +
                        "): is rmmd running? (systemctl status rmmd), or set RMMD_RUNTIME_DIR");
  }
  return fd;
}

void say_hello(int fd,
               std::string const& client_name,
               session_welcome& out,
               std::uint64_t previous_session_id,
               std::uint32_t reconnects)
{
  v1::SessionHello hello;
  hello.set_protocol_version(1);
  hello.set_client_name(client_name);
  hello.set_previous_session_id(previous_session_id);
  hello.set_reconnects(reconnects);
  auto bytes = hello.SerializeAsString();
  // A daemon that refuses the connection before it reads the hello (a uid at
  // its admission limit) has sent its reason already: read it even if the
  // send failed, and say why the send failed only when there is none.
  int send_error = 0;
  if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size())) {
    send_error = errno;
  }
  // The welcome comes at once; do not wait forever on a daemon that hangs.
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::vector<char> buffer(1 << 16);
  std::array<int, 64> received_fds{};
  auto const received      = fd_passing::receive_datagram(fd, buffer, received_fds);
  auto const receive_error = errno;
  auto const n             = received.bytes;
  std::vector<int> fds(received_fds.begin(), received_fds.begin() + received.fd_count);
  auto fail = [&](auto error) {
    for (int f : fds) { ::close(f); }
    ::close(fd);
    throw error;
  };
  if (n <= 0 && send_error != 0) {
    fail(session_error(std::string("rmmd: sending the session hello failed: ") +
                       std::strerror(send_error)));
  }
  if (n < 0 && (receive_error == EAGAIN || receive_error == EWOULDBLOCK)) {
    fail(session_error("rmmd: the daemon sent no welcome within 10 s of the hello (is it hung?)"));
  }
  if (n < 0 && receive_error != ECONNRESET) {
    fail(session_error(std::string("rmmd: reading the daemon's welcome failed: ") +
                       std::strerror(receive_error)));
  }
  if (n <= 0) {
    // A daemon draining answers every hello it took; one that closes without
    // a word (a reset where the hello was still unread) was killed or
    // crashed after it took the connection.
    fail(session_error(
        "rmmd: the daemon closed the session socket without a welcome: it stopped before it "
        "answered (killed or crashed; is it restarting?)"));
  }
  if (received.truncated || received.fds_truncated) {
    fail(
        session_error("rmmd: the daemon's welcome is larger than this client takes (64 KiB, 64 "
                      "pool fds)"));
  }
  auto read = read_welcome(std::span(buffer.data(), static_cast<std::size_t>(n)), fds, out.welcome);
  if (read.status == welcome_status::permission_denied) { fail(permission_error(read.message)); }
  if (read.status != welcome_status::ok) { fail(session_error(read.message)); }
  for (int f : fds) {  // attached, but named by no pool
    if (std::find(read.pool_fds.begin(), read.pool_fds.end(), f) == read.pool_fds.end()) {
      ::close(f);
    }
  }
  out.pool_fds = std::move(read.pool_fds);
}

void set_receive_slice(int fd, std::chrono::milliseconds call_timeout)
{
  auto const slice_us = std::clamp<std::int64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(call_timeout).count() / 4,
      1000,
      50'000);
  timeval slice{.tv_sec = 0, .tv_usec = static_cast<suseconds_t>(slice_us)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof(slice));
}

std::string pool_key(v1::PoolDescription const& p)
{
  return p.name() + '\x1f' + p.gpu_uuid();
}

}  // namespace rmmd::detail
