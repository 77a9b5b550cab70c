#pragma once

// At start, after reconcile() (buffer_adoption.hpp): the sleep backups the
// daemon before this one kept are taken back into the core as backups kept
// under their names (stable_registry::adopt_backup), each charged to its
// uid and its host pool again, for a process of that uid to restore or for
// `rmmctl sleepers drop` to free. A backup is adopted only where the pools
// still fit its record: its CUDA pool (by name) makes address-stable memory
// on the GPU of the record's UUID, and its host pool (by name) is a host
// pool. Whatever does not hold is said in the log, never kept, and its fd
// closed and named for removal from the store.

#include "daemon/core/daemon_core.hpp"
#include "daemon/restart/buffer_adoption.hpp"
#include "daemon/restart/fd_store_keeper.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace rmmd::restart {

/// What adopt_backups() came to.
struct backups_adopted {
  std::size_t adopted{};
  std::size_t bytes{};  ///< their backups' bytes
  std::size_t dropped{};
  /// FDNAMEs to remove from the store (their fds here are closed already).
  std::vector<std::string> remove_from_store;
};

/// Adopts `backups` into `core` (see above) and tells `keeper` of each one
/// adopted; logs a line per backup not adopted. REQUIRES: the pools are
/// added; nothing is served yet.
backups_adopted adopt_backups(core::daemon_core& core,
                              std::vector<adopted_backup> backups,
                              fd_store_keeper& keeper);

}  // namespace rmmd::restart
