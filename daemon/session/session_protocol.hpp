#pragma once

// What the daemon answers on the session socket, without the socket: a hello
// datagram becomes a welcome (and a session in the core), a call datagram
// becomes a reply. The session listener does the I/O around these functions;
// the fuzzer (tests/fuzz/session_fuzz.cpp) drives them directly with the
// bytes a client could send. docs/protocol.md describes the messages.
//
// Thread safety: as the core's. The listener answers the calls of one session
// in order, one at a time; calls of different sessions run at once.

#include "daemon/core/daemon_core.hpp"
#include "daemon/metrics/request_metrics.hpp"

#include <absl/status/status.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::session_socket {

/// One datagram as a connection delivered it: its bytes, cut to the reader's
/// buffer, and whether the kernel cut it (MSG_TRUNC).
struct datagram_view {
  std::span<char const> bytes;
  bool truncated{false};
};

struct hello_limits {
  /// The hello's largest size (the reader's buffer), for the refusal's message.
  std::size_t max_hello_bytes{4096};
  /// Advertised in the welcome: the gRPC server's message size cap.
  std::uint32_t max_message_bytes{};
};

struct hello_answer {
  /// The serialised SessionWelcome to send: the session's, or a refusal
  /// (its `error` set) after which the connection is closed.
  std::string message;
  /// The pools' fds to attach to a welcome (owned by the backends); empty for
  /// a refusal.
  std::vector<int> fds;
  /// Set when a session was opened. The caller closes it in the core if the
  /// welcome cannot be sent.
  std::optional<core::session_grant> grant;
  /// Why the core refused a well-formed hello (not allowed, draining), for
  /// the daemon's log; OK otherwise.
  absl::Status refusal;
  /// What the client called itself (the hello's client_name), for the log.
  std::string client_name;
  /// A client reconnecting after its daemon went away: the session id the
  /// earlier daemon gave it and its reconnect count (0: a first hello), for
  /// the log.
  std::uint64_t previous_session_id{};
  std::uint32_t reconnects{};
};

/// A SessionWelcome that refuses the session with `status`.
std::string refusal_welcome(absl::Status const& status);

/// Answers a hello from `peer` (`command`: the kernel's name for its
/// process): a refusal for a hello that is too large, not a SessionHello, or
/// of another protocol version, or that the core refuses; else the welcome of
/// a session opened in `core`, with its token and the pools.
hello_answer handle_hello(core::daemon_core& core,
                          datagram_view hello,
                          core::peer_credentials const& peer,
                          std::string command,
                          hello_limits const& limits);

/// Answers one SessionCall of `session`, by the call table's entry for its
/// field (daemon/wire/calls.hpp): the serialised SessionReply, or nullopt when
/// nothing is to be sent (a call whose entry allows reply_only_on_error, which
/// asked for it and succeeded: Free, PublishBuffer, CloseBuffer,
/// BlocksDropped). Any other answer carries either the error or the call's
/// own reply. An OpenBuffer never waits. A call too large (`max_call_bytes`:
/// the reader's buffer), not a SessionCall or naming no known call is
/// answered INVALID_ARGUMENT or UNIMPLEMENTED; the session goes on. Every
/// call is counted under its table name in `call_metrics` unless it is null.
///
/// A BufferFd answer names an fd (owned by the backend) that must travel
/// with the reply: it is put in `fds` (none is answered FAILED_PRECONDITION
/// when `fds` is null).
///
/// An Allocate or CreateBuffer that finds its pool short waits for other
/// sessions' idle slabs (daemon_core::allocate) when `held` is null. When it
/// is not, such a call is not made: `*held` is set, nothing is answered
/// (nullopt), and the caller hands the same datagram again, with `held`
/// null, to a thread that may wait.
std::optional<std::string> handle_call(core::daemon_core& core,
                                       core::session_id session,
                                       datagram_view call,
                                       std::size_t max_call_bytes,
                                       metrics::request_metrics* call_metrics,
                                       std::vector<int>* fds = nullptr,
                                       bool* held            = nullptr);

}  // namespace rmmd::session_socket
