#pragma once

// The daemon's logic: pools, sessions, leases, quotas, shared buffers and
// stats. It knows nothing of gRPC, protobuf or sockets; adapters translate.
//
// A composition root over one shared state (core_state.hpp: the pools, the
// sessions, the buffers, the charges, and the one mutex that guards them)
// and the parts that own its domains, each in its own header:
//   sessions()  session_registry  open, authenticate, list sessions
//   leases()    lease_allocator   allocate, free, packed blocks, reclaim, usage
//   buffers()   buffer_registry   shared buffers, manifests, remote and foreign holds
//   pools()     pool_registry     pools, tenants' backends, trim, stats
//   stables()   stable_registry   address-stable allocations, sleep and wake
// It keeps the steps that span them: a session's end (its leases, its
// buffers, its tenant's backends), the drain and a reload.
//
// Thread safety: every member may be called from any thread; the parts
// serialise on the shared state's mutex (each header says where one lets go
// of it).
//
// Errors are absl::Status with the codes of DESIGN.md's error table.

#include "daemon/core/buffer_registry.hpp"
#include "daemon/core/core_options.hpp"
#include "daemon/core/core_state.hpp"
#include "daemon/core/grants.hpp"
#include "daemon/core/lease_allocator.hpp"
#include "daemon/core/pool_registry.hpp"
#include "daemon/core/session_registry.hpp"
#include "daemon/core/stable_registry.hpp"
#include "daemon/core/types.hpp"

namespace rmmd::core {

class daemon_core {
 public:
  explicit daemon_core(core_options options);
  daemon_core(daemon_core const&)            = delete;
  daemon_core& operator=(daemon_core const&) = delete;
  /// Closes every session, then frees the buffers left (persistent ones
  /// too) and the backups kept.
  ~daemon_core();

  [[nodiscard]] session_registry& sessions() noexcept
  {
    return sessions_;
  }
  [[nodiscard]] session_registry const& sessions() const noexcept
  {
    return sessions_;
  }
  [[nodiscard]] lease_allocator& leases() noexcept
  {
    return leases_;
  }
  [[nodiscard]] lease_allocator const& leases() const noexcept
  {
    return leases_;
  }
  [[nodiscard]] buffer_registry& buffers() noexcept
  {
    return buffers_;
  }
  [[nodiscard]] buffer_registry const& buffers() const noexcept
  {
    return buffers_;
  }
  [[nodiscard]] pool_registry& pools() noexcept
  {
    return pools_;
  }
  [[nodiscard]] pool_registry const& pools() const noexcept
  {
    return pools_;
  }
  [[nodiscard]] stable_registry& stables() noexcept
  {
    return stables_;
  }
  [[nodiscard]] stable_registry const& stables() const noexcept
  {
    return stables_;
  }

  /// Ends a session: frees its address-stable allocations (but keeps those
  /// asleep with a named backup), frees every lease it still holds, drops its holds of
  /// buffers (telling the foreign release notifier of other nodes' buffers,
  /// without the lock), and retires its tenant's backends if it was the
  /// tenant's last. Unknown ids are ignored (the session socket and shutdown
  /// may both close one).
  void close_session(session_id id) noexcept;

  /// Frees every lease of every session and forgets the sessions.
  void close_all_sessions() noexcept;

  /// Drain, first phase (SIGTERM): open_session answers UNAVAILABLE; the live
  /// sessions keep allocating and freeing until they leave or the deadline.
  void stop_new_sessions();

  /// Drain, second phase (the deadline): allocate answers UNAVAILABLE too;
  /// free still works, and leaves the freed memory as it is (every backend's
  /// stop_lending()): the sessions closed at the stop belong to clients that
  /// may reconnect to the next daemon with that memory still mapped.
  void begin_drain();

  /// True once either phase has begun.
  [[nodiscard]] bool draining() const;

  /// Applies a configuration reload: who may open sessions, the quotas, the
  /// reclaim timeout and which requests are packed (pack_up_to, lowered to
  /// the block size as the constructor does). Open sessions stay open and
  /// keep what they hold, even above a lowered quota, and their packed blocks
  /// stay; the new values apply to the next open_session, allocate and
  /// create_buffer.
  void reconfigure(core_reload reload);

 private:
  core_state state_;  // first: the parts refer to it, and go before it
  pool_registry pools_;
  session_registry sessions_;
  lease_allocator leases_;
  buffer_registry buffers_;
  stable_registry stables_;
};

}  // namespace rmmd::core
