#pragma once

// Private to daemon_core's translation units: what the core keeps per pool,
// per session and per shared buffer. Guarded by daemon_core::mutex_.

#include "daemon/backends/host/offset_allocator.hpp"
#include "daemon/core/daemon_core.hpp"

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace rmmd::core {

/// How long a pool counts as under pressure after an allocation failed there.
inline constexpr auto pressure_window = std::chrono::seconds(2);

struct daemon_core::pool_entry {
  pool_config config;
  std::unique_ptr<pool_backend> backend;
  std::size_t capacity{};
  std::size_t in_use{};  // leases and shared buffers
  std::size_t high_water{};
  std::size_t live{};  // leases
  std::uint64_t total{};
  std::chrono::steady_clock::time_point pressure_until{};
  std::uint64_t reclaim_waits{};  // see pool_stats
  std::uint64_t reclaim_served{};
  std::uint64_t reclaim_refused{};
};

/// A block of a CUDA pool that the daemon leases to one session and carves
/// that session's small direct allocations out of (core_options::pack_up_to).
/// Charged to the session like a lease of its size.
struct packed_block {
  block_id id{};
  backend_allocation memory;                ///< the block, with its export data
  backends::host::offset_allocator ranges;  ///< offsets into it (pure arithmetic)
  std::size_t leases{};                     ///< live leases carved out of it
  std::size_t lease_bytes{};                ///< their bytes
  /// Asked to be dropped: nothing more is carved out of it, and it goes once
  /// the client says it freed its import (or with the session).
  bool retired{false};
  std::chrono::steady_clock::time_point empty_since{};  ///< when `leases` last fell to 0
};

/// A session's packed blocks of one pool, by the block's address in the
/// daemon (a lease's address finds its block).
using packed_blocks = std::map<std::uintptr_t, packed_block>;

struct daemon_core::session_entry {
  session_id id{};
  std::string token_hex;
  peer_credentials peer;
  std::string command;
  std::string client_name;
  std::size_t bytes{};  // leases
  std::size_t count{};
  std::chrono::system_clock::time_point started;
  std::map<pool_id, std::size_t> pool_bytes;  // what it holds, per pool
  std::map<pool_id, carved_usage> carved;     // what it says it carved, per pool
  std::size_t shared_bytes{};                 // buffers it created and holds (charged with `bytes`)
  std::map<buffer_id, std::size_t> holds;     // buffers it holds: opens (and its create) not closed
  std::map<pool_id, packed_blocks> packed;    // its packed blocks (charged with `bytes`)
};

struct daemon_core::buffer_entry {
  buffer_id id{};
  std::string name;
  pool_id pool{};
  std::size_t size{};       // asked for
  std::size_t charge{};     // charged to the pool and the uid (while creating: the estimate)
  shared_allocation block;  // empty while `creating`
  bool creating{true};      // the backend is allocating, without the lock
  buffer_state state{buffer_state::writing};
  bool persistent{false};
  std::optional<gid_t> gid;
  session_id creator{};
  uid_t creator_uid{};
  pid_t creator_pid{};
  bool creator_charged{true};                 // the creating session is open and counts the bytes
  std::map<session_id, std::size_t> holders;  // session -> its opens (its create counts one)
  std::chrono::system_clock::time_point created;
};

}  // namespace rmmd::core
