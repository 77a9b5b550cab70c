#pragma once

// What the core's calls answer with: grants of sessions, leases and
// buffers, and the hold of a request that would have to wait. Plain values
// (a grant's memory is the backend's; see each field).

#include "daemon/core/pool_backend.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/statusor.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>

namespace rmmd::core {

/// What a request that finds its pool short does when other sessions hold
/// idle slabs there that could serve it (see lease_allocator::allocate).
enum class reclaim_policy : std::uint8_t {
  /// Asks them to give those back and waits (up to reclaim_timeout) for the
  /// room: for callers whose thread may block.
  wait,
  /// Refuses at once, as if no session held idle slabs.
  refuse,
};

/// The answer of allocate_or_hold() or create_buffer_or_hold() where the
/// request would wait for idle slabs to come back: nothing changed, and the
/// caller makes the request again with reclaim_policy::wait from a thread
/// that may block. Never sent to a client.
struct reclaim_hold {};

/// A request's answer, or a hold (see reclaim_hold).
template <class T>
using answer_or_hold = std::variant<absl::StatusOr<T>, reclaim_hold>;

/// 128 random bits, the session's bearer credential on the gRPC socket.
using session_token = std::array<std::byte, 16>;

struct session_grant {
  session_id id{};
  session_token token{};
};

struct lease_grant {
  allocation_id id{};
  /// The lease's memory; for a packed lease, the whole block (its export data
  /// names the block), with the lease `block_offset` bytes into it.
  backend_allocation block;
  block_id packed_block{};  ///< 0: a lease of its own
  std::uint64_t block_offset{};
  std::size_t bytes{};  ///< bytes reserved for the lease
};

/// A shared buffer a session now holds (by create or open), and its memory.
struct buffer_grant {
  buffer_id id{};
  pool_id pool{};
  std::string name;
  std::size_t size{};  ///< bytes the creator asked for
  shared_allocation block;
  buffer_state state{};
  bool persistent{false};
  buffer_access access{buffer_access::read};
  /// Its manifest (shared, never changed in place); null: it has none.
  std::shared_ptr<buffer_manifest const> manifest;
  /// An exclusive open: the generation of the write lease it holds; 0: none.
  std::uint64_t lease_generation{};
};

/// One of this node's buffers as another node's daemon holds it (peering).
struct remote_buffer_grant {
  remote_hold_id hold{};
  buffer_grant grant{};    ///< its block carries the fabric handle
  std::string gpu_uuid{};  ///< the GPU of its pool
};

/// Told, without the core's lock, that a session let go of a buffer of
/// another node (close_buffer or its end): see buffer_registry::add_foreign_hold.
using foreign_release_notifier = std::function<void(buffer_id)>;

/// One buffer as a session that may see it sees it, with its manifest.
struct buffer_description {
  buffer_info info;
  std::shared_ptr<buffer_manifest const> manifest;  ///< null: it has none
};

}  // namespace rmmd::core
