#pragma once

// Keeps published buffers and named sleep backups across a restart of rmmd:
// the core's buffer_keeper (daemon/core/buffer_keeper.hpp) and
// backup_keeper (daemon/core/backup_keeper.hpp) over systemd's fd store
// (fd_store.hpp) and the state file (state_file.hpp).
//
// When a buffer is published, its fd goes to the store under
// buffer_fd_name(fd_id, name) and the state file is rewritten with its
// record; when it is deleted or freed, the state file is rewritten without
// it and its fd is removed from the store (FDSTOREREMOVE). A backup the
// same, under backup_fd_name(fd_id, backup name), once its allocation
// sleeps, until it goes; a backup kept again (its allocation slept again)
// replaces its record and its old fd leaves the store. The order makes
// every crash safe: a stored fd that the state file does not name yet, or no
// longer names, is an unknown fd at the next start, which drops it
// (buffer_adoption.hpp); a record never names an fd that was not stored.
//
// The core calls keep(), forget(), keep_backup() and forget_backup() under
// its lock, so they only take a dup of the fd and queue; a thread of the
// keeper's own stores, writes and removes, in the order the calls came,
// writing the file once per batch.
//
// Thread safety: every member may be called from any thread.

#include "daemon/core/backup_keeper.hpp"
#include "daemon/core/buffer_keeper.hpp"
#include "daemon/restart/fd_store.hpp"
#include "rmmd/v1/state.pb.h"

#include <absl/status/status.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

namespace rmmd::restart {

/// A published buffer's record as the state file keeps it (fd_name and
/// fd_id are the caller's to set).
[[nodiscard]] v1::StoredBuffer stored_record(core::kept_buffer const& buffer);
/// A sleep backup's record, the same way.
[[nodiscard]] v1::StoredBackup stored_record(core::kept_backup const& backup);

class fd_store_keeper final : public core::buffer_keeper, public core::backup_keeper {
 public:
  struct options {
    std::filesystem::path state_file;
    /// Counts the daemons that wrote the file: this one's (the last one's + 1).
    std::uint64_t generation{1};
    /// The first fd_id to give (adoption_result::next_fd_id).
    std::uint64_t next_fd_id{1};
  };

  /// Starts the writing thread. REQUIRES: `store` outlives the keeper.
  fd_store_keeper(options opts, fd_store& store);
  /// Does what is queued (a delete just before shutdown still leaves the
  /// store), then stops the thread.
  ~fd_store_keeper() override;

  void keep(core::kept_buffer const& buffer) noexcept override;
  void forget(core::buffer_id id) noexcept override;
  void keep_backup(core::kept_backup const& backup) noexcept override;
  void forget_backup(core::stable_id id) noexcept override;
  /// For both: what was kept or forgotten before the call.
  bool wait_until_kept(std::chrono::steady_clock::time_point deadline) noexcept override;

  /// A buffer adopted at start, whose fd is in the store already under
  /// record.fd_name. Call before serving.
  void adopted(core::buffer_id id, v1::StoredBuffer record);
  /// A backup adopted at start, the same way.
  void adopted_backup(core::stable_id id, v1::StoredBackup record);

  /// Writes the state file now with what is kept (at start, once the
  /// adopted buffers are in). Errors as write_state_file.
  absl::Status write_now();

 private:
  struct keep_event {
    core::kept_buffer buffer;
    owned_fd fd;  // a dup of buffer.fd
  };
  struct forget_event {
    core::buffer_id id{};
  };
  struct keep_backup_event {
    core::kept_backup backup;
    owned_fd fd;  // a dup of backup.fd
  };
  struct forget_backup_event {
    core::stable_id id{};
  };
  using event = std::variant<keep_event, forget_event, keep_backup_event, forget_backup_event>;

  /// Queues `e` for the thread; false (nothing queued) when out of memory.
  bool enqueue(event e) noexcept;
  void run();
  /// Stores, writes and removes for one batch (on the thread, unlocked).
  void apply(std::deque<event> batch);
  /// One event of a batch: whether the records changed; an fd name that
  /// left them goes to `to_remove`. REQUIRES: records_mutex_ held.
  bool apply_locked(event& e, std::vector<std::string>& to_remove);
  absl::Status write_locked_records();

  options options_;
  fd_store& store_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<event> queue_;
  bool stopping_{false};
  std::uint64_t queued_{0};   // events queued since the start
  std::uint64_t applied_{0};  // of those, stored, written and removed
  std::condition_variable applied_changed_;

  std::mutex records_mutex_;  // the records and next_fd_id_; taken after mutex_ is let go
  std::map<core::buffer_id, v1::StoredBuffer> records_;
  std::map<core::stable_id, v1::StoredBackup> backup_records_;
  std::uint64_t next_fd_id_{1};

  std::thread thread_;  // last: started once the rest is built
};

}  // namespace rmmd::restart
