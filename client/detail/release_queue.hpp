#pragma once

// The calls that CUDA host functions leave to be sent once their stream
// reached them: the Free of an allocation whose import the stream freed,
// the publication of a shared buffer whose writes the stream did, the close
// of a buffer whose import it freed, the drop of a packed block. A host
// function may make no CUDA call and must not wait for a daemon round trip,
// so it queues its call and sends the queue itself only when the socket is
// free at once (release_sender::try_send_now); otherwise the holder of the
// socket sends it before letting go.
//
// Owns: the queued calls and the count of shared buffers' host functions
// not yet run. Shared (std::shared_ptr) by the session and the host
// functions, which may run after the session is gone (while the process
// exits): they find no sender then and drop their call (the daemon
// reclaims what a closed session held).
//
// Locks: `mutex` guards every member. A host function holding it only
// tries the sender's socket; the sender, holding the socket, may wait for
// `mutex` to take the queue (take()), never the other way round.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace rmmd::detail {

/// A call a host function sends once its stream reached it.
struct queued_call {
  enum class kind : std::uint8_t { free, publish_buffer, close_buffer, drop_block };
  kind what{kind::free};
  std::uint64_t id{};  ///< the allocation, buffer or packed block (a client id)
  /// close_buffer: which of the session's opens it ends (rmmd.v1.BufferHold's number).
  std::uint8_t hold{};
};

/// The request `what` in words, for a line saying that it failed.
[[nodiscard]] char const* queued_what(queued_call::kind what) noexcept;

/// Who sends the queue (the session's channel).
class release_sender {
 public:
  /// Sends `calls` (and clears it) when the socket is free at once; false,
  /// leaving `calls` as they are, when a call holds it.
  virtual bool try_send_now(std::vector<queued_call>& calls) noexcept = 0;

 protected:
  ~release_sender() = default;
};

struct release_queue {
  std::mutex mutex;
  release_sender* sender{};  ///< null once the session is gone
  std::vector<queued_call> calls;
  /// Host functions of shared buffers enqueued and not yet run: the
  /// session waits for them before it closes (the daemon would free a
  /// buffer whose import a stream still uses).
  std::size_t buffer_jobs{};
  std::condition_variable buffer_jobs_done;

  /// From a CUDA host function: queues `call`, and sends the queue at once
  /// when the socket is free; else its holder sends it.
  void send_when_reached(queued_call call) noexcept;
  /// The calls queued so far (the sender's, holding the socket).
  [[nodiscard]] std::vector<queued_call> take();
};

}  // namespace rmmd::detail
