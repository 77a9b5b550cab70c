// harness::raw_session: the session protocol's messages, built and read here.

#include "harness/raw_session.hpp"

#include "rmmd/v1/rmmd.pb.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace rmmd::harness {

int connect_session_socket(std::filesystem::path const& runtime_dir)
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

raw_session::raw_session(std::filesystem::path const& runtime_dir,
                         std::string const& client_name,
                         std::chrono::milliseconds timeout)
    : fd_(connect_session_socket(runtime_dir)), timeout_(timeout)
{
  v1::SessionHello hello;
  hello.set_protocol_version(1);
  hello.set_client_name(client_name);
  send(hello.SerializeAsString());
  std::array<int, 16> fds{};
  auto const got = receive(fds);
  for (std::size_t i = 0; i < got.fd_count; ++i) { ::close(fds[i]); }  // pools: not imported
  v1::SessionWelcome welcome;
  if (!welcome.ParseFromArray(buffer_.data(), static_cast<int>(got.bytes))) {
    close_socket();
    throw std::runtime_error("the daemon's welcome does not parse");
  }
  if (welcome.has_error()) {
    close_socket();
    throw std::runtime_error("session refused: " + welcome.error().message());
  }
  session_id_ = welcome.session_id();
  for (auto const& p : welcome.pools()) {
    pools_.emplace_back(p.id(),
                        p.backend() == v1::BACKEND_CUDA ? raw_backend::cuda : raw_backend::host);
  }
}

raw_session::raw_session(raw_session&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      timeout_(other.timeout_),
      session_id_(other.session_id_),
      pools_(std::move(other.pools_)),
      next_tag_(other.next_tag_)
{
}

raw_session::~raw_session()
{
  close_socket();
}

std::uint32_t raw_session::pool_of(raw_backend backend) const
{
  for (auto const& [id, kind] : pools_) {
    if (kind == backend) { return id; }
  }
  throw std::runtime_error(std::string("the daemon has no ") +
                           (backend == raw_backend::cuda ? "CUDA" : "host") + " pool");
}

std::vector<std::uint64_t> raw_session::allocate(
    std::uint32_t pool, std::uint64_t bytes, std::size_t count, std::size_t window, bool may_pack)
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

void raw_session::ping()
{
  v1::SessionCall call;
  call.set_tag(next_tag_++);
  call.mutable_ping();
  send(call.SerializeAsString());
  (void)receive({});
}

void raw_session::fail(std::string const& what)
{
  auto const error = errno;
  close_socket();
  throw std::runtime_error(what + ": " + std::strerror(error));
}

void raw_session::close_socket() noexcept
{
  if (fd_ >= 0) { ::close(fd_); }
  fd_ = -1;
}

void raw_session::send(std::string const& bytes)
{
  if (fd_passing::send_datagram(fd_, bytes) != static_cast<ssize_t>(bytes.size())) {
    throw std::runtime_error(std::string("sending to the daemon: ") + std::strerror(errno));
  }
}

fd_passing::received_datagram raw_session::receive(std::span<int> fds)
{
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout_.count())) <= 0) {
    throw std::runtime_error("no answer from the daemon in time");
  }
  auto got = fd_passing::receive_datagram(fd_, buffer_, fds);
  if (got.bytes <= 0) { throw std::runtime_error("the daemon closed the session"); }
  return got;
}

}  // namespace rmmd::harness
