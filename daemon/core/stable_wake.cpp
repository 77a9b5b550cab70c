// stable_registry: wake (and its wait for room), a session's end, and the
// listings.

#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/core/stable_registry.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>

namespace rmmd::core {
namespace {

/// How long a wake whose backend found the device full waits before it asks
/// again (memory freed outside the daemon tells it nothing).
constexpr auto backend_retry = std::chrono::milliseconds(20);

}  // namespace

std::string stable_registry::holders_text_locked(pool_id pool) const
{
  std::map<uid_t, std::size_t> by_uid;
  for (auto const& [id, s] : state_.sessions) {
    if (auto held = s->held_in(pool); held > 0) { by_uid[s->peer.uid] += held; }
  }
  for (auto const& [id, b] : state_.buffers) {
    if (b->pool == pool) { by_uid[b->creator_uid] += b->charge; }
  }
  std::vector<std::pair<std::size_t, uid_t>> sorted;
  for (auto const& [uid, bytes] : by_uid) { sorted.emplace_back(bytes, uid); }
  std::sort(sorted.rbegin(), sorted.rend());
  std::vector<std::string> parts;
  for (auto const& [bytes, uid] : sorted) {
    parts.push_back(absl::StrFormat("uid %d holds %s", uid, bytes_text(bytes)));
  }
  return parts.empty() ? std::string(
                             "no session holds any of it (the driver's own or another "
                             "process's memory fills the device)")
                       : absl::StrJoin(parts, ", ");
}

std::optional<absl::Status> stable_registry::room_for_wake_locked(
    std::unique_lock<std::mutex>& lock,
    session_id session,
    pool_id pool,
    std::size_t charge,
    std::chrono::steady_clock::time_point deadline,
    std::string const& what)
{
  bool counted = false;
  for (;;) {
    auto found = state_.session_locked(session, what);
    if (!found.ok()) { return found.status(); }
    auto& p = *state_.pools[pool];
    if (auto quota = state_.quota_refusal_locked(**found, charge, what)) { return quota; }
    if (charge <= p.room()) { return std::nullopt; }
    core_state::signal_pressure_locked(p);
    if (state_.draining || std::chrono::steady_clock::now() >= deadline) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: the pool '%s' has %s of %s in use (%s); the wake waited until its deadline and "
          "mapped nothing; free memory or sleep other tags there, or wake with a longer deadline",
          what,
          p.config.name,
          bytes_text(p.in_use),
          bytes_text(p.capacity),
          holders_text_locked(pool)));
    }
    if (!counted) {
      ++state_.wake_waits;
      counted = true;
    }
    if (state_.reclaim_could_serve_locked(pool, session, charge)) {
      state_.wait_for_reclaim_locked(lock, pool, session, charge);
    } else {
      state_.reclaim.wait_for_change(lock, deadline);
    }
  }
}

absl::StatusOr<std::vector<stable_grant>> stable_registry::wake(
    session_id session,
    std::span<std::string const> tags,
    std::span<stable_id const> ids,
    std::chrono::steady_clock::time_point deadline,
    std::size_t max_pieces)
{
  std::unique_lock lock(state_.mutex);
  auto const request = ids.empty()
                           ? absl::StrFormat("wake of %s",
                                             tags.empty() ? std::string("every tag")
                                                          : "tags " + absl::StrJoin(tags, ", "))
                           : absl::StrCat("wake of ", ids.size(), " allocations");
  for (auto const& tag : tags) {
    if (auto problem = stable_tag_problem(tag)) {
      return absl::InvalidArgumentError(absl::StrCat(request, ": ", *problem));
    }
  }
  if (state_.draining) {
    return absl::UnavailableError(absl::StrCat(request, ": the daemon is draining for shutdown"));
  }
  auto found = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  std::vector<stable_id> chosen;
  for (auto id : ids) {
    auto e = owned_locked(session, id, request);
    if (!e.ok()) { return e.status(); }
    if ((*e)->state != stable_state::asleep) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: allocation %d is not asleep; wake only what sleeps", request, id));
    }
    chosen.push_back(id);
  }
  if (ids.empty()) {
    for (auto const& [id, e] : state_.stables) {
      if (e->session == session && e->state == stable_state::asleep &&
          (tags.empty() || std::find(tags.begin(), tags.end(), e->tag) != tags.end())) {
        chosen.push_back(id);
      }
    }
  }
  if (chosen.empty()) { return std::vector<stable_grant>{}; }
  std::map<pool_id, std::size_t> charges;
  for (auto id : chosen) { charges[state_.stables.at(id)->pool] += state_.stables.at(id)->bytes; }
  // Room in every pool; waiting for one may let another fill: ask until all
  // have it at once, with the lock held.
  for (bool settled = false; !settled;) {
    settled = true;
    for (auto const& [pool, charge] : charges) {
      auto const what = absl::StrFormat(
          "%s (%s in pool '%s')", request, bytes_text(charge), state_.pools[pool]->config.name);
      if (charge <= state_.pools[pool]->room()) { continue; }
      settled = false;
      if (auto refused = room_for_wake_locked(lock, session, pool, charge, deadline, what)) {
        if (refused->code() == absl::StatusCode::kResourceExhausted) { ++state_.wake_failures; }
        return *std::move(refused);
      }
    }
  }
  // What the waits let go of may have changed: every id must still sleep.
  auto* s = state_.find_session_locked(session);
  if (s == nullptr) { return state_.session_locked(session, request).status(); }
  for (auto id : chosen) {
    auto it = state_.stables.find(id);
    if (it == state_.stables.end() || it->second->session != session ||
        it->second->state != stable_state::asleep) {
      return absl::AbortedError(absl::StrFormat(
          "%s: allocation %d was freed or woken by another call meanwhile; try again",
          request,
          id));
    }
  }
  if (auto quota = state_.quota_refusal_locked(
          *s,
          [&] {
            std::size_t all = 0;
            for (auto const& [pool, charge] : charges) { all += charge; }
            return all;
          }(),
          request)) {
    return *std::move(quota);
  }
  for (auto id : chosen) {
    auto& e = *state_.stables.at(id);
    state_.charge_locked(*state_.pools[e.pool], s, e.uid, e.tenant, e.pool, e.bytes, +1);
    e.state = stable_state::waking;
  }
  if (auto made = allocate_for_wake(lock, session, chosen, deadline, max_pieces); !made.ok()) {
    if (made.code() == absl::StatusCode::kResourceExhausted) { ++state_.wake_failures; }
    return absl::Status(made.code(), absl::StrCat(request, ": ", made.message()));
  }
  std::vector<stable_grant> grants;
  for (auto id : chosen) { grants.push_back(grant_of(*state_.stables.at(id))); }
  return grants;
}

absl::Status stable_registry::allocate_for_wake(std::unique_lock<std::mutex>& lock,
                                                session_id session,
                                                std::vector<stable_id> const& ids,
                                                std::chrono::steady_clock::time_point deadline,
                                                std::size_t max_pieces)
{
  struct job {
    stable_id id{};
    uid_t owner{};
    std::size_t bytes{};
    std::shared_ptr<pool_backend> backend;
    std::vector<std::shared_ptr<pool_backend>> others;
    std::optional<stable_memory> made;
  };
  std::vector<job> jobs;
  for (auto id : ids) {
    auto const& e = *state_.stables.at(id);
    auto& p       = *state_.pools[e.pool];
    jobs.push_back({.id      = id,
                    .owner   = e.uid,
                    .bytes   = e.bytes,
                    .backend = p.tenants.find(e.tenant)->backend,
                    .others  = p.tenants.others(e.tenant),
                    .made    = std::nullopt});
  }
  absl::Status failed;
  for (auto& j : jobs) {
    for (;;) {
      lock.unlock();
      auto memory = after_trimming_others(j.others, state_.trim_mutex, [&] {
        return j.backend->allocate_stable(j.bytes, {.owner = j.owner, .max_pieces = max_pieces});
      });
      lock.lock();
      if (memory.ok()) {
        j.made = *std::move(memory);
        break;
      }
      auto const now = std::chrono::steady_clock::now();
      if (memory.status().code() != absl::StatusCode::kResourceExhausted || now >= deadline ||
          state_.draining) {
        failed = memory.status();
        break;
      }
      state_.reclaim.wait_for_change(lock, std::min(deadline, now + backend_retry));
    }
    if (!failed.ok()) { break; }
  }
  // The session may have ended meanwhile: its end uncharged what it charged
  // and left these entries asleep (kept) or gone.
  auto* s   = state_.find_session_locked(session);
  auto ours = [&](stable_id id) -> stable_entry* {
    auto it         = state_.stables.find(id);
    bool const mine = it != state_.stables.end() && it->second->session == session &&
                      it->second->state == stable_state::waking && s != nullptr;
    return mine ? it->second.get() : nullptr;
  };
  if (failed.ok() && s == nullptr) {
    failed = absl::UnauthenticatedError("the session closed during the call; open a new session");
  }
  for (auto& j : jobs) {
    auto* e = ours(j.id);
    if (failed.ok() && e != nullptr) {
      e->memory = *std::move(j.made);
      e->state  = stable_state::awake;
      state_.stats.grew(e->pool, state_.pools[e->pool]->in_use);
      continue;
    }
    if (j.made) { j.backend->deallocate_stable(*j.made, j.owner, stable_return::reusable); }
    if (e != nullptr) {
      state_.charge_locked(*state_.pools[e->pool], s, e->uid, e->tenant, e->pool, e->bytes, -1);
      e->state = stable_state::asleep;
    }
  }
  if (!failed.ok() && failed.code() == absl::StatusCode::kResourceExhausted && s != nullptr) {
    auto const pool = state_.stables.count(jobs.front().id) != 0
                          ? state_.stables.at(jobs.front().id)->pool
                          : pool_id{};
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s; the device stayed full until the deadline (%s in pool '%s'), and "
                        "nothing was mapped",
                        failed.message(),
                        holders_text_locked(pool),
                        state_.pools[pool]->config.name));
  }
  return failed;
}

void stable_registry::release_session_locked(session_entry& s) noexcept
{
  std::vector<stable_entry*> mine;
  for (auto const& [id, e] : state_.stables) {
    if (e->session == s.id) { mine.push_back(e.get()); }
  }
  for (auto* e : mine) {
    if (e->state == stable_state::waking) {
      // Its wake is making memory without the lock: it frees what it made.
      state_.charge_locked(*state_.pools[e->pool], &s, e->uid, e->tenant, e->pool, e->bytes, -1);
      e->state = stable_state::asleep;
    }
    if (e->state == stable_state::asleep && e->backup && !e->backup_name.empty()) {
      e->session = 0;  // kept: its backup stays charged to the uid and the host pool
      continue;
    }
    erase_locked(*e, &s);
  }
}

void stable_registry::free_all() noexcept
{
  std::lock_guard lock(state_.mutex);
  for (auto const& [id, e] : state_.stables) {
    if (e->state == stable_state::awake || e->state == stable_state::going_to_sleep) {
      state_.pools[e->pool]->tenants.backend(e->tenant).deallocate_stable(
          e->memory, e->uid, stable_return::to_driver);
    }
    if (e->backup && e->backup->release) {
      e->backup->release(e->backup->memory);
    } else if (e->backup) {
      state_.pools[e->backup->pool]
          ->tenants.backend(e->backup->tenant)
          .deallocate_shared(e->backup->memory);
    }
  }
  state_.stables.clear();
}

std::vector<sleeper_info> stable_registry::sleepers() const
{
  std::lock_guard lock(state_.mutex);
  std::map<std::tuple<session_id, uid_t, std::string>, sleeper_info> groups;
  std::map<session_id, std::size_t> awake;
  std::map<std::tuple<session_id, uid_t, std::string>, std::set<std::string>> tags;
  for (auto const& [id, e] : state_.stables) {
    if (e->state != stable_state::asleep) {
      awake[e->session] += e->bytes;
      continue;
    }
    auto key = std::make_tuple(e->session, e->uid, e->backup_name);
    auto& g  = groups[key];
    if (g.sleeping_allocations == 0 || e->asleep_since < g.asleep_since) {
      g.asleep_since = e->asleep_since;
    }
    g.session     = e->session;
    g.uid         = e->uid;
    g.pid         = e->pid;
    g.command     = e->command;
    g.backup_name = e->backup_name;
    ++g.sleeping_allocations;
    g.sleeping_bytes += e->bytes;
    if (e->backup) { g.backup_bytes += e->backup->memory.block.bytes; }
    tags[key].insert(e->tag);
  }
  std::vector<sleeper_info> out;
  for (auto& [key, g] : groups) {
    g.tags.assign(tags[key].begin(), tags[key].end());
    if (g.session != 0) { g.awake_bytes = awake[g.session]; }
    out.push_back(std::move(g));
  }
  return out;
}

stable_totals stable_registry::totals() const
{
  std::lock_guard lock(state_.mutex);
  stable_totals t{.wake_waits = state_.wake_waits, .wake_failures = state_.wake_failures};
  std::set<std::pair<uid_t, std::string>> kept;
  for (auto const& [id, e] : state_.stables) {
    if (e->state == stable_state::asleep) {
      t.sleeping_bytes += e->bytes;
      ++t.sleeping_allocations;
    } else {
      t.awake_bytes += e->bytes;
    }
    if (e->backup) { t.backup_bytes += e->backup->memory.block.bytes; }
    if (e->session == 0) { kept.emplace(e->uid, e->backup_name); }
  }
  t.kept_backup_names = kept.size();
  return t;
}

std::vector<stable_grant> stable_registry::held_by(session_id session) const
{
  std::lock_guard lock(state_.mutex);
  std::vector<stable_grant> out;
  for (auto const& [id, e] : state_.stables) {
    if (e->session == session) { out.push_back(grant_of(*e)); }
  }
  return out;
}

}  // namespace rmmd::core
