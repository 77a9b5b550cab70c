#pragma once

// One datagram with file descriptors attached (SCM_RIGHTS), sent and
// received on a Unix socket (SOCK_SEQPACKET or SOCK_DGRAM). Used by the
// daemon's session listener (the welcome carries the pools' fds; fds a client
// attaches are closed), the client (it receives the welcome), the
// hostile-input tests and the bench. Header-only: the daemon and the client
// library both include it, neither links the other.
//
// Thread safety: the functions keep no state; concurrent calls on one socket
// behave as concurrent sendmsg/recvmsg calls do.

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <span>

namespace rmmd::fd_passing {

/// The most fds Linux passes in one message (SCM_MAX_FD).
inline constexpr std::size_t max_fds_per_datagram = 253;

/// Sends `bytes` as one datagram with `fds` attached (none if empty); the
/// receiver gets its own copies, the caller keeps `fds`. Retries on EINTR.
/// Returns what sendmsg returns: the bytes sent, or -1 with errno set
/// (EINVAL for more than max_fds_per_datagram fds).
inline ssize_t send_datagram(int socket,
                             std::span<char const> bytes,
                             std::span<int const> fds = {},
                             int flags                = MSG_NOSIGNAL) noexcept
{
  if (fds.size() > max_fds_per_datagram) {
    errno = EINVAL;
    return -1;
  }
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds_per_datagram)];
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov    = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control    = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    auto* c            = CMSG_FIRSTHDR(&msg);
    c->cmsg_level      = SOL_SOCKET;
    c->cmsg_type       = SCM_RIGHTS;
    c->cmsg_len        = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(socket, &msg, flags);
  } while (n < 0 && errno == EINTR);
  return n;
}

/// What receive_datagram read.
struct received_datagram {
  /// As recvmsg returns it: the datagram's length (at most the buffer's),
  /// 0 when the peer closed (or sent an empty datagram), -1 with errno set.
  ssize_t bytes{-1};
  /// How many fds were written to the front of `fds`; the caller owns and
  /// must close them. They are close-on-exec.
  std::size_t fd_count{};
  /// The datagram was larger than the buffer; the rest of it is lost (MSG_TRUNC).
  bool truncated{};
  /// More fds came than `fds` holds: those beyond were closed (or never
  /// installed by the kernel, MSG_CTRUNC); none of them leaks.
  bool fds_truncated{};
};

/// Receives one datagram into `buffer` and up to `fds.size()` fds that came
/// with it (MSG_CMSG_CLOEXEC is always added to `flags`). Retries on EINTR.
/// REQUIRES: fds.size() <= max_fds_per_datagram.
inline received_datagram receive_datagram(int socket,
                                          std::span<char> buffer,
                                          std::span<int> fds = {},
                                          int flags          = 0) noexcept
{
  if (fds.size() > max_fds_per_datagram) { fds = fds.first(max_fds_per_datagram); }
  // The kernel installs as many fds as fit in msg_controllen, and the
  // alignment padding of CMSG_SPACE can hold one more than asked for: such
  // extras are closed below; those that did not fit at all it discards.
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * max_fds_per_datagram)];
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov        = &iov;
  msg.msg_iovlen     = 1;
  msg.msg_control    = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
  received_datagram out;
  do {
    out.bytes = ::recvmsg(socket, &msg, flags | MSG_CMSG_CLOEXEC);
  } while (out.bytes < 0 && errno == EINTR);
  if (out.bytes < 0) { return out; }
  out.truncated     = (msg.msg_flags & MSG_TRUNC) != 0;
  out.fds_truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  for (auto* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) { continue; }
    auto const count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd{};
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (out.fd_count < fds.size()) {
        fds[out.fd_count++] = fd;
      } else {
        ::close(fd);
        out.fds_truncated = true;
      }
    }
  }
  return out;
}

/// Closes the first `count` of `fds` (what receive_datagram handed over).
inline void close_fds(std::span<int const> fds, std::size_t count) noexcept
{
  for (std::size_t i = 0; i < count && i < fds.size(); ++i) { ::close(fds[i]); }
}

}  // namespace rmmd::fd_passing
