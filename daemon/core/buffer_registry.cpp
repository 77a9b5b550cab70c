// buffer_registry: publishing, opening, closing, deleting and listing
// shared buffers, a closing session's holds, and adoption after a restart.
// Creating one is in buffer_create.cpp, manifests in buffer_manifests.cpp,
// the write lease in buffer_leases.cpp, peering's holds in
// buffer_remote_holds.cpp.

#include "daemon/core/buffer_registry.hpp"

#include "common/buffer_name.hpp"
#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/core/core_entries.hpp"

#include <absl/strings/escaping.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <span>

namespace rmmd::core {
namespace {

/// Where this daemon's remote hold ids start: random, below 2^62 and not 0,
/// so ids of a daemon that started again do not repeat its last one's (a
/// peer's stale close must not end another hold), and every id stays below
/// 2^63 (remote_holder_key's bit).
remote_hold_id first_remote_hold_id()
{
  remote_hold_id n = 0;
  random_bytes(std::as_writable_bytes(std::span(&n, 1)));
  n &= (remote_hold_id{1} << 62) - 1;
  return n == 0 ? 1 : n;
}

}  // namespace

buffer_registry::buffer_registry(core_state& state)
    : state_(state), next_remote_hold_(first_remote_hold_id())
{
}

bool buffer_registry::may_open_locked(buffer_entry const& b, peer_credentials const& peer) const
{
  if (peer.uid == 0 || peer.uid == b.creator_uid) { return true; }
  if (!b.gid) { return false; }
  return peer.gid == *b.gid ||
         std::find(peer.supplementary_gids.begin(), peer.supplementary_gids.end(), *b.gid) !=
             peer.supplementary_gids.end();
}

std::optional<absl::Status> buffer_registry::cross_tenant_refusal_locked(
    buffer_entry const& b, session_entry const& s, std::string_view request) const
{
  if (b.creating || b.tenant == s.tenant) { return std::nullopt; }
  auto const& m      = b.block;
  bool const in_pool = m.fd < 0 && m.fabric_handle.empty() && m.driver_handle == 0;
  if (!in_pool) { return std::nullopt; }  // an allocation of its own: nothing else is in it
  return absl::PermissionDeniedError(absl::StrFormat(
      "%s: it is a pointer into the pool of %s (the daemon runs with "
      "--cuda-shared-buffer-memory=pool), which %s may not import: importing it would expose "
      "that tenant's other memory; run the daemon with --cuda-shared-buffer-memory=own (the "
      "default) to share buffers between tenants",
      std::string(request),
      b.tenant.text(),
      s.tenant.text()));
}

buffer_grant buffer_registry::buffer_grant_locked(buffer_entry const& b, buffer_access access) const
{
  return buffer_grant{.id         = b.id,
                      .pool       = b.pool,
                      .name       = b.name,
                      .size       = b.size,
                      .block      = b.block,
                      .state      = b.state,
                      .persistent = b.persistent,
                      .access     = access,
                      .manifest   = b.manifest};
}

buffer_info buffer_registry::buffer_info_locked(buffer_entry const& b) const
{
  return buffer_info{
      .id              = b.id,
      .name            = b.name,
      .pool            = b.pool,
      .pool_name       = state_.pools[b.pool]->config.name,
      .size            = b.size,
      .reserved_bytes  = b.charge,
      .creator_uid     = b.creator_uid,
      .creator_pid     = b.creator_pid,
      .creator_session = b.creator,
      .gid             = b.gid,
      .holders         = b.holders.size(),
      .state           = b.state,
      .persistent      = b.persistent,
      .created         = b.created,
      .allow_writers   = b.allow_writers,
      .labels          = b.manifest ? b.manifest->labels : std::map<std::string, std::string>{},
      .tensor_count    = b.manifest ? b.manifest->tensors.size() : 0,
      .lease           = lease_info_locked(b)};
}

absl::StatusOr<buffer_entry*> buffer_registry::writing_buffer_locked(session_id session,
                                                                     buffer_id id,
                                                                     std::string const& request,
                                                                     char const* what)
{
  auto found = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto it = state_.buffers.find(id);
  // A buffer the caller's uid may not open is answered as one that does not
  // exist.
  if (it == state_.buffers.end() || it->second->creating ||
      !may_open_locked(*it->second, (*found)->peer)) {
    return absl::NotFoundError(
        absl::StrCat(request, ": no such buffer (never created, or freed already)"));
  }
  auto& b          = *it->second;
  auto const named = absl::StrFormat("%s (%s)", request, quoted_for_message(b.name));
  if (b.creator != session) {
    return absl::FailedPreconditionError(
        absl::StrCat(named, ": only the session that created it may ", what));
  }
  if (b.state == buffer_state::published) {
    return absl::FailedPreconditionError(absl::StrCat(named, ": it is published already"));
  }
  if (b.state == buffer_state::deleted) {
    return absl::FailedPreconditionError(
        absl::StrCat(named, ": it was deleted before it was published; create it again"));
  }
  return &b;
}

absl::Status buffer_registry::publish_buffer(session_id session, buffer_id id)
{
  std::unique_lock lock(state_.mutex);
  auto found =
      writing_buffer_locked(session, id, absl::StrFormat("publish buffer %d", id), "publish it");
  if (!found.ok()) { return found.status(); }
  auto& b = **found;
  b.state = buffer_state::published;
  state_.buffers_changed.notify_all();
  if (!keeper_ || b.block.fd < 0) { return absl::OkStatus(); }
  keeper_->keep(kept_buffer{.info             = buffer_info_locked(b),
                            .manifest         = b.manifest,
                            .fd               = b.block.fd,
                            .host_memfd       = b.block.host_memfd,
                            .fabric_handle    = b.block.fabric_handle,
                            .allocation_bytes = b.block.block.bytes,
                            .gpu_uuid         = state_.pools[b.pool]->config.gpu_uuid});
  // Answered once it is kept for good: a client that heard "published" and
  // then sees the daemon SIGKILLed finds the buffer after the restart.
  // (A keeper that takes longer says so in its log; the buffer is served.)
  auto const keeper = keeper_;
  lock.unlock();
  keeper->wait_until_kept(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  return absl::OkStatus();
}

absl::StatusOr<buffer_grant> buffer_registry::open_buffer(
    session_id session,
    std::string_view name,
    std::chrono::steady_clock::time_point wait_until,
    buffer_open_options const& how)
{
  std::unique_lock lock(state_.mutex);
  auto const request = absl::StrFormat("open buffer %s", quoted_for_message(name));
  if (auto problem = names::buffer_name_problem(name)) {
    return absl::InvalidArgumentError(absl::StrCat(request, ": ", *problem));
  }
  if (how.exclusive && how.access != buffer_access::read_write) {
    return absl::InvalidArgumentError(absl::StrCat(
        request,
        ": an exclusive open takes the write lease, so it is a read-write open: ask for "
        "read-write access too"));
  }
  if (how.standby && !how.exclusive) {
    return absl::InvalidArgumentError(absl::StrCat(
        request,
        ": a standby stands in line for the write lease, so it is an exclusive open: ask for "
        "exclusive (and read-write access) too"));
  }
  auto const key = std::string(name);
  bool waited    = false;
  while (true) {
    auto found = state_.session_locked(session, request);
    if (!found.ok()) { return found.status(); }
    auto& s = **found;
    absl::Status waitable;  // the buffer is missing or unpublished: worth waiting for
    auto n = state_.buffer_names.find(key);
    // A buffer this uid may not open is answered, and waited for, as one that
    // does not exist: its name, creator and state stay hidden.
    if (n == state_.buffer_names.end() || !may_open_locked(*state_.buffers.at(n->second), s.peer)) {
      waitable = absl::NotFoundError(
          absl::StrCat(request,
                       ": no buffer has this name (see `rmmctl buffers`); its creator may not have "
                       "created it yet (open with a wait to wait for it)"));
    } else {
      auto& b = *state_.buffers.at(n->second);
      if (auto refused = cross_tenant_refusal_locked(b, s, request)) { return *refused; }
      if (b.state == buffer_state::published || (b.creator == session && !b.creating)) {
        if (auto refused = open_refusal_locked(b, session, how, request)) { return *refused; }
        if (how.exclusive) {
          return open_exclusive_locked(lock, b, s, wait_until, request, how.standby);
        }
        if (how.access == buffer_access::read_write) {
          if (auto refused = plain_writer_refusal_locked(b, session, request)) { return *refused; }
          ++b.writers[session];
        }
        ++b.holders[session];
        ++s.holds[b.id];
        return buffer_grant_locked(b, how.access);
      }
      waitable = absl::FailedPreconditionError(absl::StrCat(
          request,
          ": it is not published yet (its creator is still writing it); open it with a "
          "wait, or after its creator publishes it"));
    }
    if (std::chrono::steady_clock::now() >= wait_until) {
      if (waited) {
        return absl::Status(
            waitable.code(),
            absl::StrCat(request,
                         waitable.code() == absl::StatusCode::kNotFound
                             ? ": no buffer had this name by the end of the wait"
                             : ": it was still not published at the end of the wait",
                         " (see `rmmctl buffers`)"));
      }
      return waitable;
    }
    // No wait outlives the drain: the daemon is about to stop.
    if (state_.draining || state_.sessions_closed) {
      return absl::UnavailableError(
          absl::StrCat(request, ": the daemon is draining for shutdown; it stopped the wait"));
    }
    waited = true;
    ++waiting_opens_;
    state_.buffers_changed.wait_until(lock, wait_until);
    --waiting_opens_;
  }
}

absl::Status buffer_registry::close_buffer(session_id session, buffer_id id, hold_kind kind)
{
  auto const since = std::chrono::steady_clock::now();
  std::unique_lock lock(state_.mutex);
  auto const request = absl::StrFormat("close buffer %d", id);
  auto found         = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  if ((*found)->foreign_holds.erase(id) > 0) {
    auto notify = foreign_released_;
    lock.unlock();
    if (notify) { notify(id); }
    return absl::OkStatus();
  }
  auto it = state_.buffers.find(id);
  if (it == state_.buffers.end() || !(*found)->holds.contains(id) || it->second->creating) {
    return absl::NotFoundError(
        absl::StrCat(request, ": this session does not hold it (never opened, or closed already)"));
  }
  drop_hold_locked(*it->second, session, kind, since);
  return absl::OkStatus();
}

absl::StatusOr<int> buffer_registry::buffer_fd(session_id session, buffer_id id)
{
  std::lock_guard lock(state_.mutex);
  auto const request = absl::StrFormat("fd of buffer %d", id);
  auto found         = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto it = state_.buffers.find(id);
  if (it == state_.buffers.end() || !(*found)->holds.contains(id) || it->second->creating) {
    return absl::NotFoundError(
        absl::StrCat(request, ": this session does not hold it (never opened, or closed already)"));
  }
  auto& b = *it->second;
  if (b.block.fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(request,
                     ": it has no fd of its own (a pointer of a CUDA pool: the daemon runs "
                     "with --cuda-shared-buffer-memory=pool)"));
  }
  if (!b.block.host_memfd || may_write_locked(b, session)) { return b.block.fd; }
  // A reader of a host buffer gets the memfd read-only: its mapping cannot
  // be made writable (a VMM allocation's fd has no such access: the
  // importer's cuMemSetAccess decides, docs/sharing.md).
  if (b.read_only_fd.get() < 0) {
    auto const path = "/proc/self/fd/" + std::to_string(b.block.fd);
    b.read_only_fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (b.read_only_fd.get() < 0) {
      return absl::InternalError(
          absl::StrFormat("%s: opening its memfd again read-only (%s) failed: %s",
                          request,
                          path,
                          std::strerror(errno)));
    }
  }
  return b.read_only_fd.get();
}

absl::StatusOr<std::size_t> buffer_registry::delete_buffer(session_id session,
                                                           std::string_view name)
{
  std::unique_lock lock(state_.mutex);
  auto const request = absl::StrFormat("delete buffer %s", quoted_for_message(name));
  if (auto problem = names::buffer_name_problem(name)) {
    return absl::InvalidArgumentError(absl::StrCat(request, ": ", *problem));
  }
  auto found = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto const uid = (*found)->peer.uid;
  auto n         = state_.buffer_names.find(std::string(name));
  if (n == state_.buffer_names.end() ||
      !may_open_locked(*state_.buffers.at(n->second), (*found)->peer)) {
    return absl::NotFoundError(
        absl::StrCat(request, ": no buffer has this name (see `rmmctl buffers`)"));
  }
  auto& b = *state_.buffers.at(n->second);
  if (uid != 0 && uid != b.creator_uid) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s: uid %d may not delete it; only its creator's uid %d and root may (sudo rmmctl "
        "buffers delete NAME)",
        request,
        uid,
        b.creator_uid));
  }
  state_.buffer_names.erase(n);
  b.state = buffer_state::deleted;
  end_line_locked(b);  // the exclusive opens waiting for it answer NOT_FOUND
  if (keeper_) { keeper_->forget(b.id); }
  auto const holders = b.holders.size();
  free_buffer_if_unheld_locked(b.id);
  // Answered once it is out of the store and the state file, as a publish is
  // answered once it is in: a client that heard "deleted" and then sees the
  // daemon SIGKILLed does not find the buffer served again after the restart.
  if (auto const keeper = keeper_) {
    lock.unlock();
    keeper->wait_until_kept(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  }
  return holders;
}

bool buffer_registry::may_see_locked(buffer_entry const& b,
                                     session_id session,
                                     peer_credentials const& peer) const
{
  if (b.creating) { return false; }
  bool const all = peer.uid == 0 || peer.uid == state_.options.admin_uid;
  return all || b.creator == session ||
         (b.state != buffer_state::writing && may_open_locked(b, peer));
}

absl::StatusOr<std::vector<buffer_info>> buffer_registry::list_buffers(
    session_id session, buffer_filter const& filter) const
{
  std::lock_guard lock(state_.mutex);
  auto found = state_.session_locked(session, "list buffers");
  if (!found.ok()) { return found.status(); }
  auto const& peer = (*found)->peer;
  std::vector<buffer_info> out;
  for (auto const& [id, b] : state_.buffers) {
    if (may_see_locked(*b, session, peer) && filter_selects(filter, *b)) {
      out.push_back(buffer_info_locked(*b));
    }
  }
  return out;
}

std::size_t buffer_registry::waiting_opens() const
{
  std::lock_guard lock(state_.mutex);
  return waiting_opens_;
}

std::vector<buffer_info> buffer_registry::all() const
{
  std::lock_guard lock(state_.mutex);
  std::vector<buffer_info> out;
  for (auto const& [id, b] : state_.buffers) {
    if (!b->creating) { out.push_back(buffer_info_locked(*b)); }
  }
  return out;
}

void buffer_registry::drop_hold_locked(buffer_entry& b,
                                       session_id holder,
                                       hold_kind kind,
                                       std::chrono::steady_clock::time_point since) noexcept
{
  if (since == std::chrono::steady_clock::time_point{}) {
    since = std::chrono::steady_clock::now();
  }
  if (auto* s = state_.find_session_locked(holder)) {
    auto h = s->holds.find(b.id);
    if (h != s->holds.end() && --h->second == 0) { s->holds.erase(h); }
  }
  auto h = b.holders.find(holder);
  if (h == b.holders.end()) { return; }
  auto const remaining = --h->second;
  if (remaining == 0) { b.holders.erase(h); }
  // The lease goes to the next in line before anything may free the buffer:
  // the new holder keeps it.
  settle_lease_locked(b, holder, kind, remaining);
  grant_to_next_locked(b, since);
  if (remaining > 0) { return; }
  if (holder == b.creator) {
    // The creator's session no longer counts the bytes against its quota
    // (its uid still does, until the buffer is freed).
    if (auto* s = state_.find_session_locked(holder); s != nullptr && b.creator_charged) {
      s->shared_bytes -= b.charge;
    }
    b.creator_charged = false;
    // Never published: nobody else can hold it, and nothing is left of it.
    if (b.state != buffer_state::published) {
      if (auto n = state_.buffer_names.find(b.name);
          n != state_.buffer_names.end() && n->second == b.id) {
        state_.buffer_names.erase(n);
      }
      b.state = buffer_state::deleted;
    }
  }
  free_buffer_if_unheld_locked(b.id);
}

bool buffer_registry::free_buffer_if_unheld_locked(buffer_id id) noexcept
{
  auto it = state_.buffers.find(id);
  if (it == state_.buffers.end()) { return false; }
  auto& b = *it->second;
  if (b.creating || !b.holders.empty()) { return false; }
  if (b.persistent && b.state == buffer_state::published) { return false; }
  if (keeper_ && b.state == buffer_state::published) { keeper_->forget(b.id); }
  auto& p = *state_.pools[b.pool];
  if (b.release) {
    // Adopted: its memory and its charge belong to no tenant's backend.
    b.release(b.block);
    p.in_use -= b.charge;
  } else {
    p.tenants.backend(b.tenant).deallocate_shared(b.block);
    p.count(b.tenant, b.charge, -1);
    if (auto* slot = p.tenants.find(b.tenant)) { --slot->buffers; }
  }
  state_.reclaim.room_changed();
  if (auto u = state_.uid_bytes.find(b.creator_uid); u != state_.uid_bytes.end()) {
    u->second -= b.charge;
    if (u->second == 0) { state_.uid_bytes.erase(u); }
  }
  if (b.creator_charged) {
    if (auto* s = state_.find_session_locked(b.creator)) { s->shared_bytes -= b.charge; }
  }
  end_line_locked(b);
  if (auto n = state_.buffer_names.find(b.name);
      n != state_.buffer_names.end() && n->second == id) {
    state_.buffer_names.erase(n);
  }
  state_.buffers.erase(it);
  return true;
}

buffer_registry::foreign_release buffer_registry::release_all_locked(
    session_entry& s, std::chrono::steady_clock::time_point since) noexcept
{
  foreign_release foreign{.ids = {}, .notify = foreign_released_};
  foreign.ids.swap(s.foreign_holds);
  // Out of every line first: nothing is granted to a session that is ending.
  leave_all_lines_locked(s);
  // Each hold once for every open: drop_hold_locked erases as it goes.
  auto holds = s.holds;
  for (auto const& [id, count] : holds) {
    auto it = state_.buffers.find(id);
    if (it == state_.buffers.end()) { continue; }
    auto& b = *it->second;
    if (b.creating) { continue; }  // create_buffer cleans up when it finds the session gone
    for (std::size_t i = 0; i < count; ++i) {
      if (!state_.buffers.contains(id)) { break; }
      drop_hold_locked(b, s.id, hold_kind::read, since);
    }
  }
  state_.buffers_changed.notify_all();  // waiting opens of this session end
  return foreign;
}

void buffer_registry::foreign_release::tell() const
{
  if (!notify) { return; }
  for (auto id : ids) { notify(id); }
}

void buffer_registry::free_all() noexcept
{
  // Persistent buffers stay until deleted or the daemon stops: it stops.
  std::lock_guard lock(state_.mutex);
  for (auto& [id, b] : state_.buffers) {
    if (b->creating) { continue; }
    if (b->release) {
      b->release(b->block);
    } else {
      state_.pools[b->pool]->tenants.backend(b->tenant).deallocate_shared(b->block);
    }
  }
  state_.buffers.clear();
  state_.buffer_names.clear();
}

void buffer_registry::set_buffer_keeper(std::shared_ptr<buffer_keeper> keeper)
{
  std::lock_guard lock(state_.mutex);
  keeper_ = std::move(keeper);
}

absl::StatusOr<buffer_id> buffer_registry::adopt_buffer(adopted_buffer_spec spec)
{
  std::lock_guard lock(state_.mutex);
  auto const request = absl::StrFormat("adopt buffer %s", quoted_for_message(spec.name));
  if (auto problem = names::buffer_name_problem(spec.name)) {
    return absl::InvalidArgumentError(absl::StrCat(request, ": ", *problem));
  }
  if (spec.pool >= state_.pools.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: no pool %d", request, spec.pool));
  }
  auto const bytes = spec.memory.block.bytes;
  if (spec.size == 0 || spec.size > bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: its size %s does not fit its allocation of %s",
                        request,
                        bytes_text(spec.size),
                        bytes_text(bytes)));
  }
  if (state_.buffer_names.contains(spec.name)) {
    return absl::AlreadyExistsError(absl::StrCat(request, ": the name is taken"));
  }
  auto entry             = std::make_unique<buffer_entry>();
  entry->id              = next_buffer_++;
  entry->name            = std::move(spec.name);
  entry->pool            = spec.pool;
  entry->size            = spec.size;
  entry->charge          = bytes;
  entry->block           = std::move(spec.memory);
  entry->creating        = false;
  entry->state           = buffer_state::published;
  entry->persistent      = spec.persistent;
  entry->gid             = spec.gid;
  entry->tenant          = state_.options.tenancy.isolate
                               ? tenant_key{.of = tenant_key::kind::uid, .id = spec.creator_uid}
                               : tenant_key{};
  entry->creator_uid     = spec.creator_uid;
  entry->creator_pid     = spec.creator_pid;
  entry->creator_charged = false;  // no session of this daemon created it
  entry->created         = spec.created;
  entry->allow_writers   = spec.allow_writers;
  entry->manifest        = std::move(spec.manifest);
  entry->release         = std::move(spec.release);
  auto const id          = entry->id;
  auto& p                = *state_.pools[entry->pool];
  p.in_use += bytes;
  state_.stats.grew(entry->pool, p.in_use);
  state_.uid_bytes[entry->creator_uid] += bytes;
  state_.buffer_names.emplace(entry->name, id);
  state_.buffers.emplace(id, std::move(entry));
  return id;
}

}  // namespace rmmd::core
