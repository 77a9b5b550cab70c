#include "daemon/core/core_state.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <sys/random.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace rmmd::core {

std::string bytes_text(std::size_t bytes)
{
  return absl::StrFormat("%d bytes", bytes);
}

void random_bytes(std::span<std::byte> out)
{
  std::size_t got = 0;
  while (got < out.size()) {
    auto n = ::getrandom(out.data() + got, out.size() - got, 0);
    if (n < 0 && errno == EINTR) { continue; }
    if (n < 0) { throw std::runtime_error(absl::StrCat("getrandom: ", std::strerror(errno))); }
    got += static_cast<std::size_t>(n);
  }
}

core_state::core_state(core_options given)
    : options(std::move(given)),
      reclaim(options.reclaim_timeout),
      packed(mutex, options.pack_up_to, options.pack_block_size, options.pack_idle)
{
}

session_entry* core_state::find_session_locked(session_id id) const
{
  auto it = sessions.find(id);
  return it == sessions.end() ? nullptr : it->second.get();
}

absl::StatusOr<session_entry*> core_state::session_locked(session_id id,
                                                          std::string_view request) const
{
  if (auto* s = find_session_locked(id)) { return s; }
  return absl::UnauthenticatedError(absl::StrCat(absl::string_view(request.data(), request.size()),
                                                 ": the session is closed; open a new session"));
}

absl::StatusOr<checked_request> core_state::check_request_locked(std::string_view request,
                                                                 pool_id pool,
                                                                 std::size_t bytes,
                                                                 std::size_t alignment) const
{
  if (pool >= pools.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: unknown pool id %d; this daemon serves pool ids 0 to %d (see `rmmctl pools`)",
        request,
        pool,
        static_cast<long long>(pools.size()) - 1));
  }
  auto& p = *pools[pool];
  if (bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s in pool '%s': size 0 is not allowed; ask for at least 1 byte", request, p.config.name));
  }
  if (bytes > p.capacity) {
    // RMM's resources raise out_of_memory for a request no memory could
    // hold, so rmm::out_of_memory it is (RESOURCE_EXHAUSTED).
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s of %s in pool '%s': larger than the pool's capacity of %s; no request this large can "
        "succeed here",
        request,
        bytes_text(bytes),
        p.config.name,
        bytes_text(p.capacity)));
  }
  if (alignment == 0) { alignment = default_alignment; }
  if (!std::has_single_bit(alignment) || alignment > p.config.max_alignment) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s of %s in pool '%s': alignment %d is not a power of two between 1 and %d",
        request,
        bytes_text(bytes),
        p.config.name,
        alignment,
        p.config.max_alignment));
  }
  return checked_request{.pool = pools[pool].get(), .alignment = alignment};
}

void core_state::charge_locked(pool_entry& p,
                               session_entry* s,
                               uid_t uid,
                               tenant_key const& tenant,
                               pool_id pool,
                               std::size_t bytes,
                               int sign) noexcept
{
  auto apply = [&](std::size_t& counter) {
    counter = sign > 0 ? counter + bytes : counter - bytes;
  };
  p.count(tenant, bytes, sign);
  if (s != nullptr) {
    apply(s->bytes);
    apply(s->pool_bytes[pool]);
  }
  auto u = uid_bytes.try_emplace(uid, 0).first;
  apply(u->second);
  if (u->second == 0) { uid_bytes.erase(u); }
  if (sign < 0) { reclaim.room_changed(); }
}

void core_state::uncharge_uid_locked(uid_t uid, std::size_t bytes) noexcept
{
  auto u = uid_bytes.find(uid);
  if (u == uid_bytes.end()) { return; }
  u->second -= bytes;
  if (u->second == 0) { uid_bytes.erase(u); }
}

std::optional<absl::Status> core_state::quota_refusal_locked(session_entry const& s,
                                                             std::size_t charge,
                                                             request_text const& what) const
{
  auto const session_limit = options.quotas.per_session_bytes;
  auto const session_used  = s.bytes + s.shared_bytes;
  if (session_limit != 0 && charge > session_limit - std::min(session_limit, session_used)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: session %d holds %s of its quota of %s; free memory first or ask the operator for "
        "a larger per-session quota",
        what.str(),
        s.id,
        bytes_text(session_used),
        bytes_text(session_limit)));
  }
  auto const uid_limit = options.quotas.limit_for_uid(s.peer.uid);
  auto const uid_it    = uid_bytes.find(s.peer.uid);
  auto const uid_used  = uid_it == uid_bytes.end() ? std::size_t{0} : uid_it->second;
  if (uid_limit != 0 && charge > uid_limit - std::min(uid_limit, uid_used)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: uid %d holds %s of its quota of %s across its sessions and shared buffers; free "
        "memory first or ask the operator for a larger per-uid quota",
        what.str(),
        s.peer.uid,
        bytes_text(uid_used),
        bytes_text(uid_limit)));
  }
  return std::nullopt;
}

std::optional<absl::Status> core_state::refusal_locked(pool_entry& p,
                                                       session_entry const& s,
                                                       std::size_t charge,
                                                       request_text const& what)
{
  if (auto quota = quota_refusal_locked(s, charge, what)) { return quota; }
  if (charge > p.room()) {
    signal_pressure_locked(p);
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: the pool has %s of %s in use; retry later or use another pool",
                        what.str(),
                        bytes_text(p.in_use),
                        bytes_text(p.capacity)));
  }
  return std::nullopt;
}

void core_state::signal_pressure_locked(pool_entry& pool)
{
  pool.pressure_until = std::chrono::steady_clock::now() + pressure_window;
}

bool core_state::reclaim_could_serve_locked(pool_id pool,
                                            session_id requester,
                                            std::size_t charge) const
{
  return !draining && reclaim.could_serve(sessions, packed, *pools[pool], pool, requester, charge);
}

bool core_state::wait_for_reclaim_locked(std::unique_lock<std::mutex>& lock,
                                         pool_id pool,
                                         session_id requester,
                                         std::size_t charge,
                                         std::size_t ask_for)
{
  return reclaim.wait_for_room(
      lock,
      sessions,
      packed,
      *pools[pool],
      {.pool = pool, .requester = requester, .charge = charge, .ask_for = ask_for},
      draining);
}

}  // namespace rmmd::core
