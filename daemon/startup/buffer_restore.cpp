#include "daemon/startup/buffer_restore.hpp"

#include "daemon/backends/cuda/buffer_import.hpp"
#include "daemon/log.hpp"
#include "daemon/restart/backup_restore.hpp"
#include "daemon/restart/buffer_adoption.hpp"
#include "daemon/restart/state_file.hpp"
#include "daemon/wire/proto_convert.hpp"

#include <absl/strings/str_format.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::startup {
namespace {

/// One adopted buffer's memory, checked against its record and its pool.
struct checked_memory {
  core::pool_id pool{};
  core::shared_allocation memory;
  std::function<void(core::shared_allocation const&)> release;
};

/// The memory of `b` in the pool its record names, or why it cannot be
/// served. On success the fd is the result's; on error it is still `b`'s.
absl::StatusOr<checked_memory> check_memory(std::vector<core::pool_description> const& pools,
                                            restart::adopted_buffer& b)
{
  auto const& r = b.record;
  auto pool     = std::find_if(
      pools.begin(), pools.end(), [&](auto const& p) { return p.name == r.pool_name(); });
  if (pool == pools.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "its pool '%s' is not served by this daemon (the configuration changed)", r.pool_name()));
  }
  if (r.kind() == v1::STORED_BUFFER_KIND_HOST_MEMFD) {
    if (pool->backend.space != core::memory_space::host) {
      return absl::FailedPreconditionError(
          absl::StrFormat("it is a host buffer, and pool '%s' is now a CUDA pool", r.pool_name()));
    }
    // buffer_adoption checked it: a memfd sealed at exactly allocation_bytes.
    return checked_memory{.pool    = pool->id,
                          .memory  = {.block      = {.bytes = r.allocation_bytes()},
                                      .fd         = b.fd.release(),
                                      .host_memfd = true},
                          .release = [](core::shared_allocation const& m) { ::close(m.fd); }};
  }
  if (pool->backend.space != core::memory_space::device) {
    return absl::FailedPreconditionError(
        absl::StrFormat("it is a CUDA buffer, and pool '%s' is now a host pool", r.pool_name()));
  }
  if (pool->gpu_uuid != r.gpu_uuid()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "it lives on GPU %s, and pool '%s' is now on GPU %s (the GPU is gone, or the "
        "configuration moved the pool)",
        r.gpu_uuid(),
        r.pool_name(),
        pool->gpu_uuid.empty() ? std::string("(none)") : pool->gpu_uuid));
  }
  // The pool's handle types, not its fabric_handle: a pool with a backend
  // per tenant describes no tenant's handle here.
  bool const pool_fabric =
      std::find(pool->handle_types.begin(), pool->handle_types.end(), core::handle_type::fabric) !=
      pool->handle_types.end();
  bool const fabric = r.fabric() && pool_fabric;
  auto imported     = backends::cuda::import_buffer(
      pool->device, b.fd.get(), r.allocation_bytes(), fabric, r.fabric_handle());
  if (!imported.ok()) { return imported.status(); }
  b.fd.release();  // the imported memory owns it now
  if (imported->recorded_fabric) {
    log::info(
        "buffer '%s' is served with the fabric handle it had before the restart (the state "
        "file's; the driver exports none from an allocation imported by POSIX fd)",
        r.name());
  } else if (!imported->fabric_note.empty()) {
    log::warn(
        "buffer '%s' is served by its POSIX fd only, without a fabric handle: %s; "
        "processes that import it by fabric handle cannot open it until it is created again",
        r.name(),
        imported->fabric_note);
  } else if (r.fabric() && !fabric) {
    log::warn(
        "buffer '%s' had a fabric handle and pool '%s' has none now: it is served by its "
        "POSIX fd only",
        r.name(),
        r.pool_name());
  }
  int const device = pool->device;
  return checked_memory{.pool    = pool->id,
                        .memory  = std::move(imported->memory),
                        .release = [device](core::shared_allocation const& m) {
                          backends::cuda::release_own(device, m);
                        }};
}

/// The state file's state; nullopt (after saying why) when there is none
/// or it cannot be used.
std::optional<v1::BufferRegistryState> read_state(std::filesystem::path const& path)
{
  auto state = restart::read_state_file(path);
  if (!state.ok()) {
    log::error(
        "the state file cannot be used, so no stored buffer is served again and every fd "
        "the fd store passed is dropped: %s",
        state.status().message());
    return std::nullopt;
  }
  return *std::move(state);
}

/// Fds passed that are not buffers': closed, and out of the store.
void drop_others(restart::fd_store& store, std::vector<restart::passed_fd>& others)
{
  for (auto& o : others) {
    log::warn(
        "fd '%s' passed by the service manager is not a buffer's: closed, removed from the "
        "store",
        o.name);
    o.fd = restart::owned_fd();
    if (auto removed = store.remove(o.name); !removed.ok()) { log::warn("%s", removed.message()); }
  }
}

}  // namespace

std::shared_ptr<restart::fd_store_keeper> restore_buffers(core::daemon_core& core,
                                                          restart::fd_store& store,
                                                          restart::passed_fds passed,
                                                          std::filesystem::path const& state_file)
{
  if (!store.available()) {
    if (!passed.stored.empty()) {
      log::warn(
          "%d stored fd(s) were passed, but no service manager listens (NOTIFY_SOCKET is "
          "unset) to keep them: closed",
          passed.stored.size());
    }
    log::info(
        "buffers live as long as this daemon, and so do sleep backups: no service manager keeps "
        "their fds (NOTIFY_SOCKET is unset)");
    return nullptr;
  }
  drop_others(store, passed.others);
  auto const state      = read_state(state_file);
  auto const previous   = state ? state->daemon_generation() : 0;
  auto const generation = previous + 1;
  auto result           = restart::reconcile(state, std::move(passed.stored));
  core::restart_summary summary{.restarts = previous, .keeping = true};
  for (auto const& problem : result.problems) { log::warn("%s", problem); }
  summary.dropped = result.problems.size();

  auto keeper = std::make_shared<restart::fd_store_keeper>(
      restart::fd_store_keeper::options{
          .state_file = state_file, .generation = generation, .next_fd_id = result.next_fd_id},
      store);
  std::vector<std::string> to_remove = std::move(result.remove_from_store);
  auto const pools                   = core.pools().list();
  for (auto& b : result.adopted) {
    auto const& r = b.record;
    auto memory   = check_memory(pools, b);
    if (!memory.ok()) {
      log::warn("buffer '%s' (fd '%s'): %s: not served, removed from the store",
                r.name(),
                r.fd_name(),
                memory.status().message());
      b.fd = restart::owned_fd();
      to_remove.push_back(r.fd_name());
      ++summary.dropped;
      continue;
    }
    auto manifest =
        r.has_manifest()
            ? std::make_shared<core::buffer_manifest const>(wire::from_proto(r.manifest()))
            : nullptr;
    auto const release = memory->release;
    auto const block   = memory->memory;
    auto adopted       = core.buffers().adopt_buffer(core::adopted_buffer_spec{
              .name          = r.name(),
              .pool          = memory->pool,
              .size          = r.size(),
              .persistent    = r.persistent(),
              .gid           = r.has_gid() ? std::optional<gid_t>(r.gid()) : std::nullopt,
              .allow_writers = r.allow_writers(),
              .creator_uid   = r.creator_uid(),
              .creator_pid   = r.creator_pid(),
              .created =
            std::chrono::system_clock::time_point(std::chrono::milliseconds(r.created_unix_ms())),
              .manifest = std::move(manifest),
              .memory   = std::move(memory->memory),
              .release  = memory->release});
    if (!adopted.ok()) {
      release(block);
      log::warn("buffer '%s' (fd '%s'): %s: not served, removed from the store",
                r.name(),
                r.fd_name(),
                adopted.status().message());
      to_remove.push_back(r.fd_name());
      ++summary.dropped;
      continue;
    }
    ++summary.adopted_buffers;
    summary.adopted_bytes += r.allocation_bytes();
    keeper->adopted(*adopted, r);
    log::info("buffer '%s' (%d bytes in pool '%s', uid %d%s) is served again after the restart",
              r.name(),
              r.size(),
              r.pool_name(),
              r.creator_uid(),
              r.persistent() ? ", persistent" : "");
  }
  auto backups = restart::adopt_backups(core, std::move(result.adopted_backups), *keeper);
  summary.dropped += backups.dropped;
  to_remove.insert(
      to_remove.end(), backups.remove_from_store.begin(), backups.remove_from_store.end());
  // The records now name exactly what is served and kept; then what is not
  // leaves the store (a crash between the two leaves unknown fds: dropped
  // next time).
  if (auto written = keeper->write_now(); !written.ok()) {
    log::error(
        "the state file was not written: buffers published from now on will not be "
        "served after a restart until it is: %s",
        written.message());
  }
  for (auto const& name : to_remove) {
    if (auto removed = store.remove(name); !removed.ok()) { log::warn("%s", removed.message()); }
  }
  log::info(
      "restart %d of this daemon: %d buffer(s) of %d bytes served again, %d sleep backup(s) of "
      "%d bytes kept again, %d problem(s); state file %s",
      previous,
      summary.adopted_buffers,
      summary.adopted_bytes,
      backups.adopted,
      backups.bytes,
      summary.dropped,
      state_file.string());
  core.pools().set_restart_summary(summary);
  core.buffers().set_buffer_keeper(keeper);
  core.stables().set_backup_keeper(keeper);
  return keeper;
}

}  // namespace rmmd::startup
