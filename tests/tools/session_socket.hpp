#pragma once

// A connection to a daemon's session socket made by hand, below the client
// library: for the tests of what the daemon does with hostile, silent,
// queued or malformed connections, which the library would never make.
// Header-only (session_opener is a program of its own).

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

namespace rmmd::test {

/// A new connection (SOCK_SEQPACKET, close-on-exec) to the session socket
/// of the daemon whose runtime directory is `runtime_dir`: its fd, which the
/// caller closes. std::system_error naming the socket when it cannot.
inline int connect_session_socket(std::filesystem::path const& runtime_dir)
{
  auto const path = (runtime_dir / "rmmd-session.sock").string();
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    throw std::system_error(ENAMETOOLONG, std::generic_category(), "connect " + path);
  }
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  int const fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    auto const error = errno;
    throw std::system_error(error, std::generic_category(), "socket for " + path);
  }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    auto const error = errno;
    ::close(fd);
    throw std::system_error(error, std::generic_category(), "connect " + path);
  }
  return fd;
}

}  // namespace rmmd::test
