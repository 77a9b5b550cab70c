#pragma once

// The core's side of sleep backups that outlive the daemon (docs/sleep.md,
// "Across a restart of rmmd"): whoever keeps a named host backup's memfd
// across a restart of rmmd (daemon/restart/fd_store_keeper.hpp: systemd's fd
// store and the state file) learns from the core when an address-stable
// allocation falls asleep with a named host backup, and when that backup
// goes (its wake finished, dropped by name, freed); at start the core takes
// back, as backups kept under their names, what the last daemon kept. The
// core knows nothing of systemd or files. The same for published buffers:
// buffer_keeper.hpp.

#include "daemon/core/pool_backend.hpp"
#include "daemon/core/types.hpp"

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace rmmd::core {

/// A sleeping allocation's named host backup, as a keeper records it: what
/// a restore needs to make the allocation again and copy the backup back.
struct kept_backup {
  stable_id id{};
  uid_t uid{};
  gid_t gid{};  ///< its sleeper's primary gid: the tenant it is charged to
  pid_t pid{};
  std::string command{};
  std::string backup_name{};
  std::string tag{};
  std::size_t size{};            ///< the allocation's bytes asked for
  std::size_t bytes{};           ///< the allocation's bytes: what a restore maps
  std::string pool_name{};       ///< the CUDA pool it wakes in
  std::string gpu_uuid{};        ///< that pool's GPU
  std::string host_pool_name{};  ///< the host pool its backup is charged to
  int fd{-1};                    ///< the backup's memfd, owned by the core: the keeper takes a dup
  std::size_t backup_bytes{};    ///< the memfd's bytes (>= bytes)
  std::chrono::system_clock::time_point asleep_since{};
};

/// Told of backups to keep and to let go. The calls come under the core's
/// lock, from any thread: they must return at once (take a dup, queue, wake
/// a thread) and never call the core.
class backup_keeper {
 public:
  backup_keeper()                                = default;
  backup_keeper(backup_keeper const&)            = delete;
  backup_keeper& operator=(backup_keeper const&) = delete;
  virtual ~backup_keeper()                       = default;

  /// `backup`'s allocation fell asleep with it. A second call for the same
  /// id (it slept again under another name) replaces the first.
  virtual void keep_backup(kept_backup const& backup) noexcept = 0;
  /// The backup of allocation `id` went: it is not to be kept after a
  /// restart. Ids the keeper does not keep are ignored.
  virtual void forget_backup(stable_id id) noexcept = 0;
  /// Returns once what the calls above were told before this call is kept
  /// for good, or at `deadline` (false). Called without the core's lock: a
  /// sleep answers only after it.
  virtual bool wait_until_kept(std::chrono::steady_clock::time_point /*deadline*/) noexcept
  {
    return true;
  }
};

/// A backup the last daemon kept, for stable_registry::adopt_backup.
struct adopted_backup_spec {
  uid_t uid{};
  gid_t gid{};
  pid_t pid{};
  std::string command{};
  std::string backup_name{};
  std::string tag{};
  std::size_t size{};
  std::size_t bytes{};
  pool_id pool{};       ///< the CUDA pool it wakes in
  pool_id host_pool{};  ///< the host pool its backup is charged to
  std::chrono::system_clock::time_point asleep_since{};
  /// The backup: block.bytes the memfd's bytes, fd the memfd (the core's to
  /// close through `release`).
  shared_allocation memory{};
  /// Frees `memory`; called once, under the core's lock, when the backup goes.
  std::function<void(shared_allocation const&)> release{};
};

}  // namespace rmmd::core
