#pragma once

// The daemon of now, as the session's ids see it: its generation, its
// token, the gRPC stubs, and the translation of ids between the session's
// parts and that daemon.
//
// Generations: each daemon the session has connected to is a generation
// (0 the first, then one more per reconnect). The ids the parts hold
// (allocations, packed blocks, shared buffers) are *client ids*: the
// daemon's id with the generation in bits 48 to 62 (generation 0: the
// daemon's id itself). Pool ids are those of the first welcome, matched to
// each later daemon's pools by name and GPU. to_daemon and from_daemon
// translate both ways, in this one place: a call about an older
// generation's id is answered here (a Free or a close: done, nothing to
// ask; the new daemon never lent it), unless it is a shared buffer the new
// daemon holds for this session again, whose new id it takes.
//
// Owns: the token, the gRPC channels and stubs of every daemon so far (an
// earlier one's stay valid for calls under way until the session ends), the
// pool id tables, the shared buffers the session holds (to hold them again
// after a reconnect) and the ids they had before, and the reconnects not
// yet told to on_reconnect.
//
// Locks: mutex_ guards all of it, a leaf held for no I/O. The generation,
// the session id and the stub of now are also atomics, read without it;
// they change only in adopt(), under mutex_, with the token: a context
// made under mutex_ for a generation carries that generation's token.

#include <rmmd/session.hpp>

#include "rmmd/v1/rmmd.grpc.pb.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rmmd::detail {

/// Client ids (see above): the daemon's id with the generation in bits 48-62.
inline constexpr unsigned generation_shift      = 48;
inline constexpr std::uint32_t generation_count = 1u << 15;
inline constexpr std::uint64_t daemon_id_mask   = (std::uint64_t{1} << generation_shift) - 1;
[[nodiscard]] constexpr std::uint32_t generation_of(std::uint64_t client_id) noexcept
{
  return static_cast<std::uint32_t>(client_id >> generation_shift) & (generation_count - 1);
}
[[nodiscard]] constexpr std::uint64_t client_id(std::uint64_t daemon_id,
                                                std::uint32_t generation) noexcept
{
  return daemon_id | (std::uint64_t{generation} << generation_shift);
}

/// The answer to a call about address-stable allocations that a daemon
/// before a reconnect made (FAILED_PRECONDITION, saying what is left of them
/// and what to do).
[[nodiscard]] grpc::Status stable_of_gone_daemon();

class session_ids {
 public:
  /// The first daemon's welcome: generation 0, whose pool ids are the
  /// session's. `options` outlives this.
  session_ids(session::options const& options, v1::SessionWelcome const& first);
  session_ids(session_ids const&)            = delete;
  session_ids& operator=(session_ids const&) = delete;

  [[nodiscard]] std::uint32_t generation() const noexcept
  {
    return generation_.load(std::memory_order_acquire);
  }
  [[nodiscard]] std::uint64_t session_id() const noexcept
  {
    return session_id_.load(std::memory_order_acquire);
  }
  /// Whether the daemon of now takes session-socket calls, and whether this
  /// session's calls take them (options.lease_calls).
  [[nodiscard]] bool daemon_takes_calls() const noexcept
  {
    return daemon_takes_calls_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] bool session_calls() const noexcept
  {
    return session_calls_.load(std::memory_order_relaxed);
  }

  /// A new daemon's pools matched to the first welcome's by name and GPU.
  struct pool_match {
    std::vector<std::int64_t> to_daemon;    ///< by pool id: the daemon's, -1 none
    std::vector<std::int64_t> from_daemon;  ///< by the daemon's pool id: ours, -1 none
  };
  [[nodiscard]] pool_match match_pools(v1::SessionWelcome const& welcome) const;
  /// Makes the daemon of `welcome` the session's, as generation
  /// `generation`: its token, transport, gRPC channel and pools.
  void adopt(v1::SessionWelcome const& welcome, std::uint32_t generation, pool_match pools);

  /// The first welcome's pool `pool_id` at the daemon of now; nullopt when
  /// that daemon serves no such pool (an id no welcome described: itself).
  [[nodiscard]] std::optional<std::uint32_t> daemon_pool(std::uint32_t pool_id) const;
  /// The first welcome's id of the daemon of now's pool `daemon_pool_id`.
  [[nodiscard]] std::optional<std::uint32_t> session_pool(std::uint32_t daemon_pool_id) const;
  /// The daemon's id of shared buffer `id` (a client id) now: its own, or the
  /// new one of a buffer held again after a reconnect; nullopt when the
  /// daemon of now does not know it.
  [[nodiscard]] std::optional<std::uint64_t> daemon_buffer(std::uint64_t id) const;
  /// `call`'s ids as the daemon of `generation` knows them; an answer when
  /// the call is about what only an earlier daemon knew (see above).
  [[nodiscard]] std::optional<grpc::Status> to_daemon(v1::SessionCall& call,
                                                      std::uint32_t generation) const;
  /// `reply`'s ids as client ids (and pool ids of the first welcome).
  [[nodiscard]] grpc::Status from_daemon(v1::SessionReply& reply, std::uint32_t generation) const;

  /// The stub of generation `generation` and a context for it (the token
  /// and a deadline call_timeout away); no context when that generation is
  /// past.
  struct grpc_target {
    std::unique_ptr<grpc::ClientContext> context;
    v1::Rmmd::Stub* stub{};
  };
  [[nodiscard]] grpc_target target(std::uint32_t generation) const;
  /// The stub of now.
  [[nodiscard]] v1::Rmmd::Stub& stub() const noexcept
  {
    return *stub_.load(std::memory_order_acquire);
  }
  [[nodiscard]] std::string token_hex() const;

  /// A shared buffer the session holds, by name, to hold again at a new daemon.
  struct held_buffer {
    std::string name;
    std::string peer;  ///< the node of a buffer of another node
    std::size_t opens{};
  };
  using held_map = std::unordered_map<std::uint64_t, held_buffer>;
  /// Notes the buffers that `call` (a create, open or close, with the
  /// client's ids) opened or closed, once `reply` answered it.
  void note_holds(v1::SessionCall const& call, v1::SessionReply const& reply);
  /// The buffers held (the map is left empty, for held_again to fill).
  [[nodiscard]] held_map take_held();
  /// The buffers a new daemon holds again: their ids there (`renamed`: the
  /// id before -> the id now) and what they are.
  void held_again(std::unordered_map<std::uint64_t, std::uint64_t> renamed, held_map held_now);

  /// A reconnect not yet told (on_reconnect), and the generation it ended.
  using untold_reconnect = std::pair<reconnect_info, std::uint32_t>;
  void note_untold(reconnect_info const& info, std::uint32_t old_generation) noexcept;
  [[nodiscard]] std::vector<untold_reconnect> take_untold();
  [[nodiscard]] bool has_untold() const;

 private:
  session::options const& options_;
  std::atomic<std::uint32_t> generation_{0};  // modulo generation_count
  std::atomic<std::uint64_t> session_id_{0};
  std::atomic<bool> session_calls_{false};
  std::atomic<bool> daemon_takes_calls_{false};
  std::atomic<v1::Rmmd::Stub*> stub_{nullptr};  // the last of stubs_

  mutable std::mutex mutex_;
  std::string token_hex_;
  std::vector<std::shared_ptr<grpc::Channel>> grpc_channels_;  // every daemon's
  std::vector<std::unique_ptr<v1::Rmmd::Stub>> stubs_;
  std::vector<std::string> first_pool_keys_;  // by pool id: name and GPU
  pool_match pools_;
  held_map held_;                                             // by client id of now
  std::unordered_map<std::uint64_t, std::uint64_t> renamed_;  // earlier id -> id of now
  std::vector<untold_reconnect> untold_;
};

}  // namespace rmmd::detail
