#pragma once

// The answering side of the session socket: owns every open session's
// connection once its welcome is sent, answers its calls, pushes the daemon's
// unasked datagrams (ReclaimRequest, RetireBlocks) to it, and ends the
// session when the connection closes.
//
// Thread safety: the call threads share one epoll set and each take one
// connection at a time (EPOLLONESHOT), so the calls of one session are
// answered in order and those of different sessions at once. open_mutex_
// guards the map of open sessions (taken per session and per push, never per
// call); held_mutex_ counts the threads of calls held for idle slabs. start(),
// stop_threads() and end_all_sessions() are called from one thread.

#include "daemon/core/daemon_core.hpp"
#include "daemon/session/admission.hpp"
#include "daemon/session/listener_options.hpp"

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rmmd::session_socket {

/// Block ids per RetireBlocks datagram: at most 10 bytes each, so that every
/// one fits the 4096 bytes a client reads at once.
inline constexpr std::size_t retire_ids_per_datagram = 256;

class call_threads {
 public:
  /// Takes each ended session off `open_sessions` and out of `admission`.
  call_threads(core::daemon_core& core,
               listener_options const& options,
               admission& admission,
               std::atomic<std::size_t>& open_sessions);
  call_threads(call_threads const&)            = delete;
  call_threads& operator=(call_threads const&) = delete;
  /// REQUIRES: stop_threads() and end_all_sessions() were called, if start() was.
  ~call_threads();

  /// Starts the threads. Throws std::system_error on failure.
  void start();

  /// Takes a welcomed connection: its calls are answered from now on, and its
  /// close ends `session`.
  void serve(int fd, core::session_id session, core::peer_credentials const& peer);

  /// A ReclaimRequest datagram to `session`, without waiting (a full socket
  /// drops it): the core's reclaim notifier.
  void push_reclaim(core::session_id session, core::pool_id pool, std::size_t bytes) noexcept;

  /// Sends RetireBlocks to `session` (the core's retire notifier), at most
  /// retire_ids_per_datagram ids each, without waiting; returns how many ids
  /// went out (a full socket stops it).
  std::size_t push_retire(core::session_id session,
                          core::pool_id pool,
                          std::vector<core::block_id> const& blocks) noexcept;

  /// Stops and joins the call threads, and waits for held calls to end (by
  /// the core's reclaim_timeout). The sessions stay open.
  void stop_threads() noexcept;

  /// Closes every connection, ending their sessions.
  /// REQUIRES: stop_threads() was called.
  void end_all_sessions() noexcept;

 private:
  struct open_session;
  /// How a call thread's turn with a connection ended.
  enum class turn_end : std::uint8_t {
    rearm,  ///< answered what was there: watch the connection again
    end,    ///< the session is over
    held,   ///< a call waits for idle slabs: a thread of its own answers it
  };

  void run() noexcept;
  /// One turn of a call thread with the connection an epoll event names.
  void take_turn(open_session* s, std::uint32_t events, std::vector<char>& buffer) noexcept;
  /// Answers what `s` has sent. A call held for idle slabs is left in
  /// `held_call` (its bytes) with the turn ended `held`.
  turn_end answer_calls(open_session& s,
                        std::vector<char>& buffer,
                        std::vector<char>& held_call) noexcept;
  /// Watches `s`'s connection again (EPOLLONESHOT); false if it cannot.
  bool rearm(open_session& s) noexcept;
  /// Hands `call` of `s` to a new thread running answer_held().
  void hold(open_session* s, std::vector<char> call) noexcept;
  /// On a thread of its own (the caller's turn on `s` passes to it): answers
  /// `call`, which waits for other sessions to give idle slabs back, then
  /// goes on with `s`'s next calls as a call thread would.
  void answer_held(open_session* s, std::vector<char> call) noexcept;
  void end_session(open_session* s) noexcept;

  core::daemon_core& core_;
  listener_options const& options_;
  admission& admission_;
  std::atomic<std::size_t>& open_sessions_;
  int epoll_{-1};
  int wake_fd_{-1};  // written once, at stop; never read
  std::vector<std::thread> threads_;
  std::mutex open_mutex_;
  std::unordered_map<open_session*, std::unique_ptr<open_session>> open_;
  std::unordered_map<core::session_id, open_session*> by_session_;  // guarded by open_mutex_
  std::mutex held_mutex_;
  std::condition_variable held_done_;
  std::size_t held_threads_{};  // guarded by held_mutex_; stop_threads() waits for 0
  std::atomic<bool> stopping_{false};
};

}  // namespace rmmd::session_socket
