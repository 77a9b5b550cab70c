#pragma once

// A session spoken by hand on the session socket (docs/protocol.md): the
// hello, the welcome (its pool fds closed at once), and Allocate calls
// pipelined, a window of them in flight. No CUDA, no gRPC, no imports: what
// the daemon keeps per session and per lease, made cheaply and fast, for the
// tests and the bench (section h) that hold a thousand sessions or a million
// leases. The messages are built in raw_session.cpp: this header names no
// generated protobuf type.
//
// Thread safety: one raw_session per thread.

#include "common/fd_passing.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace rmmd::harness {

/// A new connection (SOCK_SEQPACKET, close-on-exec) to the session socket
/// of the daemon whose runtime directory is `runtime_dir`, nothing said on
/// it yet: its fd, which the caller closes. For raw_session, and for the
/// tests of what the daemon does with hostile, silent, queued or malformed
/// connections. std::system_error naming the socket when it cannot.
[[nodiscard]] int connect_session_socket(std::filesystem::path const& runtime_dir);

/// The kind of a pool in the welcome.
enum class raw_backend { host, cuda };

class raw_session {
 public:
  /// Connects to `runtime_dir`'s session socket and says hello. Throws
  /// std::runtime_error naming what failed, the daemon's refusal included.
  explicit raw_session(std::filesystem::path const& runtime_dir,
                       std::string const& client_name    = "raw-session",
                       std::chrono::milliseconds timeout = std::chrono::seconds(20));
  raw_session(raw_session&& other) noexcept;
  raw_session& operator=(raw_session&&)      = delete;
  raw_session(raw_session const&)            = delete;
  raw_session& operator=(raw_session const&) = delete;
  /// Closes the connection: the daemon ends the session and frees what it held.
  ~raw_session();

  [[nodiscard]] std::uint64_t id() const noexcept
  {
    return session_id_;
  }
  /// The id of the first pool of `backend` in the welcome; throws if none.
  [[nodiscard]] std::uint32_t pool_of(raw_backend backend) const;

  /// `count` allocations of `bytes` from `pool`, at most `window` calls in
  /// flight (the daemon ends a session whose replies pile up unread, so keep
  /// it well under the socket's queue); their ids, in order. Throws on the
  /// first refusal, naming it (the leases made so far stay held). With
  /// `may_pack`, as the client library's direct resource asks (the daemon
  /// retires no block while its leases are held, so no RetireBlocks comes).
  std::vector<std::uint64_t> allocate(std::uint32_t pool,
                                      std::uint64_t bytes,
                                      std::size_t count,
                                      std::size_t window = 64,
                                      bool may_pack      = false);

  /// One Ping round trip: the daemon has answered every call sent before it.
  void ping();

 private:
  [[noreturn]] void fail(std::string const& what);
  void close_socket() noexcept;
  void send(std::string const& bytes);
  /// One datagram into buffer_ (within the timeout); throws when the daemon
  /// closed the connection or said nothing in time.
  fd_passing::received_datagram receive(std::span<int> fds);

  int fd_{-1};
  std::chrono::milliseconds timeout_;
  std::uint64_t session_id_{};
  std::vector<std::pair<std::uint32_t, raw_backend>> pools_;  // the welcome's, in order
  std::uint64_t next_tag_{1};
  std::array<char, 1 << 16> buffer_{};
};

}  // namespace rmmd::harness
