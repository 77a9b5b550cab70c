#include "harness/notify_socket.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

namespace rmmd::harness {

notify_socket::notify_socket(std::filesystem::path path) : path_(std::move(path))
{
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) { throw std::system_error(errno, std::generic_category(), "socket"); }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int e = errno;
    ::close(fd_);
    throw std::system_error(e, std::generic_category(), "bind " + path_.string());
  }
}

notify_socket::~notify_socket()
{
  ::close(fd_);
}

std::string notify_socket::env() const
{
  return "NOTIFY_SOCKET=" + path_.string();
}

std::optional<std::string> notify_socket::wait_for(std::string_view text,
                                                   child_process& sender,
                                                   steady::time_point deadline)
{
  while (true) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now());
    if (left <= 0ms) { return std::nullopt; }
    pollfd p{fd_, POLLIN, 0};
    // Wake now and then to notice a sender that died: it will say nothing more.
    if (::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 100))) <= 0) {
      if (sender.wait(steady::now())) { return std::nullopt; }
      continue;
    }
    char buf[4096];
    auto n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) { continue; }
    std::string message(buf, static_cast<std::size_t>(n));
    if (message.find(text) != std::string::npos) { return message; }
  }
}

}  // namespace rmmd::harness
