#include "daemon/session/call_threads.hpp"

#include "daemon/log.hpp"
#include "daemon/session/connection_io.hpp"
#include "daemon/session/session_protocol.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>
#include <string>
#include <system_error>

namespace rmmd::session_socket {

/// An open session's connection, owned by the call threads.
struct call_threads::open_session {
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

call_threads::call_threads(core::daemon_core& core,
                           listener_options const& options,
                           admission& admission,
                           std::atomic<std::size_t>& open_sessions)
    : core_(core), options_(options), admission_(admission), open_sessions_(open_sessions)
{
}

call_threads::~call_threads() = default;

void call_threads::start()
{
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) { throw std::system_error(errno, std::generic_category(), "eventfd"); }
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) { throw std::system_error(errno, std::generic_category(), "epoll_create1"); }
  // Level-triggered and never read: once written, it wakes every call thread.
  epoll_event wake{};
  wake.events   = EPOLLIN;
  wake.data.ptr = nullptr;
  if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_fd_, &wake) != 0) {
    throw std::system_error(errno, std::generic_category(), "epoll_ctl");
  }
  for (std::size_t i = 0; i < std::max<std::size_t>(options_.call_threads, 1); ++i) {
    threads_.emplace_back([this] { run(); });
  }
}

void call_threads::stop_threads() noexcept
{
  stopping_ = true;
  if (wake_fd_ >= 0) { ::eventfd_write(wake_fd_, 1); }
  for (auto& t : threads_) { t.join(); }
  threads_.clear();
  std::unique_lock lock(held_mutex_);
  held_done_.wait(lock, [this] { return held_threads_ == 0; });
}

void call_threads::end_all_sessions() noexcept
{
  std::vector<open_session*> left;
  for (auto const& [key, s] : open_) { left.push_back(key); }
  for (auto* s : left) { end_session(s); }
  if (epoll_ >= 0) { ::close(epoll_); }
  if (wake_fd_ >= 0) { ::close(wake_fd_); }
  epoll_   = -1;
  wake_fd_ = -1;
}

void call_threads::serve(int fd, core::session_id session, core::peer_credentials const& peer)
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
  if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    log::error(
        "session %d: epoll_ctl failed: %s; ending the session", session, std::strerror(errno));
    end_session(s);
  }
}

void call_threads::end_session(open_session* s) noexcept
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
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, s->fd, nullptr);
  ::close(s->fd);
  // The slot is free once the connection is: before the core's stats stop
  // showing the session, so whoever sees it gone may open another.
  admission_.end_session(s->uid);
  core_.close_session(s->session);
  --open_sessions_;
  log::limited(session_lines, log::level::info, "session %d closed (pid %d)", s->session, s->pid);
}

void call_threads::run() noexcept
{
  std::vector<char> buffer(options_.max_call_bytes);
  while (!stopping_) {
    epoll_event ev{};
    int n = ::epoll_wait(epoll_, &ev, 1, -1);
    if (n < 0 && errno != EINTR) {
      log::error("session socket: epoll_wait failed: %s", std::strerror(errno));
      return;
    }
    if (n <= 0 || ev.data.ptr == nullptr) { continue; }  // the stop eventfd
    take_turn(static_cast<open_session*>(ev.data.ptr), ev.events, buffer);
  }
}

void call_threads::take_turn(open_session* s,
                             std::uint32_t events,
                             std::vector<char>& buffer) noexcept
{
  std::unique_lock turn(s->turn);
  auto outcome = (events & (EPOLLHUP | EPOLLERR)) == 0 ? turn_end::rearm : turn_end::end;
  std::vector<char> held_call;
  if (outcome == turn_end::rearm && (events & EPOLLIN) != 0) {
    outcome = answer_calls(*s, buffer, held_call);
  }
  // A peer that hung up hears no replies: its session ends now.
  if (outcome == turn_end::rearm && (events & EPOLLRDHUP) != 0) { outcome = turn_end::end; }
  if (outcome == turn_end::rearm && !rearm(*s)) { outcome = turn_end::end; }
  turn.unlock();  // before end_session() deletes it
  if (outcome == turn_end::end) { end_session(s); }
  // Its connection stays unwatched (its next calls wait, in order) until the
  // held call is answered.
  if (outcome == turn_end::held) { hold(s, std::move(held_call)); }
}

bool call_threads::rearm(open_session& s) noexcept
{
  epoll_event again{};
  again.events   = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  again.data.ptr = &s;
  return ::epoll_ctl(epoll_, EPOLL_CTL_MOD, s.fd, &again) == 0;
}

void call_threads::hold(open_session* s, std::vector<char> call) noexcept
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

void call_threads::answer_held(open_session* s, std::vector<char> call) noexcept
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

void call_threads::push_reclaim(core::session_id session,
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

std::size_t call_threads::push_retire(core::session_id session,
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

call_threads::turn_end call_threads::answer_calls(open_session& s,
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

}  // namespace rmmd::session_socket
