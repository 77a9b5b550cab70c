// session_registry: opening, authenticating and listing sessions.

#include "daemon/core/session_registry.hpp"

#include "common/hex.hpp"
#include "daemon/core/core_entries.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <chrono>
#include <memory>
#include <optional>
#include <span>

namespace rmmd::core {
namespace {

session_token random_token()
{
  session_token token{};
  random_bytes(token);
  return token;
}

}  // namespace

absl::StatusOr<session_grant> session_registry::open_session(peer_credentials peer,
                                                             std::string command,
                                                             session_origin origin)
{
  auto const refusal = [&]() -> std::optional<absl::Status> {
    if (state_.draining || state_.sessions_closed) {
      return absl::UnavailableError(
          "open session: the daemon is draining for shutdown; retry once it has restarted");
    }
    if (!state_.options.access.allows(peer)) {
      return absl::PermissionDeniedError(
          absl::StrFormat("open session: uid %d gid %d (pid %d) is not allowed to use this "
                          "daemon; ask the operator to add the uid or one of its groups to the "
                          "allowed ids",
                          peer.uid,
                          peer.gid,
                          peer.pid));
    }
    return std::nullopt;
  };
  auto const tenant = state_.options.tenancy.tenant_of(peer);  // fixed: read without the lock
  std::unique_lock lock(state_.mutex);
  // A tenant's first session makes its backends (a CUDA pool each: about a
  // millisecond) without the lock; its last session's close may retire them
  // meanwhile, so check again once they are there.
  while (true) {
    if (auto refused = refusal()) { return *refused; }
    if (pools_.tenant_ready_locked(tenant)) { break; }
    lock.unlock();
    if (auto made = pools_.make_tenant_backends(tenant); !made.ok()) {
      return absl::Status(made.code(), absl::StrCat("open session: ", made.message()));
    }
    lock.lock();
  }
  auto token              = random_token();
  auto entry              = std::make_unique<session_entry>();
  entry->id               = next_session_++;
  entry->token_hex        = common::to_hex(std::span<std::byte const>(token));
  entry->peer             = std::move(peer);
  entry->tenant           = tenant;
  entry->command          = std::move(command);
  entry->client_name      = std::move(origin.client_name);
  entry->reconnects       = origin.reconnects;
  entry->previous_session = origin.reconnects > 0 ? origin.previous_session : session_id{};
  entry->started          = std::chrono::system_clock::now();
  if (origin.reconnects > 0) { ++state_.restart.reconnected_sessions; }
  auto const id = entry->id;
  by_token_.emplace(entry->token_hex, id);
  state_.sessions.emplace(id, std::move(entry));
  ++tenant_sessions_[tenant];
  return session_grant{.id = id, .token = token};
}

absl::StatusOr<session_id> session_registry::authenticate(std::string_view token_hex) const
{
  std::lock_guard lock(state_.mutex);
  if (token_hex.empty()) {
    return absl::UnauthenticatedError(
        "no session token in the call's `rmmd-token` metadata; open a session on the session "
        "socket first");
  }
  auto it = by_token_.find(std::string(token_hex));
  if (it == by_token_.end()) {
    return absl::UnauthenticatedError(
        "unknown session token: the session is closed or the token is wrong; open a new session");
  }
  return it->second;
}

std::vector<session_info> session_registry::list() const
{
  std::lock_guard lock(state_.mutex);
  std::vector<session_info> out;
  out.reserve(state_.sessions.size());
  for (auto const& [id, s] : state_.sessions) {
    out.push_back(core_stats::info(*s, state_.packed));
  }
  return out;
}

session_listing session_registry::top_sessions(std::size_t n) const
{
  std::lock_guard lock(state_.mutex);
  return core_stats::top(state_.sessions, state_.packed, n);
}

std::size_t session_registry::session_count() const
{
  std::lock_guard lock(state_.mutex);
  return state_.sessions.size();
}

absl::StatusOr<peer_credentials> session_registry::session_peer(session_id session) const
{
  std::lock_guard lock(state_.mutex);
  auto found = state_.session_locked(session, "peer of session");
  if (!found.ok()) { return found.status(); }
  return (*found)->peer;
}

bool session_registry::forget_locked(session_id id) noexcept
{
  auto it = state_.sessions.find(id);
  if (it == state_.sessions.end()) { return false; }
  auto const tenant = it->second->tenant;
  by_token_.erase(it->second->token_hex);
  state_.sessions.erase(it);
  auto t = tenant_sessions_.find(tenant);
  if (t == tenant_sessions_.end() || --t->second != 0) { return false; }
  tenant_sessions_.erase(t);
  return true;
}

}  // namespace rmmd::core
