#pragma once

// The session socket (rmmd-session.sock): kernel-verified identity, the
// session token and the pools' fds by SCM_RIGHTS, liveness by the open
// connection, and the lease calls (Allocate, Free) of the session on that
// connection. See docs/protocol.md for the exchange.
//
// Thread safety: start(), stop_accepting() and stop() are called from one
// thread (main). One thread accepts connections and reads hellos; once a
// session is open, its connection belongs to the call threads, which share one
// epoll set and each take one connection at a time (EPOLLONESHOT), so the calls
// of one session are answered in order and those of different sessions at once.

#include "daemon/core/daemon_core.hpp"
#include "daemon/metrics/admission_metrics.hpp"
#include "daemon/metrics/request_metrics.hpp"
#include "daemon/session/admission.hpp"
#include "daemon/session/admission_limits.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace rmmd::session {

/// Block ids per RetireBlocks datagram: at most 10 bytes each, so that every
/// one fits the 4096 bytes a client reads at once.
inline constexpr std::size_t retire_ids_per_datagram = 256;

struct listener_options {
  std::filesystem::path socket_path;
  /// A client that has not sent its hello by then is disconnected.
  std::chrono::milliseconds hello_deadline{2000};
  /// A larger hello is refused (INVALID_ARGUMENT) and disconnected.
  std::size_t max_hello_bytes{4096};
  /// Connections waiting to say hello and open sessions, per uid and in all;
  /// past them a connection or hello is refused (RESOURCE_EXHAUSTED).
  admission_limits admission{};
  /// Advertised in the welcome: the gRPC server's message size cap.
  std::uint32_t max_message_bytes{};
  /// Mode of the socket file.
  unsigned socket_mode{0660};
  /// Threads answering calls. The core serialises its ledger; these overlap
  /// the backends' work (a CUDA allocation and its export) and the socket I/O.
  /// Four measured best on an H100 host of 16 cores (8 gave half the
  /// throughput of 16 direct clients: more threads contend in the driver).
  std::size_t call_threads{4};
  /// A larger call is answered INVALID_ARGUMENT (the session goes on).
  std::size_t max_call_bytes{4096};
  /// Where each answered Allocate and Free is counted; none if null.
  metrics::request_metrics* call_metrics{nullptr};
  /// Where admission refusals and waiting connections are counted; none if null.
  metrics::admission_metrics* admission_metrics{nullptr};
};

class session_listener {
 public:
  session_listener(core::daemon_core& core, listener_options options);
  session_listener(session_listener const&)            = delete;
  session_listener& operator=(session_listener const&) = delete;
  /// Calls stop().
  ~session_listener();

  /// Binds and listens (a stale socket file at the path is replaced), then
  /// serves on a thread of its own. Throws std::system_error on failure.
  void start();

  /// Closes the listening socket and removes its file: no new sessions, the
  /// open ones carry on.
  void stop_accepting();

  /// Stops the thread and closes every connection, ending their sessions.
  void stop() noexcept;

  /// Sessions whose connection is open.
  [[nodiscard]] std::size_t open_sessions() const noexcept
  {
    return open_sessions_.load();
  }

  /// New admission limits (a reload), from the next connection and hello on;
  /// what is open stays open. Any thread.
  void set_admission_limits(admission_limits limits)
  {
    admission_.set_limits(limits);
  }

 private:
  struct open_session;
  /// How a call thread's turn with a connection ended.
  enum class turn_end : std::uint8_t {
    rearm,  ///< answered what was there: watch the connection again
    end,    ///< the session is over
    held,   ///< a call waits for idle slabs: a thread of its own answers it
  };

  void run() noexcept;
  /// Hands a welcomed connection to the call threads.
  void serve_calls_of(int fd, core::session_id session, core::peer_credentials const& peer);
  void run_calls() noexcept;
  /// Answers what `s` has sent. A call held for idle slabs is left in
  /// `held_call` (its bytes) with the turn ended `held`.
  turn_end answer_calls(open_session& s,
                        std::vector<char>& buffer,
                        std::vector<char>& held_call) noexcept;
  /// Watches `s`'s connection again (EPOLLONESHOT); false if it cannot.
  bool rearm(open_session& s) noexcept;
  /// On a thread of its own (the caller's turn on `s` passes to it): answers
  /// `call`, which waits for other sessions to give idle slabs back, then
  /// goes on with `s`'s next calls as a call thread would.
  void answer_held(open_session* s, std::vector<char> call) noexcept;
  /// Hands `call` of `s` to a new thread running answer_held().
  void hold(open_session* s, std::vector<char> call) noexcept;
  /// The reclaim notifier given to the core: a ReclaimRequest datagram to
  /// the session, without waiting (a full socket drops it).
  void push_reclaim(core::session_id session, core::pool_id pool, std::size_t bytes) noexcept;
  /// Sends RetireBlocks to `session` (the core's retire notifier), at most
  /// retire_ids_per_datagram ids each, without waiting; returns how many
  /// ids went out (a full socket stops it).
  std::size_t push_retire(core::session_id session,
                          core::pool_id pool,
                          std::vector<core::block_id> const& blocks) noexcept;
  void end_session(open_session* s) noexcept;

  core::daemon_core& core_;
  listener_options options_;
  admission admission_;
  int listen_fd_{-1};
  int wake_fd_{-1};
  int calls_epoll_{-1};
  int calls_wake_fd_{-1};  // written once, at stop; never read
  std::vector<std::thread> call_threads_;
  std::mutex open_mutex_;
  std::unordered_map<open_session*, std::unique_ptr<open_session>> open_;
  std::unordered_map<core::session_id, open_session*> by_session_;  // guarded by open_mutex_
  std::mutex held_mutex_;
  std::condition_variable held_done_;
  std::size_t held_threads_{};  // guarded by held_mutex_; stop() waits for 0
  std::atomic<bool> stop_accepting_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<std::size_t> open_sessions_{0};
  std::thread thread_;
};

}  // namespace rmmd::session
