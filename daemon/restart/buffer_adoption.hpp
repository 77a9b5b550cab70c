#pragma once

// At start: which stored buffers the new rmmd may serve, and which sleep
// backups it may keep. The state file says which buffers and backups the
// last rmmd stored (records); the service manager passes the fds it kept
// (take_passed_fds().stored). A record is adopted only when exactly one fd
// of its fd name came back and that fd is what the record says (a host
// buffer: a sealed memfd of allocation_bytes; a backup: a sealed memfd of
// backup_bytes; a CUDA buffer: not a memfd, and the caller then imports it
// and checks its size with the driver). Everything else is a problem in
// words, and its fd is closed and named for removal from the store, so that
// nothing is served wrong and nothing stale comes back at the next start:
//  - a record with no fd (its memory is gone: the store was cleared, the
//    node rebooted, the fd was dropped past FileDescriptorStoreMax);
//  - an fd no record names (stored just before a crash, before the state
//    file was written; or the state file is missing or unreadable);
//  - two fds of one name; an fd whose kind or size disagrees with its record.
//
// decide_adoption() is the rule alone, on facts (no OS calls); reconcile()
// applies it to real fds, taking each one's facts with inspect_fd().

#include "daemon/restart/fd_store.hpp"
#include "rmmd/v1/state.pb.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::restart {

/// What fstat and fcntl say about an fd.
struct fd_facts {
  bool open{false};         // fstat succeeded
  bool memfd{false};        // a regular shmem file with file seals (F_GET_SEALS answers)
  bool sealed_size{false};  // memfd sealed against shrinking and growing
  std::uint64_t bytes{0};   // st_size (memfds)
};

/// The facts of `fd` (never throws; a closed fd gives open == false).
[[nodiscard]] fd_facts inspect_fd(int fd) noexcept;

/// One passed buffer fd, as decide_adoption() sees it.
struct stored_fd_view {
  std::uint64_t fd_id{};
  std::string_view fd_name;
  fd_facts facts;
};

struct adoption_decision {
  /// (index into state.buffers, index into fds), in record order.
  std::vector<std::pair<std::size_t, std::size_t>> adopt;
  /// (index into state.backups, index into fds), in record order.
  std::vector<std::pair<std::size_t, std::size_t>> adopt_backups;
  /// Indexes into fds that are not adopted: close, and FDSTOREREMOVE by name.
  std::vector<std::size_t> drop_fds;
  /// Indexes into state.buffers that are not adopted.
  std::vector<std::size_t> drop_records;
  /// Indexes into state.backups that are not adopted.
  std::vector<std::size_t> drop_backup_records;
  /// One line per record or fd not adopted, saying why and what happens.
  std::vector<std::string> problems;
  /// The next fd_id to give: above every id in the state and among the fds.
  std::uint64_t next_fd_id{1};
};

/// The rule (above). `state`: nullptr when there is no usable state file.
/// REQUIRES: state, if given, passed state_problem() (decode_state does it).
[[nodiscard]] adoption_decision decide_adoption(v1::BufferRegistryState const* state,
                                                std::span<stored_fd_view const> fds);

/// A buffer the new rmmd may serve: its record and its fd.
struct adopted_buffer {
  v1::StoredBuffer record;
  owned_fd fd;
};

/// A sleep backup the new rmmd may keep: its record and its memfd.
struct adopted_backup {
  v1::StoredBackup record;
  owned_fd fd;
};

struct adoption_result {
  std::vector<adopted_buffer> adopted;
  std::vector<adopted_backup> adopted_backups;
  std::vector<std::string> problems;
  /// FDNAMEs to remove from the store (fd_store::remove); their fds here
  /// are already closed.
  std::vector<std::string> remove_from_store;
  std::uint64_t next_fd_id{1};
};

/// decide_adoption() on real fds: takes the fds, returns the adopted ones
/// (buffers and backups) and closes the rest.
[[nodiscard]] adoption_result reconcile(std::optional<v1::BufferRegistryState> const& state,
                                        std::vector<passed_stored_fd> fds);

}  // namespace rmmd::restart
