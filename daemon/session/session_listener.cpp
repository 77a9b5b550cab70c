#include "daemon/session/session_listener.hpp"

#include "common/hex.hpp"
#include "daemon/log.hpp"
#include "daemon/service/proto_convert.hpp"
#include "daemon/session/session_protocol.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tools/socket/fd_passing.hpp"

#include <absl/strings/str_format.h>

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
#include <memory>
#include <span>
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

/// A connection that has not said hello yet.
struct connection {
  int fd{-1};
  core::peer_credentials peer;
  clock::time_point deadline;
  core::session_id session{};  // set once the welcome is sent
};

/// What reading a hello led to.
enum class hello_outcome { wait, refused, welcomed };

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
  return fd_passing::send_datagram(fd, bytes, fds) == static_cast<ssize_t>(bytes.size());
}

void send_error(int fd, absl::Status const& status)
{
  send_message(fd, refusal_welcome(status), {});
}

/// One datagram from a client, read without blocking; `bytes` as recvmsg
/// returns it (errno set when negative). Fds attached to it are dropped
/// (never installed in this process): we never take fds from clients.
struct datagram {
  ssize_t bytes{};
  bool truncated{};  ///< larger than the buffer
};

datagram receive_datagram(int fd, std::span<char> buffer) noexcept
{
  auto const got = fd_passing::receive_datagram(fd, buffer, {}, MSG_DONTWAIT);
  return {.bytes = got.bytes, .truncated = got.truncated};
}

// Lines a client can cause, each class with a budget of its own
// (log::rate_limit), so that a client flooding the socket cannot flood the
// journal. Sessions opening and closing are the daemon's normal work: their
// budget lets a node's worth of processes start at once.
log::rate_limit refusal_lines{"sessions and connections refused", 2.0, 20};
log::rate_limit session_lines{"sessions opened or closed", 50.0, 500};
log::rate_limit silent_lines{"connections closed for sending no hello in time", 1.0, 10};
log::rate_limit unread_lines{"sessions ended for not reading their replies", 1.0, 10};

}  // namespace

/// An open session's connection, owned by the call threads.
struct session_listener::open_session {
  int fd{-1};
  core::session_id session{};
  pid_t pid{};
  uid_t uid{};  // counted in admission_ until the session ends
  /// Held by the call thread whose turn it is, until it has re-armed the
  /// connection. EPOLLONESHOT already gives the connection to one thread at
  /// a time, but the next turn can begin (in another thread's epoll_wait) as
  /// soon as the kernel has re-armed it, before this thread's epoll_ctl has
  /// returned; the kernel orders the two, and ThreadSanitizer, which does not
  /// model a re-arm (EPOLL_CTL_MOD), reported the next thread's close and
  /// delete as racing with this thread's last reads. With the mutex the
  /// hand-over is one TSan sees; uncontended but for that instant.
  std::mutex turn;
};

session_listener::session_listener(core::daemon_core& core, listener_options options)
    : core_(core),
      options_(std::move(options)),
      admission_(options_.admission, options_.admission_metrics)
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
  calls_wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (calls_wake_fd_ < 0) { throw_errno("eventfd"); }
  calls_epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (calls_epoll_ < 0) { throw_errno("epoll_create1"); }
  // Level-triggered and never read: once written, it wakes every call thread.
  epoll_event wake{};
  wake.events   = EPOLLIN;
  wake.data.ptr = nullptr;
  if (::epoll_ctl(calls_epoll_, EPOLL_CTL_ADD, calls_wake_fd_, &wake) != 0) {
    throw_errno("epoll_ctl");
  }
  core_.set_reclaim_notifier([this](core::session_id session,
                                    core::pool_id pool,
                                    std::size_t bytes) { push_reclaim(session, pool, bytes); });
  core_.set_retire_notifier(
      [this](core::session_id session, core::pool_id pool, std::vector<core::block_id> const& ids) {
        return push_retire(session, pool, ids);
      });
  for (std::size_t i = 0; i < std::max<std::size_t>(options_.call_threads, 1); ++i) {
    call_threads_.emplace_back([this] { run_calls(); });
  }
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
  ::eventfd_write(calls_wake_fd_, 1);
  thread_.join();
  for (auto& t : call_threads_) { t.join(); }
  call_threads_.clear();
  {
    // Calls held for idle slabs end by the core's reclaim_timeout.
    std::unique_lock lock(held_mutex_);
    held_done_.wait(lock, [this] { return held_threads_ == 0; });
  }
  core_.set_reclaim_notifier({});
  core_.set_retire_notifier({});
  std::vector<open_session*> left;
  for (auto const& [key, s] : open_) { left.push_back(key); }
  for (auto* s : left) { end_session(s); }
  ::close(calls_epoll_);
  ::close(calls_wake_fd_);
  ::close(wake_fd_);
  calls_epoll_   = -1;
  calls_wake_fd_ = -1;
  wake_fd_       = -1;
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

  // Connections that have not said hello; each counts in admission_.
  std::map<int, connection> conns;

  // Forgets a connection that has not said hello, closing it unless it was
  // handed to the call threads.
  auto forget = [&](int fd, bool close) {
    auto it = conns.find(fd);
    if (it == conns.end()) { return; }
    admission_.end_pending(it->second.peer.uid);
    ::epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    if (close) { ::close(fd); }
    conns.erase(it);
  };
  auto drop = [&](int fd) { forget(fd, true); };

  auto close_listener = [&] {
    if (listen_fd_ < 0) { return; }
    ::epoll_ctl(ep, EPOLL_CTL_DEL, listen_fd_, nullptr);
    ::close(listen_fd_);
    listen_fd_ = -1;
    ::unlink(options_.socket_path.c_str());
  };

  // Answers a connection with an error welcome (the caller closes it).
  auto refuse = [&](connection const& c, absl::Status const& status) {
    log::limited(refusal_lines,
                 log::level::warning,
                 "session refused for pid %d uid %d: %s",
                 c.peer.pid,
                 c.peer.uid,
                 std::string(status.message()));
    send_error(c.fd, status);
    return hello_outcome::refused;
  };

  auto on_readable = [&](connection& c) -> hello_outcome {
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
    if (!answer.grant) {
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
    auto const& grant = *answer.grant;
    // Counted, and logged, before the client can hear of it: a drain that
    // starts once the client holds its welcome must see this session, and a
    // reload of the log level that follows must not find this line unwritten.
    ++open_sessions_;
    // The token is a credential: log only its first 4 hex digits.
    log::limited(session_lines,
                 log::level::info,
                 "session %d opened: pid %d uid %d (%s), token %s...",
                 grant.id,
                 c.peer.pid,
                 c.peer.uid,
                 answer.client_name,
                 common::to_hex(std::span<std::byte const>(grant.token)).substr(0, 4));
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
  };

  // Takes what the backlog holds, 64 at most per turn: a flood of
  // connections cannot keep the loop from the hellos and deadlines of the
  // others (the listening socket stays readable, so epoll comes back to it).
  auto accept_some = [&] {
    for (int turn = 0; turn < 64; ++turn) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR) { continue; }
        return;  // EAGAIN, or a transient error: epoll will call again
      }
      connection c{
          .fd = fd, .peer = read_peer(fd), .deadline = clock::now() + options_.hello_deadline};
      // A client sends its hello as soon as it is connected, so it is usually
      // here already: answered now, it never counts as waiting, and a burst
      // of clients of one uid is not mistaken for silent ones.
      auto const outcome = on_readable(c);
      if (outcome == hello_outcome::welcomed) {
        serve_calls_of(fd, c.session, c.peer);
        continue;
      }
      if (outcome == hello_outcome::refused) {
        ::close(fd);
        continue;
      }
      // Silent so far: it waits, within the limits, so that silent clients
      // can neither exhaust the daemon's fds nor crowd out other users.
      if (auto admitted = admission_.admit_pending(c.peer.uid); !admitted.ok()) {
        refuse(c, admitted);
        ::close(fd);
        continue;
      }
      conns.emplace(fd, std::move(c));
      watch(fd, EPOLLIN | EPOLLRDHUP);
    }
  };

  std::vector<epoll_event> events(64);
  while (!stopping_) {
    if (stop_accepting_) { close_listener(); }
    int timeout_ms = -1;
    auto now       = clock::now();
    for (auto const& [fd, c] : conns) {
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
        accept_some();
        continue;
      }
      auto it = conns.find(fd);
      if (it == conns.end()) { continue; }
      auto outcome = hello_outcome::wait;
      if (events[i].events & EPOLLIN) { outcome = on_readable(it->second); }
      if (outcome == hello_outcome::welcomed) {
        // The connection now belongs to the call threads (a hang-up after
        // the hello is theirs to see).
        auto const session = it->second.session;
        auto const peer    = it->second.peer;
        forget(fd, false);
        serve_calls_of(fd, session, peer);
        continue;
      }
      if (outcome == hello_outcome::refused ||
          (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
        drop(fd);
      }
    }
    // Silent clients: the hello deadline closes them.
    now = clock::now();
    std::vector<int> expired;
    for (auto const& [fd, c] : conns) {
      if (c.deadline <= now) { expired.push_back(fd); }
    }
    for (int fd : expired) {
      log::limited(silent_lines,
                   log::level::warning,
                   "session socket: pid %d uid %d sent no hello in time; disconnected",
                   conns[fd].peer.pid,
                   conns[fd].peer.uid);
      drop(fd);
    }
  }
  std::vector<int> all;
  for (auto const& [fd, c] : conns) { all.push_back(fd); }
  for (int fd : all) { drop(fd); }
  close_listener();
  ::close(ep);
}

void session_listener::serve_calls_of(int fd,
                                      core::session_id session,
                                      core::peer_credentials const& peer)
{
  auto owned     = std::make_unique<open_session>();
  owned->fd      = fd;
  owned->session = session;
  owned->pid     = peer.pid;
  owned->uid     = peer.uid;
  auto* s        = owned.get();
  {
    std::lock_guard lock(open_mutex_);
    open_.emplace(s, std::move(owned));
    by_session_.emplace(session, s);
  }
  epoll_event ev{};
  ev.events   = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  ev.data.ptr = s;
  if (::epoll_ctl(calls_epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    log::error(
        "session %d: epoll_ctl failed: %s; ending the session", session, std::strerror(errno));
    end_session(s);
  }
}

void session_listener::end_session(open_session* s) noexcept
{
  std::unique_ptr<open_session> owned;
  {
    std::lock_guard lock(open_mutex_);
    auto it = open_.find(s);
    if (it == open_.end()) { return; }
    owned = std::move(it->second);
    open_.erase(it);
    by_session_.erase(s->session);
  }
  ::epoll_ctl(calls_epoll_, EPOLL_CTL_DEL, s->fd, nullptr);
  ::close(s->fd);
  // The slot is free once the connection is: before the core's stats stop
  // showing the session, so whoever sees it gone may open another.
  admission_.end_session(s->uid);
  core_.close_session(s->session);
  --open_sessions_;
  log::limited(session_lines, log::level::info, "session %d closed (pid %d)", s->session, s->pid);
}

void session_listener::run_calls() noexcept
{
  std::vector<char> buffer(options_.max_call_bytes);
  while (!stopping_) {
    epoll_event ev{};
    int n = ::epoll_wait(calls_epoll_, &ev, 1, -1);
    if (n < 0 && errno != EINTR) {
      log::error("session socket: epoll_wait failed: %s", std::strerror(errno));
      return;
    }
    if (n <= 0 || ev.data.ptr == nullptr) { continue; }  // the stop eventfd
    auto* s = static_cast<open_session*>(ev.data.ptr);
    std::unique_lock turn(s->turn);
    auto outcome = (ev.events & (EPOLLHUP | EPOLLERR)) == 0 ? turn_end::rearm : turn_end::end;
    std::vector<char> held_call;
    if (outcome == turn_end::rearm && (ev.events & EPOLLIN) != 0) {
      outcome = answer_calls(*s, buffer, held_call);
    }
    // A peer that hung up hears no replies: its session ends now.
    if (outcome == turn_end::rearm && (ev.events & EPOLLRDHUP) != 0) { outcome = turn_end::end; }
    if (outcome == turn_end::rearm && !rearm(*s)) { outcome = turn_end::end; }
    turn.unlock();  // before end_session() deletes it
    if (outcome == turn_end::end) { end_session(s); }
    // Its connection stays unwatched (its next calls wait, in order) until
    // the held call is answered.
    if (outcome == turn_end::held) { hold(s, std::move(held_call)); }
  }
}

bool session_listener::rearm(open_session& s) noexcept
{
  epoll_event again{};
  again.events   = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  again.data.ptr = &s;
  return ::epoll_ctl(calls_epoll_, EPOLL_CTL_MOD, s.fd, &again) == 0;
}

void session_listener::hold(open_session* s, std::vector<char> call) noexcept
{
  {
    std::lock_guard lock(held_mutex_);
    ++held_threads_;
  }
  std::shared_ptr<std::vector<char>> owned;
  try {
    owned = std::make_shared<std::vector<char>>(std::move(call));
    std::thread([this, s, owned] { answer_held(s, std::move(*owned)); }).detach();
  } catch (std::exception const&) {
    // No thread to spare: this one waits (at most reclaim_timeout).
    answer_held(s, owned ? std::move(*owned) : std::move(call));
  }
}

void session_listener::answer_held(open_session* s, std::vector<char> call) noexcept
{
  std::unique_lock turn(s->turn);
  auto outcome = turn_end::rearm;
  try {
    std::vector<int> fds;
    auto reply = handle_call(core_,
                             s->session,
                             {.bytes = std::span(call.data(), call.size())},
                             options_.max_call_bytes,
                             options_.call_metrics,
                             &fds);
    if (reply && !send_message(s->fd, *reply, fds)) { outcome = turn_end::end; }
    std::vector<char> buffer(options_.max_call_bytes);
    std::vector<char> next;
    if (outcome == turn_end::rearm) { outcome = answer_calls(*s, buffer, next); }
    if (outcome == turn_end::held) {
      turn.unlock();
      hold(s, std::move(next));
    }
  } catch (std::exception const&) {
    outcome = turn_end::end;
  }
  if (outcome == turn_end::rearm && !rearm(*s)) { outcome = turn_end::end; }
  if (turn.owns_lock()) { turn.unlock(); }
  if (outcome == turn_end::end) { end_session(s); }
  std::lock_guard lock(held_mutex_);
  --held_threads_;
  held_done_.notify_all();
}

void session_listener::push_reclaim(core::session_id session,
                                    core::pool_id pool,
                                    std::size_t bytes) noexcept
{
  try {
    v1::SessionReply push;
    push.mutable_reclaim()->set_pool_id(pool);
    push.mutable_reclaim()->set_bytes(bytes);
    auto const message = push.SerializeAsString();
    std::lock_guard lock(open_mutex_);  // end_session() closes the fd only after it let go
    auto it = by_session_.find(session);
    if (it == by_session_.end()) { return; }
    // Non-blocking: a client that reads nothing loses the request, not the daemon a thread.
    static_cast<void>(::send(it->second->fd, message.data(), message.size(), MSG_NOSIGNAL));
  } catch (std::exception const&) {
    // Out of memory: the waiting request is refused at its deadline.
  }
}

std::size_t session_listener::push_retire(core::session_id session,
                                          core::pool_id pool,
                                          std::vector<core::block_id> const& blocks) noexcept
{
  std::size_t sent = 0;
  try {
    std::lock_guard lock(open_mutex_);
    auto it = by_session_.find(session);
    if (it == by_session_.end()) { return blocks.size(); }  // ended: its blocks go with it
    // A datagram the client's receive buffer holds whole (protocol.md).
    while (sent < blocks.size()) {
      auto const n = std::min(blocks.size() - sent, retire_ids_per_datagram);
      v1::SessionReply push;
      push.mutable_retire_blocks()->set_pool_id(pool);
      for (std::size_t i = sent; i < sent + n; ++i) {
        push.mutable_retire_blocks()->add_block_ids(blocks[i]);
      }
      auto const message = push.SerializeAsString();
      // Non-blocking, as push_reclaim: what a full socket refuses is asked
      // for again later (the core keeps those blocks unretired).
      if (::send(it->second->fd, message.data(), message.size(), MSG_NOSIGNAL) !=
          static_cast<ssize_t>(message.size())) {
        break;
      }
      sent += n;
    }
  } catch (std::exception const&) {
    // Out of memory: what was not sent is asked for again later.
  }
  return sent;
}

session_listener::turn_end session_listener::answer_calls(open_session& s,
                                                          std::vector<char>& buffer,
                                                          std::vector<char>& held_call) noexcept
{
  // A few calls per turn, then the connection goes back in the set (it stays
  // readable), so one busy session cannot starve the others.
  for (int turn = 0; turn < 16; ++turn) {
    auto const [n, truncated] = receive_datagram(s.fd, buffer);
    if (n < 0 && errno == EINTR) { continue; }
    // Nothing more now; or the kernel is short of memory: try again later
    // rather than end a session whose memory may be in use on a GPU.
    if (n < 0 && (errno == EAGAIN || errno == ENOBUFS || errno == ENOMEM)) {
      return turn_end::rearm;
    }
    // End of file (a zero-length datagram reads the same), or an error.
    if (n <= 0) { return turn_end::end; }

    std::vector<int> fds;  // owned by the backends: the client gets copies
    bool held  = false;
    auto reply = handle_call(
        core_,
        s.session,
        {.bytes = std::span(buffer.data(), static_cast<std::size_t>(n)), .truncated = truncated},
        options_.max_call_bytes,
        options_.call_metrics,
        &fds,
        &held);
    if (held) {
      try {
        held_call.assign(buffer.data(), buffer.data() + n);
      } catch (std::exception const&) {
        return turn_end::end;
      }
      return turn_end::held;
    }
    if (!reply) { continue; }  // a Free that asked for no reply, done
    // Connections are non-blocking (accept4): a full socket fails at once.
    if (!send_message(s.fd, *reply, fds)) {
      // Full socket: the client sends calls without reading the replies.
      log::limited(unread_lines,
                   log::level::warning,
                   "session %d (pid %d) does not read its replies; ending it",
                   s.session,
                   s.pid);
      return turn_end::end;
    }
  }
  return turn_end::rearm;
}

}  // namespace rmmd::session
