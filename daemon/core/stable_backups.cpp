// stable_registry: backups kept under a name (after their session ended, or
// from the daemon before a restart): restoring and dropping them, and
// adopting at start what the last daemon kept.

#include "common/buffer_name.hpp"
#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/core/stable_registry.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <utility>
#include <vector>

namespace rmmd::core {

absl::StatusOr<std::vector<stable_grant>> stable_registry::restore(session_id session,
                                                                   std::string_view name)
{
  std::lock_guard lock(state_.mutex);
  auto const request = absl::StrCat("restore backups ", quoted_for_message(name));
  auto found         = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto& s = **found;
  std::vector<stable_entry*> kept;
  for (auto const& [id, e] : state_.stables) {
    if (e->uid != s.peer.uid || e->backup_name != name) { continue; }
    if (e->session != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s: session %d (pid %d) still sleeps under that name; its backups are kept for a "
          "new process only once it ends",
          request,
          e->session,
          e->pid));
    }
    kept.push_back(e.get());
  }
  if (kept.empty()) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: uid %d has no backups kept under that name (rmmctl sleepers lists them)",
        request,
        s.peer.uid));
  }
  std::vector<stable_grant> grants;
  for (auto* e : kept) {
    e->session = session;
    e->gid     = s.peer.gid;
    e->pid     = s.peer.pid;
    e->command = s.command;
    e->tenant  = s.tenant;  // its next memory comes from this session's backend
    if (e->backup) {        // the uid and the host pool hold its charge still
      s.bytes += e->backup->memory.block.bytes;
      s.pool_bytes[e->backup->pool] += e->backup->memory.block.bytes;
    }
    grants.push_back(grant_of(*e));
  }
  return grants;
}

absl::StatusOr<std::size_t> stable_registry::drop_backups(session_id session, std::string_view name)
{
  std::unique_lock lock(state_.mutex);
  auto const forgets_before = forgets_;
  auto const request        = absl::StrCat("drop backups ", quoted_for_message(name));
  auto found                = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto const uid = (*found)->peer.uid;
  std::vector<stable_entry*> kept;
  for (auto const& [id, e] : state_.stables) {
    if (e->session == 0 && e->backup_name == name && (uid == 0 || e->uid == uid)) {
      kept.push_back(e.get());
    }
  }
  if (kept.empty()) {
    return absl::NotFoundError(absl::StrFormat(
        "%s: no backups are kept under that name for uid %d (rmmctl sleepers lists them)",
        request,
        uid));
  }
  std::size_t bytes = 0;
  for (auto* e : kept) {
    if (e->backup) { bytes += e->backup->memory.block.bytes; }
    erase_locked(*e, nullptr);
  }
  settle_forgets(lock, forgets_before);
  return bytes;
}

void stable_registry::set_backup_keeper(std::shared_ptr<backup_keeper> keeper)
{
  std::lock_guard lock(state_.mutex);
  keeper_ = std::move(keeper);
}

absl::StatusOr<stable_id> stable_registry::adopt_backup(adopted_backup_spec spec)
{
  std::lock_guard lock(state_.mutex);
  auto const request =
      absl::StrFormat("adopt backup %s of uid %d", quoted_for_message(spec.backup_name), spec.uid);
  auto invalid = [&](std::string const& why) {
    return absl::InvalidArgumentError(absl::StrCat(request, ": ", why));
  };
  if (auto problem = names::buffer_name_problem(spec.backup_name)) {
    return invalid("its name: " + *problem);
  }
  if (auto problem = stable_tag_problem(spec.tag)) { return invalid(*problem); }
  if (spec.pool >= state_.pools.size() ||
      !state_.pools[spec.pool]->tenants.traits().stable_memory) {
    return invalid(absl::StrFormat("pool %d cannot make address-stable memory", spec.pool));
  }
  if (spec.host_pool >= state_.pools.size() ||
      state_.pools[spec.host_pool]->tenants.traits().space != memory_space::host) {
    return invalid(absl::StrFormat("pool %d is not a host pool", spec.host_pool));
  }
  auto const backup_bytes = spec.memory.block.bytes;
  if (spec.size == 0 || spec.bytes < spec.size || backup_bytes < spec.bytes) {
    return invalid(absl::StrFormat("its sizes do not fit (asked %s, allocation %s, backup %s)",
                                   bytes_text(spec.size),
                                   bytes_text(spec.bytes),
                                   bytes_text(backup_bytes)));
  }
  if (!spec.release || spec.memory.fd < 0) { return invalid("it has no memory to release"); }
  for (auto const& [id, e] : state_.stables) {
    if (e->session != 0 && e->uid == spec.uid && e->backup_name == spec.backup_name) {
      return absl::AlreadyExistsError(
          absl::StrFormat("%s: session %d sleeps under that name", request, e->session));
    }
  }
  auto const tenant = state_.options.tenancy.tenant_of(
      peer_credentials{.pid = spec.pid, .uid = spec.uid, .gid = spec.gid});
  auto entry          = std::make_unique<stable_entry>();
  entry->id           = next_id_++;
  entry->session      = 0;
  entry->uid          = spec.uid;
  entry->gid          = spec.gid;
  entry->pid          = spec.pid;
  entry->command      = std::move(spec.command);
  entry->tenant       = tenant;
  entry->pool         = spec.pool;
  entry->tag          = std::move(spec.tag);
  entry->size         = spec.size;
  entry->bytes        = spec.bytes;
  entry->state        = stable_state::asleep;
  entry->backup       = stable_backup{.serial  = next_backup_serial_++,
                                      .pool    = spec.host_pool,
                                      .tenant  = tenant,
                                      .memory  = std::move(spec.memory),
                                      .release = std::move(spec.release)};
  entry->backup_name  = std::move(spec.backup_name);
  entry->kept         = true;
  entry->asleep_since = spec.asleep_since;
  auto& hp            = *state_.pools[spec.host_pool];
  hp.in_use += backup_bytes;
  state_.stats.grew(spec.host_pool, hp.in_use);
  state_.uid_bytes[spec.uid] += backup_bytes;
  auto const id = entry->id;
  state_.stables.emplace(id, std::move(entry));
  return id;
}

}  // namespace rmmd::core
