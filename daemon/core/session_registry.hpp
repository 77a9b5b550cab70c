#pragma once

// The sessions: who may open one, their tokens (the bearer credential on
// the gRPC socket), how many are open per tenant (a tenant's first session
// makes its backends, its last lets them go), and the listings of sessions
// that stats, rmmctl and /metrics show. A session's end, which releases its
// leases and buffers too, is daemon_core::close_session's.
//
// Owns: the next session id, the token -> session map and each tenant's
// count of open sessions. The sessions themselves are core_state's (every
// part charges and reads them).
//
// Lock discipline: every public member takes the core's mutex itself;
// open_session() lets go of it while a tenant's first session has its
// backends made (pool_registry::make_tenant_backends). The private members
// are daemon_core's, called with the mutex held.

#include "daemon/core/core_state.hpp"
#include "daemon/core/grants.hpp"
#include "daemon/core/pool_registry.hpp"
#include "daemon/core/types.hpp"

#include <absl/status/statusor.h>

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rmmd::core {

class session_registry {
 public:
  session_registry(core_state& state, pool_registry& pools) : state_(state), pools_(pools) {}
  session_registry(session_registry const&)            = delete;
  session_registry& operator=(session_registry const&) = delete;

  /// PERMISSION_DENIED if the policy does not allow `peer`; UNAVAILABLE while
  /// draining. A session whose origin says it reconnects counts in
  /// pool_registry::stats().restart.reconnected_sessions.
  absl::StatusOr<session_grant> open_session(peer_credentials peer,
                                             std::string command,
                                             session_origin origin);
  absl::StatusOr<session_grant> open_session(peer_credentials peer,
                                             std::string command,
                                             std::string client_name)
  {
    return open_session(
        std::move(peer), std::move(command), session_origin{.client_name = std::move(client_name)});
  }

  /// The session a token (lowercase hex, as sent in metadata) belongs to, or
  /// UNAUTHENTICATED.
  [[nodiscard]] absl::StatusOr<session_id> authenticate(std::string_view token_hex) const;

  /// Every session, by id.
  [[nodiscard]] std::vector<session_info> list() const;
  /// At most `n` sessions: those holding the most bytes first, then the most
  /// allocations, then the oldest (lowest id), so that the same sessions show
  /// from one call to the next; and what the others hold together. A
  /// thousand sessions take a fraction of a millisecond under the lock.
  [[nodiscard]] session_listing top_sessions(std::size_t n) const;
  [[nodiscard]] std::size_t session_count() const;

  /// Who is on the other end of `session` (for the peering layer's
  /// ledger); UNAUTHENTICATED when it is gone.
  [[nodiscard]] absl::StatusOr<peer_credentials> session_peer(session_id session) const;

 private:
  friend class daemon_core;

  /// Forgets session `s` (its token, its entry, its count in its tenant),
  /// whose leases and buffers are released already. Returns whether it was
  /// its tenant's last session. REQUIRES: the core's mutex held.
  bool forget_locked(session_id id) noexcept;

  core_state& state_;
  pool_registry& pools_;
  session_id next_session_{1};
  std::unordered_map<std::string, session_id> by_token_;  // key: hex token
  std::map<tenant_key, std::size_t> tenant_sessions_;     // open sessions per tenant
};

}  // namespace rmmd::core
