#pragma once

// What the session socket's two sides (hello_loop, call_threads) share about
// a connection: one datagram in, one message out, and the budgets of the log
// lines a client can cause.

#include "daemon/log.hpp"

#include <sys/types.h>

#include <span>
#include <string>
#include <vector>

namespace rmmd::session_socket {

/// One datagram from a client, read without blocking; `bytes` as recvmsg
/// returns it (errno set when negative).
struct datagram {
  ssize_t bytes{};
  bool truncated{};  ///< larger than the buffer
};

/// Fds attached to the datagram are dropped (never installed in this
/// process): the daemon never takes fds from clients.
datagram receive_datagram(int fd, std::span<char> buffer) noexcept;

/// Sends one message with `fds` attached, without blocking (connections are
/// non-blocking). False if it could not be sent whole.
bool send_message(int fd, std::string const& bytes, std::vector<int> const& fds) noexcept;

// Lines a client can cause, each class with a budget of its own
// (log::rate_limit), so that a client flooding the socket cannot flood the
// journal. Sessions opening and closing are the daemon's normal work: their
// budget lets a node's worth of processes start at once.
extern log::rate_limit refusal_lines;
extern log::rate_limit session_lines;
extern log::rate_limit silent_lines;
extern log::rate_limit unread_lines;

}  // namespace rmmd::session_socket
