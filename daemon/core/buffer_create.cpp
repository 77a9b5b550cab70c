// buffer_registry: creating a shared buffer (its name taken, its pool,
// tenant and quotas checked, memory from the creator's tenant's backend,
// waiting for idle memory to come back where the pool is short); the rest
// of a buffer's life is in buffer_registry.cpp.

#include "daemon/core/buffer_registry.hpp"

#include "common/buffer_name.hpp"
#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/core/core_entries.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <string>

namespace rmmd::core {

absl::StatusOr<buffer_grant> buffer_registry::create_buffer(session_id session,
                                                            std::string_view name,
                                                            pool_id pool,
                                                            std::size_t bytes,
                                                            buffer_options const& options,
                                                            reclaim_policy policy)
{
  auto const when_short =
      policy == reclaim_policy::refuse ? short_of_room::refuse : short_of_room::wait;
  // Never a hold: only create_buffer_or_hold() asks for one.
  return std::get<absl::StatusOr<buffer_grant>>(
      create_buffer_with(session, name, pool, bytes, options, when_short));
}

answer_or_hold<buffer_grant> buffer_registry::create_buffer_or_hold(session_id session,
                                                                    std::string_view name,
                                                                    pool_id pool,
                                                                    std::size_t bytes,
                                                                    buffer_options const& options)
{
  return create_buffer_with(session, name, pool, bytes, options, short_of_room::hold);
}

answer_or_hold<buffer_grant> buffer_registry::create_buffer_with(session_id session,
                                                                 std::string_view name,
                                                                 pool_id pool,
                                                                 std::size_t bytes,
                                                                 buffer_options const& options,
                                                                 short_of_room when_short)
{
  std::unique_lock lock(state_.mutex);
  auto const request = absl::StrFormat("create buffer %s", quoted_for_message(name));
  auto target        = check_create_locked(session, name, pool, bytes, options, request);
  if (!target.ok()) { return target.status(); }
  auto& s           = *target->session;
  auto& p           = *target->pool;
  auto const charge = std::max(bytes, p.tenants.backend(s.tenant).reserved_size(bytes));
  auto const what =
      absl::StrFormat("%s of %s in pool '%s'", request, bytes_text(bytes), p.config.name);
  if (auto refused = state_.refusal_locked(p, s, charge, what)) {
    return create_when_short(
        lock, *std::move(refused), s, name, pool, bytes, options, charge, what, when_short);
  }
  // Take the name and the bytes, then let the backend allocate without the
  // lock (a large CUDA allocation takes a while). Until it is done the buffer
  // is `creating`: its name is taken, nobody may open it, and a close of its
  // session leaves it to this call to clean up.
  auto& b = take_name_locked(s, name, pool, bytes, charge, options);
  return allocate_created(lock, b, s, p, target->alignment, what, request);
}

absl::StatusOr<buffer_registry::create_target> buffer_registry::check_create_locked(
    session_id session,
    std::string_view name,
    pool_id pool,
    std::size_t bytes,
    buffer_options const& options,
    std::string const& request) const
{
  if (auto problem = names::buffer_name_problem(name)) {
    return absl::InvalidArgumentError(absl::StrCat(request, ": ", *problem));
  }
  if (state_.draining) {
    return absl::UnavailableError(
        absl::StrCat(request, ": the daemon is draining for shutdown; no new buffers"));
  }
  auto found = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto checked = state_.check_request_locked(request, pool, bytes, options.alignment);
  if (!checked.ok()) { return checked.status(); }
  if (auto taken = state_.buffer_names.find(std::string(name));
      taken != state_.buffer_names.end()) {
    auto const& other = *state_.buffers.at(taken->second);
    if (!may_open_locked(other, (*found)->peer)) {
      // Names are one namespace per node, so the name's use cannot be
      // hidden; whose buffer it is, and which, can.
      return absl::AlreadyExistsError(absl::StrCat(
          request,
          ": the name is taken by a buffer this session may not see; choose another name"));
    }
    return absl::AlreadyExistsError(absl::StrFormat(
        "%s: the name is taken by buffer %d (%s, created by uid %d pid %d); open it, choose "
        "another name, or delete it first (rmmctl buffers delete NAME)",
        request,
        other.id,
        other.state == buffer_state::writing ? "not yet published" : "published",
        other.creator_uid,
        other.creator_pid));
  }
  return create_target{.session = *found, .pool = checked->pool, .alignment = checked->alignment};
}

answer_or_hold<buffer_grant> buffer_registry::create_when_short(std::unique_lock<std::mutex>& lock,
                                                                absl::Status refused,
                                                                session_entry const& s,
                                                                std::string_view name,
                                                                pool_id pool,
                                                                std::size_t bytes,
                                                                buffer_options const& options,
                                                                std::size_t charge,
                                                                std::string const& what,
                                                                short_of_room when_short)
{
  // As lease_allocator::allocate() does: short of room that other sessions'
  // idle slabs would make, it asks them and waits, then starts over.
  auto const session = s.id;
  if (when_short == short_of_room::refuse || state_.quota_refusal_locked(s, charge, what) ||
      !state_.reclaim_could_serve_locked(pool, session, charge)) {
    return refused;
  }
  if (when_short == short_of_room::hold) { return reclaim_hold{}; }
  state_.stats.reclaim_waited(pool);
  state_.wait_for_reclaim_locked(lock, pool, session, charge);
  lock.unlock();
  auto created = create_buffer(session, name, pool, bytes, options, reclaim_policy::refuse);
  lock.lock();
  state_.stats.reclaim_ended(pool, created.ok());
  return created;
}

absl::StatusOr<buffer_grant> buffer_registry::allocate_created(std::unique_lock<std::mutex>& lock,
                                                               buffer_entry& b,
                                                               session_entry& s,
                                                               pool_entry& p,
                                                               std::size_t alignment,
                                                               std::string const& what,
                                                               std::string const& request)
{
  // `b` stays while it is `creating` (nothing frees it then); `s` may close
  // while the lock is let go, so what is needed of it is taken now.
  auto const id      = b.id;
  auto const session = s.id;
  auto const uid     = s.peer.uid;
  auto const tenant  = s.tenant;
  auto const charge  = b.charge;
  auto const bytes   = b.size;
  auto backend       = p.tenants.find(tenant)->backend;  // kept alive while the lock is let go
  auto const others  = p.tenants.others(tenant);
  lock.unlock();
  auto block = after_trimming_others(
      others, state_.trim_mutex, [&] { return backend->allocate_shared(bytes, alignment); });
  lock.lock();

  // Take the estimate back; charge what the backend reserved, if it may stay.
  auto* const creator = state_.find_session_locked(session);
  p.count(tenant, charge, -1);
  state_.reclaim.room_changed();
  state_.uncharge_uid_locked(uid, charge);
  if (creator != nullptr) { creator->shared_bytes -= charge; }
  auto forget = [&] {
    if (auto n = state_.buffer_names.find(b.name);
        n != state_.buffer_names.end() && n->second == id) {
      state_.buffer_names.erase(n);
    }
    if (creator != nullptr) { creator->holds.erase(id); }
    if (auto* slot = p.tenants.find(tenant)) { --slot->buffers; }
    state_.buffers.erase(id);
  };
  if (!block.ok()) {
    forget();
    if (block.status().code() == absl::StatusCode::kResourceExhausted) {
      core_state::signal_pressure_locked(p);
    }
    return absl::Status(block.status().code(), absl::StrCat(what, ": ", block.status().message()));
  }
  if (creator == nullptr) {
    backend->deallocate_shared(*block);
    forget();
    return absl::UnauthenticatedError(
        absl::StrCat(request, ": the session closed during the call; open a new session"));
  }
  auto const reserved = block->block.bytes;
  if (state_.refusal_locked(p, *creator, reserved, what)) {
    backend->deallocate_shared(*block);
    forget();
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: rounded up to %s by the pool's alignment, it exceeds the pool limit or a quota; ask "
        "for less",
        what,
        bytes_text(reserved)));
  }
  b.block    = *std::move(block);
  b.charge   = reserved;
  b.creating = false;
  p.count(tenant, reserved, +1);
  state_.stats.grew(b.pool, p.in_use);
  state_.uid_bytes[uid] += reserved;
  creator->shared_bytes += reserved;
  // A delete may have taken the name meanwhile: the creator holds it all the same.
  return buffer_grant_locked(b, buffer_access::read_write);
}

buffer_entry& buffer_registry::take_name_locked(session_entry& s,
                                                std::string_view name,
                                                pool_id pool,
                                                std::size_t bytes,
                                                std::size_t charge,
                                                buffer_options const& options)
{
  auto entry           = std::make_unique<buffer_entry>();
  entry->id            = next_buffer_++;
  entry->name          = std::string(name);
  entry->pool          = pool;
  entry->size          = bytes;
  entry->charge        = charge;
  entry->persistent    = options.persistent;
  entry->gid           = options.gid;
  entry->allow_writers = options.allow_writers;
  if (auto const& uuid = state_.pools[pool]->config.gpu_uuid; !uuid.empty()) {
    entry->manifest = std::make_shared<buffer_manifest const>(
        buffer_manifest{.labels = {{std::string(gpu_uuid_label), uuid}}});
  }
  entry->tenant      = s.tenant;
  entry->creator     = s.id;
  entry->creator_uid = s.peer.uid;
  entry->creator_pid = s.peer.pid;
  entry->created     = std::chrono::system_clock::now();
  entry->holders.emplace(s.id, 1);
  entry->writers.emplace(s.id, 1);  // the creator writes it
  auto const id = entry->id;
  auto& b       = *entry;
  state_.buffers.emplace(id, std::move(entry));
  state_.buffer_names.emplace(b.name, id);
  s.holds.emplace(id, 1);
  s.shared_bytes += charge;
  auto& p = *state_.pools[pool];
  p.count(s.tenant, charge, +1);
  if (auto* slot = p.tenants.find(s.tenant)) { ++slot->buffers; }
  state_.uid_bytes[s.peer.uid] += charge;
  return b;
}

}  // namespace rmmd::core
