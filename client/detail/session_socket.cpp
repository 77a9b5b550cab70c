#include "client/detail/session_socket.hpp"

#include "client/detail/daemon_message_checks.hpp"
#include "client/detail/session_hello.hpp"
#include "common/fd_passing.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <span>
#include <string>

namespace rmmd::detail {

session_socket::session_socket(int fd, std::chrono::milliseconds call_timeout)
    : call_timeout_(call_timeout), fd_(fd)
{
  // The hello is done: a call waits for its reply in a blocking receive (no
  // poll first: one system call fewer per call).
  set_receive_slice(fd, call_timeout_);
}

session_socket::~session_socket()
{
  ::close(fd_.load());
  for (int fd : old_fds_) { ::close(fd); }
}

bool session_socket::closed() const noexcept
{
  pollfd p{.fd = fd(), .events = POLLIN | POLLRDHUP, .revents = 0};
  if (::poll(&p, 1, 0) < 0) { return false; }
  return (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) != 0;
}

void session_socket::replace(int fd)
{
  set_receive_slice(fd, call_timeout_);
  old_fds_.push_back(fd_.load());
  fd_.store(fd, std::memory_order_release);
}

bool session_socket::wait(short events, clock::time_point deadline) const
{
  while (true) {
    auto const left = std::chrono::ceil<std::chrono::milliseconds>(deadline - clock::now());
    if (left.count() <= 0) { return false; }
    pollfd p{.fd = fd(), .events = events, .revents = 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready > 0) { return true; }
    if (ready == 0) { return false; }
    if (errno != EINTR) { return true; }  // let the send or receive report it
  }
}

grpc::Status session_socket::timed_out() const
{
  return {grpc::StatusCode::DEADLINE_EXCEEDED,
          "no reply on the session socket within " + std::to_string(call_timeout_.count()) + " ms"};
}

grpc::Status session_socket::send(v1::SessionCall& call, clock::time_point deadline)
{
  call.set_tag(++last_tag_);
  auto const bytes = call.SerializeAsString();
  while (true) {
    auto n = ::send(fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(bytes.size())) { return grpc::Status::OK; }
    if (n < 0 && errno == EINTR) { continue; }
    if (n < 0 && errno == EAGAIN) {
      // The daemon is behind on this session's calls: wait, within the deadline.
      if (!wait(POLLOUT, deadline)) { return timed_out(); }
      continue;
    }
    return {grpc::StatusCode::UNAVAILABLE,
            std::string("the session socket is closed (") + std::strerror(errno) + ")"};
  }
}

grpc::Status session_socket::round_trip(v1::SessionCall& call,
                                        v1::SessionReply& reply,
                                        std::vector<int>* fds,
                                        unasked_fn const& unasked)
{
  auto const deadline = clock::now() + call_timeout_;
  if (auto sent = send(call, deadline); !sent.ok()) { return sent; }
  std::array<char, 4096> buffer;  // replies are far smaller; left uninitialised
  // A BufferFd answer brings one fd, a StableFds answer up to 250 (a wake
  // of many allocations): room for a datagram's most, or the kernel drops
  // what does not fit. Left uninitialised: only the first fd_count are read.
  std::array<int, fd_passing::max_fds_per_datagram> attached;
  while (true) {
    // Blocks until a reply comes or the socket's receive timeout (a slice of
    // call_timeout, set after the hello) passes: then EAGAIN, and the
    // deadline decides.
    auto const got = fd_passing::receive_datagram(fd(), buffer, attached, 0);
    auto const n   = got.bytes;
    // Whatever fds did not come with this call's answer are not ours to keep.
    auto drop_fds = [&] { fd_passing::close_fds(attached, got.fd_count); };
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (clock::now() >= deadline) { return timed_out(); }
      continue;
    }
    if (n <= 0) {
      drop_fds();
      return {grpc::StatusCode::UNAVAILABLE, "the daemon closed the session"};
    }
    auto const read = read_reply(
        std::span(buffer.data(), static_cast<std::size_t>(n)), call.tag(), call.call_case(), reply);
    if (read.kind != reply_kind::answer || fds == nullptr) { drop_fds(); }
    if (read.kind == reply_kind::invalid) { return read.status; }
    if (read.kind == reply_kind::earlier) {
      // A reclaim request, or the late answer to an earlier call.
      unasked(reply);
      continue;
    }
    if (fds != nullptr) { fds->assign(attached.begin(), attached.begin() + got.fd_count); }
    return read.status;
  }
}

void session_socket::read_waiting(unasked_fn const& unasked)
{
  std::array<char, 4096> buffer;
  std::array<int, 4> attached{};
  while (true) {
    auto const got = fd_passing::receive_datagram(fd(), buffer, attached, MSG_DONTWAIT);
    fd_passing::close_fds(attached, got.fd_count);
    if (got.bytes < 0 && errno == EINTR) { continue; }
    if (got.bytes <= 0) { return; }  // nothing more now, or closed (poll says so next)
    v1::SessionReply reply;
    if (!reply.ParseFromArray(buffer.data(), static_cast<int>(got.bytes))) { continue; }
    unasked(reply);
  }
}

}  // namespace rmmd::detail
