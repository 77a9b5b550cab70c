#include "daemon/session/hello_loop.hpp"

#include "common/hex.hpp"

#include "daemon/log.hpp"
#include "daemon/session/connection_io.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace rmmd::session_socket {
namespace {

core::peer_credentials read_peer(int fd)
{
  core::peer_credentials peer;
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
  } else {
    // Without credentials nothing can be allowed: an impossible uid.
    peer.uid = static_cast<uid_t>(-1);
    peer.gid = static_cast<gid_t>(-1);
  }
  std::vector<gid_t> groups(64);
  len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) {
    if (errno == ERANGE) {  // len now holds the size needed
      groups.resize(len / sizeof(gid_t));
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) != 0) { len = 0; }
    } else {
      len = 0;
    }
  }
  groups.resize(len / sizeof(gid_t));
  peer.supplementary_gids = std::move(groups);
  return peer;
}

std::string command_name(pid_t pid)
{
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

/// Connections taken per turn of the loop: a flood of connections cannot keep
/// it from the hellos and deadlines of the others (the listening socket stays
/// readable, so epoll comes back to it).
constexpr int accepts_per_turn = 64;

}  // namespace

hello_loop::hello_loop(core::daemon_core& core,
                       listener_options const& options,
                       admission& admission,
                       std::atomic<std::size_t>& open_sessions,
                       welcomed_function welcomed)
    : core_(core),
      options_(options),
      admission_(admission),
      open_sessions_(open_sessions),
      welcomed_(std::move(welcomed))
{
}

void hello_loop::run(int listen_fd,
                     int wake_fd,
                     std::atomic<bool> const& stop_accepting,
                     std::atomic<bool> const& stopping) noexcept
{
  listen_fd_ = listen_fd;
  wake_fd_   = wake_fd;
  ep_        = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep_ < 0) {
    log::error("session socket: epoll_create1 failed: %s", std::strerror(errno));
    return;
  }
  watch(listen_fd_, EPOLLIN);
  watch(wake_fd_, EPOLLIN);
  try {
    std::vector<epoll_event> events(64);
    while (!stopping) {
      if (stop_accepting) { stop_listening(); }
      int n = ::epoll_wait(ep_, events.data(), static_cast<int>(events.size()), next_deadline_ms());
      if (n < 0 && errno != EINTR) {
        log::error("session socket: epoll_wait failed: %s", std::strerror(errno));
        break;
      }
      for (int i = 0; i < n; ++i) { on_event(events[i]); }
      close_silent();
    }
    // A drain with no session to wait for can end before the loop came
    // round to its stop_accepting: what the backlog holds is answered still.
    if (stop_accepting) { stop_listening(); }
  } catch (std::exception const& e) {
    log::error("session socket: %s; no longer accepting sessions", e.what());
  }
  while (!conns_.empty()) { drop(conns_.begin()->first); }
  close_listener();
  ::close(ep_);
  ep_ = -1;
}

void hello_loop::watch(int fd, std::uint32_t events) noexcept
{
  epoll_event ev{};
  ev.events  = events;
  ev.data.fd = fd;
  ::epoll_ctl(ep_, EPOLL_CTL_ADD, fd, &ev);
}

int hello_loop::next_deadline_ms() const
{
  int timeout_ms = -1;
  auto const now = clock::now();
  for (auto const& [fd, c] : conns_) {
    auto left  = std::chrono::ceil<std::chrono::milliseconds>(c.deadline - now).count();
    left       = std::max<long>(left, 0);
    timeout_ms = timeout_ms < 0 ? static_cast<int>(left) : std::min<int>(timeout_ms, left);
  }
  return timeout_ms;
}

void hello_loop::on_event(epoll_event const& event)
{
  int const fd = event.data.fd;
  if (fd == wake_fd_) {
    eventfd_t v;
    ::eventfd_read(wake_fd_, &v);
    return;
  }
  if (fd == listen_fd_) {
    accept_some();
    return;
  }
  auto it = conns_.find(fd);
  if (it == conns_.end()) { return; }
  auto outcome = hello_outcome::wait;
  if (event.events & EPOLLIN) { outcome = on_readable(it->second); }
  if (outcome == hello_outcome::welcomed) {
    // The connection now belongs to the call threads (a hang-up after the
    // hello is theirs to see).
    auto const session = it->second.session;
    auto const peer    = it->second.peer;
    forget(fd, false);
    welcomed_(fd, session, peer);
    return;
  }
  if (outcome == hello_outcome::refused ||
      (event.events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
    drop(fd);
  }
}

bool hello_loop::accept_some()
{
  for (int turn = 0; turn < accepts_per_turn; ++turn) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR) { continue; }
      return false;  // EAGAIN, or a transient error: epoll will call again
    }
    connection c{
        .fd = fd, .peer = read_peer(fd), .deadline = clock::now() + options_.hello_deadline};
    // A client sends its hello as soon as it is connected, so it is usually
    // here already: answered now, it never counts as waiting, and a burst of
    // clients of one uid is not mistaken for silent ones.
    auto const outcome = on_readable(c);
    if (outcome == hello_outcome::welcomed) {
      welcomed_(fd, c.session, c.peer);
      continue;
    }
    if (outcome == hello_outcome::refused) {
      ::close(fd);
      continue;
    }
    // Silent so far: it waits, within the limits, so that silent clients can
    // neither exhaust the daemon's fds nor crowd out other users.
    if (auto admitted = admission_.admit_pending(c.peer.uid); !admitted.ok()) {
      refuse(c, admitted);
      ::close(fd);
      continue;
    }
    conns_.emplace(fd, std::move(c));
    watch(fd, EPOLLIN | EPOLLRDHUP);
  }
  return true;
}

hello_loop::hello_outcome hello_loop::on_readable(connection& c)
{
  std::vector<char> buffer(options_.max_hello_bytes);
  auto const [n, truncated] = receive_datagram(c.fd, buffer);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) { return hello_outcome::wait; }
  if (n <= 0) { return hello_outcome::refused; }  // closed by the peer, or an error
  // Counted before the core opens a session, so that a refusal changes nothing.
  if (auto admitted = admission_.admit_session(c.peer.uid); !admitted.ok()) {
    return refuse(c, admitted);
  }
  auto answer = handle_hello(
      core_,
      {.bytes = std::span(buffer.data(), static_cast<std::size_t>(n)), .truncated = truncated},
      c.peer,
      command_name(c.peer.pid),
      {.max_hello_bytes   = options_.max_hello_bytes,
       .max_message_bytes = options_.max_message_bytes});
  if (!answer.grant) { return refuse_hello(c, answer); }
  return welcome(c, answer);
}

hello_loop::hello_outcome hello_loop::refuse(connection const& c, absl::Status const& status)
{
  log::limited(refusal_lines,
               log::level::warning,
               "session refused for pid %d uid %d: %s",
               c.peer.pid,
               c.peer.uid,
               std::string(status.message()));
  send_message(c.fd, refusal_welcome(status), {});
  return hello_outcome::refused;
}

hello_loop::hello_outcome hello_loop::refuse_hello(connection const& c, hello_answer const& answer)
{
  admission_.end_session(c.peer.uid);
  // Every refusal is logged (rate-limited: a client can cause them).
  v1::SessionWelcome refusal;
  static_cast<void>(refusal.ParseFromString(answer.message));
  log::limited(refusal_lines,
               log::level::warning,
               "session refused for pid %d uid %d: %s",
               c.peer.pid,
               c.peer.uid,
               refusal.error().message());
  send_message(c.fd, answer.message, {});
  return hello_outcome::refused;
}

hello_loop::hello_outcome hello_loop::welcome(connection& c, hello_answer const& answer)
{
  auto const& grant = *answer.grant;
  // Counted, and logged, before the client can hear of it: a drain that
  // starts once the client holds its welcome must see this session, and a
  // reload of the log level that follows must not find this line unwritten.
  ++open_sessions_;
  // The token is a credential: log only its first 4 hex digits.
  log::limited(session_lines,
               log::level::info,
               "session %d opened: pid %d uid %d (%s), token %s...%s",
               grant.id,
               c.peer.pid,
               c.peer.uid,
               answer.client_name,
               common::to_hex(grant.token).substr(0, 4),
               answer.reconnects == 0
                   ? std::string()
                   : absl::StrFormat("; a client reconnecting (it was session %d of the daemon "
                                     "before, reconnect %d)",
                                     answer.previous_session_id,
                                     answer.reconnects));
  if (!send_message(c.fd, answer.message, answer.fds)) {
    --open_sessions_;
    core_.close_session(grant.id);
    admission_.end_session(c.peer.uid);
    log::limited(session_lines,
                 log::level::info,
                 "session %d closed: its welcome could not be sent (pid %d)",
                 grant.id,
                 c.peer.pid);
    return hello_outcome::refused;
  }
  c.session = grant.id;
  return hello_outcome::welcomed;
}

void hello_loop::forget(int fd, bool close) noexcept
{
  auto it = conns_.find(fd);
  if (it == conns_.end()) { return; }
  admission_.end_pending(it->second.peer.uid);
  ::epoll_ctl(ep_, EPOLL_CTL_DEL, fd, nullptr);
  if (close) { ::close(fd); }
  conns_.erase(it);
}

void hello_loop::close_silent()
{
  auto const now = clock::now();
  std::vector<int> expired;
  for (auto const& [fd, c] : conns_) {
    if (c.deadline <= now) { expired.push_back(fd); }
  }
  for (int fd : expired) {
    log::limited(silent_lines,
                 log::level::warning,
                 "session socket: pid %d uid %d sent no hello in time; disconnected",
                 conns_[fd].peer.pid,
                 conns_[fd].peer.uid);
    drop(fd);
  }
}

void hello_loop::stop_listening()
{
  if (listen_fd_ < 0) { return; }
  // Closing the socket would reset the connections in its backlog: clients
  // that connected before the drain would hear nothing. Unlinked first, it
  // takes no more; what it holds is taken, and each hello is answered as the
  // core now answers every new session (draining), here or once it comes.
  ::unlink(options_.socket_path.c_str());
  while (accept_some()) {}
  close_listener();
}

void hello_loop::close_listener() noexcept
{
  if (listen_fd_ < 0) { return; }
  ::epoll_ctl(ep_, EPOLL_CTL_DEL, listen_fd_, nullptr);
  ::close(listen_fd_);
  listen_fd_ = -1;
  ::unlink(options_.socket_path.c_str());
}

}  // namespace rmmd::session_socket
