#pragma once

// The session socket's opening: connecting to the daemon of a runtime
// directory and the hello/welcome exchange, used by session_channel when a
// session starts and when it reconnects. No state: functions.

#include "client/detail/session_channel.hpp"

#include "rmmd/v1/rmmd.pb.h"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

namespace rmmd::detail {

/// Connects to DIR/rmmd-session.sock. Throws session_error when no daemon
/// listens there, permission_error when this uid may not connect,
/// rmmd::logic_error when the path is too long for a socket address.
int connect_session_socket(std::filesystem::path const& dir);

/// Sends the hello on `fd` (with the previous session's id and the reconnect
/// count when reconnecting) and reads the welcome into `out`. Closes `fd`
/// and every fd that came when it throws (session_error, permission_error).
void say_hello(int fd,
               std::string const& client_name,
               session_welcome& out,
               std::uint64_t previous_session_id = 0,
               std::uint32_t reconnects          = 0);

/// A call's socket after the hello: a blocking receive wakes a few times
/// per call_timeout (at most every 50 ms) to look at the call's own
/// deadline, so a call overruns it by a quarter of call_timeout at most.
void set_receive_slice(int fd, std::chrono::milliseconds call_timeout);

/// What matches a pool of one daemon to a pool of another: its name and GPU.
std::string pool_key(v1::PoolDescription const& p);

}  // namespace rmmd::detail
