#pragma once

// A session spoken by hand on the session socket (docs/protocol.md): the
// hello, the welcome (its pool fds closed at once), and Allocate calls
// pipelined, a window of them in flight. No CUDA, no gRPC, no imports: what
// the daemon keeps per session and per lease, made cheaply and fast, for the
// tests and the bench (section h) that hold a thousand sessions or a million
// leases. Header-only, like fd_passing.hpp.
//
// Thread safety: one raw_session per thread.

#include "common/fd_passing.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rmmd::harness {

class raw_session {
 public:
  /// Connects to `runtime_dir`'s session socket and says hello. Throws
  /// std::runtime_error naming what failed, the daemon's refusal included.
  explicit raw_session(std::filesystem::path const& runtime_dir,
                       std::string const& client_name    = "raw-session",
                       std::chrono::milliseconds timeout = std::chrono::seconds(20))
      : timeout_(timeout)
  {
    auto const path = (runtime_dir / "rmmd-session.sock").native();
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) {
      throw std::runtime_error("session socket path too long: " + path);
    }
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd_ < 0) { fail("socket"); }
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      fail("connect " + path);
    }
    v1::SessionHello hello;
    hello.set_protocol_version(1);
    hello.set_client_name(client_name);
    send(hello.SerializeAsString());
    std::array<int, 16> fds{};
    auto const got = receive(fds);
    for (std::size_t i = 0; i < got.fd_count; ++i) { ::close(fds[i]); }  // pools: not imported
    if (!welcome_.ParseFromArray(buffer_.data(), static_cast<int>(got.bytes))) {
      close_socket();
      throw std::runtime_error("the daemon's welcome does not parse");
    }
    if (welcome_.has_error()) {
      close_socket();
      throw std::runtime_error("session refused: " + welcome_.error().message());
    }
  }
  raw_session(raw_session&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)),
        timeout_(other.timeout_),
        welcome_(std::move(other.welcome_)),
        next_tag_(other.next_tag_)
  {
  }
  raw_session& operator=(raw_session&&)      = delete;
  raw_session(raw_session const&)            = delete;
  raw_session& operator=(raw_session const&) = delete;
  /// Closes the connection: the daemon ends the session and frees what it held.
  ~raw_session()
  {
    close_socket();
  }

  [[nodiscard]] std::uint64_t id() const
  {
    return welcome_.session_id();
  }
  [[nodiscard]] v1::SessionWelcome const& welcome() const
  {
    return welcome_;
  }
  /// The id of the first pool of `backend` in the welcome; throws if none.
  [[nodiscard]] std::uint32_t pool_of(v1::Backend backend) const
  {
    for (auto const& p : welcome_.pools()) {
      if (p.backend() == backend) { return p.id(); }
    }
    throw std::runtime_error("the daemon has no pool of backend " + v1::Backend_Name(backend));
  }

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
                                      bool may_pack      = false)
  {
    std::vector<std::uint64_t> ids;
    ids.reserve(count);
    v1::SessionCall call;
    call.mutable_allocate()->set_pool_id(pool);
    call.mutable_allocate()->set_size(bytes);
    call.mutable_allocate()->set_may_pack(may_pack);
    std::size_t sent = 0;
    while (ids.size() < count) {
      while (sent < count && sent - ids.size() < window) {
        call.set_tag(next_tag_++);
        send(call.SerializeAsString());
        ++sent;
      }
      auto const got = receive({});
      v1::SessionReply reply;
      if (!reply.ParseFromArray(buffer_.data(), static_cast<int>(got.bytes))) {
        throw std::runtime_error("a reply does not parse");
      }
      if (reply.has_error()) {
        throw std::runtime_error("allocate " + std::to_string(bytes) + " bytes (number " +
                                 std::to_string(ids.size() + 1) + "): " + reply.error().message());
      }
      ids.push_back(reply.allocate().allocation_id());
    }
    return ids;
  }

  /// One Ping round trip: the daemon has answered every call sent before it.
  void ping()
  {
    v1::SessionCall call;
    call.set_tag(next_tag_++);
    call.mutable_ping();
    send(call.SerializeAsString());
    (void)receive({});
  }

 private:
  [[noreturn]] void fail(std::string const& what)
  {
    auto const error = errno;
    close_socket();
    throw std::runtime_error(what + ": " + std::strerror(error));
  }

  void close_socket() noexcept
  {
    if (fd_ >= 0) { ::close(fd_); }
    fd_ = -1;
  }

  void send(std::string const& bytes)
  {
    if (fd_passing::send_datagram(fd_, bytes) != static_cast<ssize_t>(bytes.size())) {
      throw std::runtime_error(std::string("sending to the daemon: ") + std::strerror(errno));
    }
  }

  /// One datagram into buffer_ (within the timeout); throws when the daemon
  /// closed the connection or said nothing in time.
  fd_passing::received_datagram receive(std::span<int> fds)
  {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout_.count())) <= 0) {
      throw std::runtime_error("no answer from the daemon in time");
    }
    auto got = fd_passing::receive_datagram(fd_, buffer_, fds);
    if (got.bytes <= 0) { throw std::runtime_error("the daemon closed the session"); }
    return got;
  }

  int fd_{-1};
  std::chrono::milliseconds timeout_;
  v1::SessionWelcome welcome_;
  std::uint64_t next_tag_{1};
  std::array<char, 1 << 16> buffer_{};
};

}  // namespace rmmd::harness
