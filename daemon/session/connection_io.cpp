#include "daemon/session/connection_io.hpp"

#include "common/fd_passing.hpp"

namespace rmmd::session_socket {

log::rate_limit refusal_lines{"sessions and connections refused", 2.0, 20};
log::rate_limit session_lines{"sessions opened or closed", 50.0, 500};
log::rate_limit silent_lines{"connections closed for sending no hello in time", 1.0, 10};
log::rate_limit unread_lines{"sessions ended for not reading their replies", 1.0, 10};

datagram receive_datagram(int fd, std::span<char> buffer) noexcept
{
  auto const got = fd_passing::receive_datagram(fd, buffer, {}, MSG_DONTWAIT);
  return {.bytes = got.bytes, .truncated = got.truncated};
}

bool send_message(int fd, std::string const& bytes, std::vector<int> const& fds) noexcept
{
  return fd_passing::send_datagram(fd, bytes, fds) == static_cast<ssize_t>(bytes.size());
}

}  // namespace rmmd::session_socket
