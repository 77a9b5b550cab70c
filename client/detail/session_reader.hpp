#pragma once

// The thread that reads the session socket while no call does, so that what
// the daemon sends unasked (a ReclaimRequest, a RetireBlocks) is heard at
// once, and a daemon that went away is noticed (and reconnected to) without
// a call. Started once, by a session that holds packed blocks or watches
// reclaims; a session that does neither has no such thread.
//
// Owns: the thread and its eventfd, which stop() writes to end the thread
// and to cut short a wait_a_while() (a reconnect's wait between tries).
//
// Locks: start_mutex_ guards starting (a leaf). The listener's functions run
// on the thread with no lock of the reader's held; they take the channel's.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stop_token>
#include <thread>

namespace rmmd::detail {

class session_reader {
 public:
  /// What the thread watches and whom it tells.
  struct listener {
    /// The session socket of now.
    std::function<int()> socket_fd;
    /// The generation of the daemon of now (session_channel.hpp).
    std::function<std::uint32_t()> generation;
    /// The socket of generation `generation` closed: reconnect. False ends
    /// the thread (no daemon came back, or the session closes).
    std::function<bool(std::uint32_t generation)> daemon_gone;
    /// Datagrams wait on the socket.
    std::function<void()> readable;
  };

  explicit session_reader(listener l) : listener_(std::move(l)) {}
  session_reader(session_reader const&)            = delete;
  session_reader& operator=(session_reader const&) = delete;
  /// REQUIRES: stop() ran.
  ~session_reader() = default;

  /// Starts the thread unless it runs. Throws rmm::bad_alloc when the
  /// eventfd cannot be made.
  void start();
  /// Ends the thread and waits for it. Idempotent.
  void stop() noexcept;
  /// Waits `wait` (at least 1 ms), less once stop() is called.
  void wait_a_while(std::chrono::steady_clock::duration wait) const noexcept;
  /// True on a session's reader thread (which keeps whichever device it
  /// made current).
  [[nodiscard]] static bool on_reader_thread() noexcept;

 private:
  void run(std::stop_token stop) noexcept;

  listener const listener_;
  std::mutex start_mutex_;
  std::atomic<int> wake_fd_{-1};
  std::jthread thread_;
};

}  // namespace rmmd::detail
