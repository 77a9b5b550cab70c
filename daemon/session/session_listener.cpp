#include "daemon/session/session_listener.hpp"

#include "daemon/log.hpp"
#include "daemon/service/proto_convert.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <system_error>
#include <vector>

namespace rmmd::session {
namespace {

using clock = std::chrono::steady_clock;

[[noreturn]] void throw_errno(std::string const& what)
{
  throw std::system_error(errno, std::generic_category(), what);
}

struct connection {
  int fd{-1};
  core::peer_credentials peer;
  clock::time_point deadline;
  core::session_id session{};  // 0 until the welcome was sent
};

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

/// Sends one message with `fds` attached. False if it could not be sent whole.
bool send_message(int fd, std::string const& bytes, std::vector<int> const& fds)
{
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov    = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control;
  if (!fds.empty()) {
    control.resize(CMSG_SPACE(sizeof(int) * fds.size()));
    msg.msg_control    = control.data();
    msg.msg_controllen = control.size();
    auto* cmsg         = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level   = SOL_SOCKET;
    cmsg->cmsg_type    = SCM_RIGHTS;
    cmsg->cmsg_len     = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cmsg), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(bytes.size());
}

void send_error(int fd, absl::Status const& status)
{
  v1::SessionWelcome welcome;
  welcome.set_protocol_version(1);
  welcome.mutable_error()->set_code(static_cast<int>(status.code()));
  welcome.mutable_error()->set_message(std::string(status.message()));
  send_message(fd, welcome.SerializeAsString(), {});
}

/// Closes any fds a peer attached to its message: we never take fds from clients.
void close_received_fds(msghdr& msg)
{
  for (auto* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      auto n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < n; ++i) {
        int received{};
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        ::close(received);
      }
    }
  }
}

}  // namespace

session_listener::session_listener(core::daemon_core& core, listener_options options)
    : core_(core), options_(std::move(options))
{
}

session_listener::~session_listener()
{
  stop();
}

void session_listener::start()
{
  auto const& path = options_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof(addr.sun_path)) {
    throw std::system_error(std::make_error_code(std::errc::filename_too_long),
                            "session socket path " + path.native());
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);

  listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) { throw_errno("socket"); }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) { ::unlink(path.c_str()); }
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    throw_errno("bind " + path.native());
  }
  if (::chmod(path.c_str(), options_.socket_mode) != 0) { throw_errno("chmod " + path.native()); }
  if (::listen(listen_fd_, 128) != 0) { throw_errno("listen " + path.native()); }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) { throw_errno("eventfd"); }
  thread_ = std::thread([this] { run(); });
}

void session_listener::stop_accepting()
{
  stop_accepting_ = true;
  if (wake_fd_ >= 0) { ::eventfd_write(wake_fd_, 1); }
}

void session_listener::stop() noexcept
{
  if (!thread_.joinable()) { return; }
  stopping_ = true;
  ::eventfd_write(wake_fd_, 1);
  thread_.join();
  ::close(wake_fd_);
  wake_fd_ = -1;
}

void session_listener::run() noexcept
{
  int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) {
    log::error("session socket: epoll_create1 failed: %s", std::strerror(errno));
    return;
  }
  auto watch = [ep](int fd, std::uint32_t events) {
    epoll_event ev{};
    ev.events  = events;
    ev.data.fd = fd;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
  };
  watch(listen_fd_, EPOLLIN);
  watch(wake_fd_, EPOLLIN);

  std::map<int, connection> conns;
  std::size_t pending = 0;

  auto drop = [&](int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) { return; }
    if (it->second.session != 0) {
      core_.close_session(it->second.session);
      --open_sessions_;
      log::info("session %d closed (pid %d)", it->second.session, it->second.peer.pid);
    } else {
      --pending;
    }
    ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    conns.erase(it);
  };

  auto close_listener = [&] {
    if (listen_fd_ < 0) { return; }
    ::epoll_ctl(ep, EPOLL_CTL_DEL, listen_fd_, nullptr);
    ::close(listen_fd_);
    listen_fd_ = -1;
    ::unlink(options_.socket_path.c_str());
  };

  auto accept_all = [&] {
    while (true) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR) { continue; }
        return;  // EAGAIN, or a transient error: epoll will call again
      }
      if (pending >= options_.max_pending) {
        // Too many silent clients: refuse rather than run out of fds.
        send_error(fd,
                   absl::UnavailableError(
                       "open session: too many connections are waiting to say hello; retry"));
        ::close(fd);
        continue;
      }
      connection c{
          .fd = fd, .peer = read_peer(fd), .deadline = clock::now() + options_.hello_deadline};
      conns.emplace(fd, std::move(c));
      ++pending;
      watch(fd, EPOLLIN | EPOLLRDHUP);
    }
  };

  auto welcome = [&](connection& c, v1::SessionHello const& hello) {
    auto grant = core_.open_session(c.peer, command_name(c.peer.pid), hello.client_name());
    if (!grant.ok()) {
      log::warn("session refused for pid %d uid %d: %s",
                c.peer.pid,
                c.peer.uid,
                std::string(grant.status().message()));
      send_error(c.fd, grant.status());
      return false;
    }
    v1::SessionWelcome w;
    w.set_protocol_version(1);
    auto token = core::to_hex(grant->token);
    w.set_token(
        std::string(reinterpret_cast<char const*>(grant->token.data()), grant->token.size()));
    w.set_session_id(grant->id);
    w.set_max_message_bytes(options_.max_message_bytes);
    std::vector<int> fds;
    for (auto const& pool : core_.pools()) {
      int index = -1;
      if (pool.shareable_fd >= 0) {
        index = static_cast<int>(fds.size());
        fds.push_back(pool.shareable_fd);
      }
      service::to_proto(pool, index, w.add_pools());
    }
    // Counted before the client can hear of it: a drain that starts once the
    // client holds its welcome must see this session.
    ++open_sessions_;
    if (!send_message(c.fd, w.SerializeAsString(), fds)) {
      --open_sessions_;
      core_.close_session(grant->id);
      return false;
    }
    c.session = grant->id;
    --pending;
    // The token is a credential: log only its first 4 hex digits.
    log::info("session %d opened: pid %d uid %d (%s), token %s...",
              grant->id,
              c.peer.pid,
              c.peer.uid,
              hello.client_name(),
              token.substr(0, 4));
    return true;
  };

  auto on_readable = [&](connection& c) {
    std::vector<char> buffer(options_.max_hello_bytes);
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
    iovec iov{buffer.data(), buffer.size()};
    msghdr msg{};
    msg.msg_iov        = &iov;
    msg.msg_iovlen     = 1;
    msg.msg_control    = control;
    msg.msg_controllen = sizeof(control);
    auto n             = ::recvmsg(c.fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) { return true; }
    if (n > 0) { close_received_fds(msg); }
    if (n <= 0) { return false; }  // closed by the peer, or an error
    if (c.session != 0) {
      return true;  // nothing is expected after the hello; ignore it
    }
    if ((msg.msg_flags & MSG_TRUNC) != 0) {
      send_error(c.fd,
                 absl::InvalidArgumentError(absl::StrFormat(
                     "session hello larger than %d bytes; send one SessionHello message",
                     options_.max_hello_bytes)));
      return false;
    }
    v1::SessionHello hello;
    if (!hello.ParseFromArray(buffer.data(), static_cast<int>(n))) {
      send_error(
          c.fd,
          absl::InvalidArgumentError("session hello is not a valid rmmd.v1.SessionHello message"));
      return false;
    }
    if (hello.protocol_version() != 1) {
      send_error(c.fd,
                 absl::FailedPreconditionError(absl::StrFormat(
                     "session hello asks for protocol version %d; this daemon speaks version 1",
                     hello.protocol_version())));
      return false;
    }
    return welcome(c, hello);
  };

  std::vector<epoll_event> events(64);
  while (!stopping_) {
    if (stop_accepting_) { close_listener(); }
    int timeout_ms = -1;
    auto now       = clock::now();
    for (auto const& [fd, c] : conns) {
      if (c.session != 0) { continue; }
      auto left  = std::chrono::ceil<std::chrono::milliseconds>(c.deadline - now).count();
      left       = std::max<long>(left, 0);
      timeout_ms = timeout_ms < 0 ? static_cast<int>(left) : std::min<int>(timeout_ms, left);
    }
    int n = ::epoll_wait(ep, events.data(), static_cast<int>(events.size()), timeout_ms);
    if (n < 0 && errno != EINTR) {
      log::error("session socket: epoll_wait failed: %s", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        eventfd_t v;
        ::eventfd_read(wake_fd_, &v);
        continue;
      }
      if (fd == listen_fd_) {
        accept_all();
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) { continue; }
      bool keep = true;
      if (events[i].events & EPOLLIN) { keep = on_readable(it->second); }
      if (keep && (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) { keep = false; }
      if (!keep) { drop(fd); }
    }
    // Silent clients: the hello deadline closes them.
    now = clock::now();
    std::vector<int> expired;
    for (auto const& [fd, c] : conns) {
      if (c.session == 0 && c.deadline <= now) { expired.push_back(fd); }
    }
    for (int fd : expired) {
      log::warn("session socket: pid %d sent no hello in time; disconnected", conns[fd].peer.pid);
      drop(fd);
    }
  }
  std::vector<int> all;
  for (auto const& [fd, c] : conns) { all.push_back(fd); }
  for (int fd : all) { drop(fd); }
  close_listener();
  ::close(ep);
}

}  // namespace rmmd::session
