#pragma once

// At start, before serving: takes back the buffers and the sleep backups the
// daemon before this one kept in systemd's fd store (docs/operations.md,
// "Restart and upgrade"; docs/sleep.md), and from then on keeps every
// published buffer and every named sleep backup there (the backups through
// daemon/restart/backup_restore).
//
// The fds the service manager passed (take_passed_fds, called first thing
// in main), the state file and the rule of daemon/restart/buffer_adoption
// decide which buffers are served again; each one's memory is checked (a
// host buffer's sealed memfd of its recorded size, in a host pool of its
// name; a CUDA allocation imported from its fd on the GPU of its UUID, in
// the pool of its name, mapped once at its recorded size) and adopted by the
// core. Whatever does not hold is said in the log, never served, and its fd
// closed and removed from the store. A bad state file ends no start.

#include "daemon/core/daemon_core.hpp"
#include "daemon/restart/fd_store.hpp"
#include "daemon/restart/fd_store_keeper.hpp"

#include <filesystem>
#include <memory>

namespace rmmd::startup {

/// Adopts what can be adopted into `core` and returns the keeper, already
/// set on `core` for buffers and backups; null where no service manager
/// listens (`store` is not available): then buffers and backups live as
/// long as this daemon, as without systemd they always did, and the state
/// file is neither read nor written.
/// REQUIRES: the pools are added; nothing is served yet.
std::shared_ptr<restart::fd_store_keeper> restore_buffers(core::daemon_core& core,
                                                          restart::fd_store& store,
                                                          restart::passed_fds passed,
                                                          std::filesystem::path const& state_file);

}  // namespace rmmd::startup
