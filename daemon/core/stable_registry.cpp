// stable_registry: address-stable allocations, their sleep and wake, and
// the backups kept after their session ended.

#include "daemon/core/stable_registry.hpp"

#include "common/buffer_name.hpp"
#include "daemon/core/buffer_manifest_checks.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace rmmd::core {
namespace {

/// Backups are mapped by the client in pages.
constexpr std::size_t backup_alignment = 4096;

bool tag_selected(std::span<std::string const> tags, std::string const& tag)
{
  return tags.empty() || std::find(tags.begin(), tags.end(), tag) != tags.end();
}

std::optional<absl::Status> tags_problem(std::span<std::string const> tags,
                                         std::string const& request)
{
  for (auto const& tag : tags) {
    if (auto problem = stable_tag_problem(tag)) {
      return absl::InvalidArgumentError(absl::StrCat(request, ": ", *problem));
    }
  }
  return std::nullopt;
}

std::string ids_text(std::span<stable_id const> ids)
{
  return ids.size() == 1 ? absl::StrCat("allocation ", ids.front())
                         : absl::StrCat(ids.size(), " allocations");
}

}  // namespace

std::optional<std::string> stable_tag_problem(std::string_view tag)
{
  if (tag.empty()) { return "the tag is empty; give every allocation a tag (\"default\")"; }
  if (tag.size() > max_stable_tag) {
    return absl::StrFormat("the tag %s is %d bytes long; at most %d are allowed",
                           quoted_for_message(tag),
                           tag.size(),
                           max_stable_tag);
  }
  for (char c : tag) {
    if (c < 0x20 || c > 0x7e) {
      return absl::StrFormat("the tag %s has a character that is not printable ASCII",
                             quoted_for_message(tag));
    }
  }
  return std::nullopt;
}

std::vector<std::size_t> stable_registry::pieces_of(stable_entry const& e)
{
  std::vector<std::size_t> out;
  if (e.memory.pieces.size() > 1) {
    for (auto const& piece : e.memory.pieces) { out.push_back(piece.block.bytes); }
  }
  return out;
}

stable_grant stable_registry::grant_of(stable_entry const& e)
{
  return stable_grant{.id            = e.id,
                      .pool          = e.pool,
                      .tag           = e.tag,
                      .size          = e.size,
                      .bytes         = e.bytes,
                      .awake         = e.state == stable_state::awake,
                      .has_backup    = e.backup.has_value(),
                      .backup_serial = e.backup ? e.backup->serial : 0,
                      .pieces        = pieces_of(e)};
}

absl::StatusOr<std::vector<stable_entry*>> stable_registry::awake_owned_locked(
    session_id session,
    std::span<stable_id const> ids,
    std::string const& request,
    std::string_view hint) const
{
  std::vector<stable_entry*> chosen;
  for (auto id : ids) {
    auto e = owned_locked(session, id, request);
    if (!e.ok()) { return e.status(); }
    if ((*e)->state != stable_state::awake) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: allocation %d is not awake; %s", request, id, hint));
    }
    chosen.push_back(*e);
  }
  return chosen;
}

absl::StatusOr<stable_entry*> stable_registry::owned_locked(session_id session,
                                                            stable_id id,
                                                            std::string const& request) const
{
  auto it = state_.stables.find(id);
  if (it == state_.stables.end() || it->second->session != session) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: this session holds no address-stable allocation %d; use an id its allocation "
        "returned (a session sees only its own)",
        request,
        id));
  }
  return it->second.get();
}

absl::StatusOr<stable_grant> stable_registry::allocate(session_id session,
                                                       pool_id pool,
                                                       std::size_t bytes,
                                                       std::string_view tag,
                                                       std::size_t max_pieces)
{
  std::unique_lock lock(state_.mutex);
  auto const request =
      absl::StrFormat("address-stable allocation tagged %s", quoted_for_message(tag));
  if (auto problem = stable_tag_problem(tag)) {
    return absl::InvalidArgumentError(absl::StrCat(request, ": ", *problem));
  }
  if (state_.draining) {
    return absl::UnavailableError(
        absl::StrCat(request, ": the daemon is draining for shutdown; no new allocations"));
  }
  auto found = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto checked = state_.check_request_locked(request, pool, bytes, 0);
  if (!checked.ok()) { return checked.status(); }
  auto& s = **found;
  auto& p = *checked->pool;
  auto const what =
      absl::StrFormat("%s of %s in pool '%s'", request, bytes_text(bytes), p.config.name);
  if (!p.tenants.traits().stable_memory) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: pool '%s' cannot make address-stable memory (it needs a CUDA pool: an allocation of "
        "its own the client maps at addresses it keeps); use a CUDA pool",
        what,
        p.config.name));
  }
  if (auto refused = state_.refusal_locked(p, s, bytes, what)) { return *std::move(refused); }
  // Charge the request while the backend allocates without the lock.
  auto const uid    = s.peer.uid;
  auto const tenant = s.tenant;
  state_.charge_locked(p, &s, uid, tenant, pool, bytes, +1);
  auto backend      = p.tenants.find(tenant)->backend;
  auto const others = p.tenants.others(tenant);
  lock.unlock();
  auto memory = after_trimming_others(others, state_.trim_mutex, [&] {
    return backend->allocate_stable(bytes, {.owner = uid, .max_pieces = max_pieces});
  });
  lock.lock();
  auto* const owner = state_.find_session_locked(session);
  state_.charge_locked(p, owner, uid, tenant, pool, bytes, -1);
  if (!memory.ok()) {
    if (memory.status().code() == absl::StatusCode::kResourceExhausted) {
      core_state::signal_pressure_locked(p);
    }
    return absl::Status(memory.status().code(),
                        absl::StrCat(what, ": ", memory.status().message()));
  }
  if (owner == nullptr) {
    backend->deallocate_stable(*memory, uid, stable_return::reusable);  // never mapped
    return absl::UnauthenticatedError(
        absl::StrCat(request, ": the session closed during the call; open a new session"));
  }
  auto const reserved = memory->bytes();
  if (auto refused = state_.refusal_locked(p, *owner, reserved, what)) {
    backend->deallocate_stable(*memory, uid, stable_return::reusable);  // never mapped
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: rounded up to %s by the driver's granularity, it exceeds the pool "
                        "limit or a quota; ask for less",
                        what,
                        bytes_text(reserved)));
  }
  state_.charge_locked(p, owner, uid, tenant, pool, reserved, +1);
  state_.stats.grew(pool, p.in_use);
  auto entry     = std::make_unique<stable_entry>();
  entry->id      = next_id_++;
  entry->session = session;
  entry->uid     = uid;
  entry->gid     = owner->peer.gid;
  entry->pid     = owner->peer.pid;
  entry->command = owner->command;
  entry->tenant  = tenant;
  entry->pool    = pool;
  entry->tag     = std::string(tag);
  entry->size    = bytes;
  entry->bytes   = reserved;
  entry->memory  = *std::move(memory);
  auto grant     = grant_of(*entry);
  state_.stables.emplace(entry->id, std::move(entry));
  return grant;
}

absl::Status stable_registry::free(session_id session, stable_id id)
{
  std::unique_lock lock(state_.mutex);
  auto const forgets_before = forgets_;
  auto const request        = absl::StrFormat("free address-stable allocation %d", id);
  auto found                = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto e = owned_locked(session, id, request);
  if (!e.ok()) { return e.status(); }
  if ((*e)->state == stable_state::waking) {
    return absl::FailedPreconditionError(
        absl::StrCat(request, ": a wake of it is under way; free it once the wake answered"));
  }
  erase_locked(**e, *found, stable_return::reusable);  // the client unmapped it first
  settle_forgets(lock, forgets_before);
  return absl::OkStatus();
}

void stable_registry::release_memory_locked(stable_entry& e,
                                            session_entry* s,
                                            stable_return how) noexcept
{
  auto& p = *state_.pools[e.pool];
  p.tenants.backend(e.tenant).deallocate_stable(e.memory, e.uid, how);
  e.memory = {};
  state_.charge_locked(p, s, e.uid, e.tenant, e.pool, e.bytes, -1);
}

void stable_registry::drop_backup_locked(stable_entry& e, session_entry* s) noexcept
{
  if (!e.backup) { return; }
  auto& b          = *e.backup;
  auto& hp         = *state_.pools[b.pool];
  auto const bytes = b.memory.block.bytes;
  if (b.release) {
    // Adopted: its memory and its charge belong to no tenant's backend.
    b.release(b.memory);
    hp.in_use -= bytes;
    if (s != nullptr) {
      s->bytes -= bytes;
      s->pool_bytes[b.pool] -= bytes;
    }
    state_.uncharge_uid_locked(e.uid, bytes);
    state_.reclaim.room_changed();
  } else {
    hp.tenants.backend(b.tenant).deallocate_shared(b.memory);
    state_.charge_locked(hp, s, e.uid, b.tenant, b.pool, bytes, -1);
  }
  e.backup.reset();
  if (e.kept && keeper_) {
    keeper_->forget_backup(e.id);
    ++forgets_;
  }
  e.kept = false;
}

bool stable_registry::keep_backup_locked(stable_entry& e) noexcept
{
  if (!keeper_ || !e.backup || e.backup_name.empty() || e.backup->memory.fd < 0) { return false; }
  auto const& pool = state_.pools[e.pool]->config;
  try {
    keeper_->keep_backup(kept_backup{.id             = e.id,
                                     .uid            = e.uid,
                                     .gid            = e.gid,
                                     .pid            = e.pid,
                                     .command        = e.command,
                                     .backup_name    = e.backup_name,
                                     .tag            = e.tag,
                                     .size           = e.size,
                                     .bytes          = e.bytes,
                                     .pool_name      = pool.name,
                                     .gpu_uuid       = pool.gpu_uuid,
                                     .host_pool_name = state_.pools[e.backup->pool]->config.name,
                                     .fd             = e.backup->memory.fd,
                                     .backup_bytes   = e.backup->memory.block.bytes,
                                     .asleep_since   = e.asleep_since});
  } catch (...) {
    return false;  // out of memory: kept while this daemon lives, not after it
  }
  e.kept = true;
  return true;
}

void stable_registry::erase_locked(stable_entry& e, session_entry* s, stable_return how) noexcept
{
  if (e.state == stable_state::awake || e.state == stable_state::going_to_sleep) {
    release_memory_locked(e, s, how);
  }
  drop_backup_locked(e, s);
  state_.stables.erase(e.id);
}

absl::Status stable_registry::make_backups_locked(session_entry& s,
                                                  std::vector<stable_entry*> const& chosen,
                                                  std::string const& request)
{
  auto host = std::find_if(state_.pools.begin(), state_.pools.end(), [](auto const& p) {
    return p->tenants.traits().space == memory_space::host;
  });
  if (host == state_.pools.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        request,
        ": a host backup needs a host pool, and this daemon serves none; configure one (a "
        "`pool { backend: HOST ... }` in rmmd.conf) or sleep without a backup"));
  }
  auto& hp          = **host;
  auto const hp_id  = static_cast<pool_id>(host - state_.pools.begin());
  std::size_t total = 0;
  for (auto const* e : chosen) {
    if (!e->backup) {
      total += (e->bytes + backup_alignment - 1) / backup_alignment * backup_alignment;
    }
  }
  auto const what = absl::StrFormat(
      "%s: host backups of %s in pool '%s'", request, bytes_text(total), hp.config.name);
  if (auto refused = state_.refusal_locked(hp, s, total, what)) { return *std::move(refused); }
  auto& backend = hp.tenants.backend(s.tenant);
  std::vector<stable_entry*> made;
  for (auto* e : chosen) {
    if (e->backup) { continue; }
    auto memory = backend.allocate_shared(e->bytes, backup_alignment);
    if (!memory.ok()) {
      for (auto* m : made) { drop_backup_locked(*m, &s); }
      return absl::Status(memory.status().code(),
                          absl::StrCat(what, ": ", memory.status().message()));
    }
    state_.charge_locked(hp, &s, s.peer.uid, s.tenant, hp_id, memory->block.bytes, +1);
    e->backup = stable_backup{.serial  = next_backup_serial_++,
                              .pool    = hp_id,
                              .tenant  = s.tenant,
                              .memory  = *std::move(memory),
                              .release = {}};
    made.push_back(e);
  }
  state_.stats.grew(hp_id, hp.in_use);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<stable_grant>> stable_registry::begin_sleep(
    session_id session,
    std::span<std::string const> tags,
    bool backup,
    std::string_view name,
    std::span<stable_id const> ids)
{
  std::lock_guard lock(state_.mutex);
  auto const request = absl::StrFormat(
      "sleep of %s%s",
      tags.empty() ? std::string("every tag") : absl::StrCat("tags ", absl::StrJoin(tags, ", ")),
      backup ? " with a host backup" : "");
  if (auto problem = tags_problem(tags, request)) { return *std::move(problem); }
  auto found = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto& s = **found;
  if (!name.empty()) {
    if (!backup) {
      return absl::InvalidArgumentError(absl::StrCat(
          request, ": a backup name without a host backup keeps nothing; ask for backup=host"));
    }
    if (auto problem = names::buffer_name_problem(name)) {
      return absl::InvalidArgumentError(absl::StrCat(request, ": backup name: ", *problem));
    }
    for (auto const& [id, e] : state_.stables) {
      if (e->uid == s.peer.uid && e->backup_name == name && e->session != session) {
        return absl::AlreadyExistsError(absl::StrFormat(
            "%s: backups named %s are %s; restore or drop them first (rmmctl sleepers drop "
            "NAME), or choose another name",
            request,
            quoted_for_message(name),
            e->session == 0 ? "kept (from an ended session, or from before a restart of rmmd)"
                            : absl::StrFormat("held by session %d", e->session)));
      }
    }
  }
  auto awake = awake_owned_locked(session, ids, request, "sleep only what is awake");
  if (!awake.ok()) { return awake.status(); }
  auto chosen = *std::move(awake);
  for (auto const& [id, e] : state_.stables) {
    if (!ids.empty()) { break; }
    if (e->session != session || !tag_selected(tags, e->tag)) { continue; }
    if (e->state == stable_state::going_to_sleep || e->state == stable_state::waking) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: allocation %d (tag %s) is %s already; finish that call first",
                          request,
                          id,
                          quoted_for_message(e->tag),
                          e->state == stable_state::waking ? "waking" : "going to sleep"));
    }
    if (e->state == stable_state::awake) { chosen.push_back(e.get()); }
  }
  if (backup && !chosen.empty()) {
    if (auto made = make_backups_locked(s, chosen, request); !made.ok()) { return made; }
  }
  std::vector<stable_grant> grants;
  for (auto* e : chosen) {
    if (!backup) { drop_backup_locked(*e, &s); }  // one left from a wake not finished
    e->state       = stable_state::going_to_sleep;
    e->backup_name = std::string(name);
    grants.push_back(grant_of(*e));
  }
  return grants;
}

absl::StatusOr<std::size_t> stable_registry::finish_sleep(session_id session,
                                                          std::span<stable_id const> ids,
                                                          bool cancel)
{
  std::unique_lock lock(state_.mutex);
  auto const request =
      absl::StrFormat("%s of %s", cancel ? "cancel the sleep" : "finish the sleep", ids_text(ids));
  auto found = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  std::vector<stable_entry*> chosen;
  for (auto id : ids) {
    auto e = owned_locked(session, id, request);
    if (!e.ok()) { return e.status(); }
    auto const state = (*e)->state;
    bool const fits  = cancel
                           ? state == stable_state::going_to_sleep
                           : state == stable_state::going_to_sleep || state == stable_state::awake;
    if (!fits) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: allocation %d is %s; %s",
                          request,
                          id,
                          state == stable_state::asleep   ? "asleep already"
                          : state == stable_state::waking ? "waking"
                                                          : "awake and no sleep of it was begun",
                          cancel ? "cancel only a sleep begun" : "wake it first"));
    }
    chosen.push_back(*e);
  }
  std::size_t bytes = 0;
  bool kept         = false;
  for (auto* e : chosen) {
    if (cancel) {
      drop_backup_locked(*e, *found);
      e->state = stable_state::awake;
      continue;
    }
    release_memory_locked(*e, *found, stable_return::reusable);  // the client unmapped it first
    bytes += e->bytes;
    e->state        = stable_state::asleep;
    e->asleep_since = std::chrono::system_clock::now();
    kept            = keep_backup_locked(*e) || kept;
  }
  if (!kept) { return bytes; }
  // Answered once the named backups are kept for good: a client that heard
  // "asleep" and then sees the daemon SIGKILLed finds them after the restart.
  // (A keeper that takes longer says so in its log; the sleep stands.)
  auto const keeper = keeper_;
  lock.unlock();
  keeper->wait_until_kept(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  return bytes;
}

absl::StatusOr<std::size_t> stable_registry::finish_wake(session_id session,
                                                         std::span<stable_id const> ids,
                                                         bool keep_backups)
{
  std::unique_lock lock(state_.mutex);
  auto const forgets_before = forgets_;
  auto const request        = absl::StrCat("finish the wake of ", ids_text(ids));
  auto found                = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto awake = awake_owned_locked(session, ids, request, "wake it first");
  if (!awake.ok()) { return awake.status(); }
  auto chosen       = *std::move(awake);
  std::size_t bytes = 0;
  for (auto* e : chosen) {
    e->backup_name.clear();
    if (keep_backups && e->backup) {
      // Its contents are the last sleep's, stale once the client writes:
      // no longer a backup to restore after a crash, only room for the next.
      if (e->kept && keeper_) {
        keeper_->forget_backup(e->id);
        ++forgets_;
      }
      e->kept = false;
      continue;
    }
    if (e->backup) { bytes += e->backup->memory.block.bytes; }
    drop_backup_locked(*e, *found);
  }
  settle_forgets(lock, forgets_before);
  return bytes;
}

void stable_registry::settle_forgets(std::unique_lock<std::mutex>& lock,
                                     std::uint64_t forgets_before) noexcept
{
  if (forgets_ == forgets_before || !keeper_) { return; }
  auto const keeper = keeper_;
  lock.unlock();
  keeper->wait_until_kept(std::chrono::steady_clock::now() + std::chrono::seconds(10));
}

absl::StatusOr<std::vector<int>> stable_registry::fds(session_id session,
                                                      std::span<stable_id const> ids,
                                                      bool backup) const
{
  std::lock_guard lock(state_.mutex);
  auto const request = absl::StrFormat("fds of %s%s", ids_text(ids), backup ? "' backups" : "");
  auto found         = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  if (ids.empty() || ids.size() > max_stable_fds) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: ask for 1 to %d fds per call, not %d", request, max_stable_fds, ids.size()));
  }
  std::vector<int> fds;
  for (auto id : ids) {
    auto e = owned_locked(session, id, request);
    if (!e.ok()) { return e.status(); }
    auto const& entry = **e;
    bool const asleep = entry.state == stable_state::asleep || entry.state == stable_state::waking;
    if (backup ? !entry.backup : asleep) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: allocation %d %s",
                          request,
                          id,
                          backup ? "has no backup" : "has no memory now (asleep)"));
    }
    if (backup) {
      fds.push_back(entry.backup->memory.fd);
      continue;
    }
    for (auto const& piece : entry.memory.pieces) { fds.push_back(piece.fd); }
  }
  if (fds.size() > max_stable_fds) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: they have %d fds (pieces of memory); ask for at most %d per call",
                        request,
                        fds.size(),
                        max_stable_fds));
  }
  return fds;
}

}  // namespace rmmd::core
