#include "daemon/restart/backup_restore.hpp"

#include "daemon/log.hpp"

#include <absl/status/status.h>
#include <absl/strings/str_format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace rmmd::restart {
namespace {

/// The pools `r` names, or why they no longer fit it.
absl::StatusOr<std::pair<core::pool_id, core::pool_id>> pools_of(
    std::vector<core::pool_description> const& pools, v1::StoredBackup const& r)
{
  auto named = [&](std::string const& name) {
    return std::find_if(pools.begin(), pools.end(), [&](auto const& p) { return p.name == name; });
  };
  auto device = named(r.pool_name());
  if (device == pools.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "its pool '%s' is not served by this daemon (the configuration changed)", r.pool_name()));
  }
  if (!device->backend.stable_memory) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "its pool '%s' is now a pool that makes no address-stable memory", r.pool_name()));
  }
  if (device->gpu_uuid != r.gpu_uuid()) {
    return absl::FailedPreconditionError(
        absl::StrFormat("it wakes on GPU %s, and pool '%s' is now on GPU %s (the GPU is gone, or "
                        "the configuration moved the pool)",
                        r.gpu_uuid(),
                        r.pool_name(),
                        device->gpu_uuid.empty() ? std::string("(none)") : device->gpu_uuid));
  }
  auto host = named(r.host_pool_name());
  if (host == pools.end() || host->backend.space != core::memory_space::host) {
    return absl::NotFoundError(absl::StrFormat(
        "its host pool '%s' is not a host pool of this daemon (the configuration changed)",
        r.host_pool_name()));
  }
  return std::pair{device->id, host->id};
}

}  // namespace

backups_adopted adopt_backups(core::daemon_core& core,
                              std::vector<adopted_backup> backups,
                              fd_store_keeper& keeper)
{
  backups_adopted result;
  auto const pools = core.pools().list();
  for (auto& b : backups) {
    auto const& r = b.record;
    auto drop     = [&](absl::Status const& why) {
      log::warn("backup '%s' of uid %d (fd '%s'): %s: not kept, removed from the store",
                r.backup_name(),
                r.uid(),
                r.fd_name(),
                why.message());
      b.fd = owned_fd();
      result.remove_from_store.push_back(r.fd_name());
      ++result.dropped;
    };
    auto ids = pools_of(pools, r);
    if (!ids.ok()) {
      drop(ids.status());
      continue;
    }
    // reconcile checked it: a memfd sealed at exactly backup_bytes.
    core::shared_allocation memory{
        .block = {.bytes = r.backup_bytes()}, .fd = b.fd.get(), .host_memfd = true};
    auto adopted = core.stables().adopt_backup(core::adopted_backup_spec{
        .uid          = r.uid(),
        .gid          = r.gid(),
        .pid          = r.pid(),
        .command      = r.command(),
        .backup_name  = r.backup_name(),
        .tag          = r.tag(),
        .size         = r.size(),
        .bytes        = r.allocation_bytes(),
        .pool         = ids->first,
        .host_pool    = ids->second,
        .asleep_since = std::chrono::system_clock::time_point(
            std::chrono::milliseconds(r.asleep_since_unix_ms())),
        .memory  = memory,
        .release = [](core::shared_allocation const& m) { ::close(m.fd); }});
    if (!adopted.ok()) {
      drop(adopted.status());
      continue;
    }
    b.fd.release();  // the core's now
    ++result.adopted;
    result.bytes += r.backup_bytes();
    keeper.adopted_backup(*adopted, r);
    log::info("backup '%s' of uid %d (tag '%s', %d bytes) is kept again after the restart",
              r.backup_name(),
              r.uid(),
              r.tag(),
              r.backup_bytes());
  }
  return result;
}

}  // namespace rmmd::restart
