#pragma once

// What the daemon's core is told at start and on a reload (SIGHUP): who may
// open sessions, the quotas, the admin uid, reclaim, packing and tenancy.
// Plain values; the core keeps its copy in core_state, under its mutex.

#include "daemon/core/tenants.hpp"
#include "daemon/core/types.hpp"

#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <map>
#include <vector>

namespace rmmd::core {

/// Who may open a session: a peer whose uid is listed, or whose primary or
/// supplementary gid is listed.
struct access_policy {
  std::vector<uid_t> uids;
  std::vector<gid_t> gids;

  [[nodiscard]] bool allows(peer_credentials const& peer) const;
};

/// Byte quotas; 0 means unlimited.
struct quota_limits {
  std::size_t per_session_bytes{};
  std::size_t per_uid_bytes{};                     ///< default for every uid
  std::map<uid_t, std::size_t> per_uid_overrides;  ///< uid -> bytes, wins over per_uid_bytes

  [[nodiscard]] std::size_t limit_for_uid(uid_t uid) const;
};

struct core_options {
  access_policy access;
  quota_limits quotas;
  /// Besides root, the one uid whose sessions may make admin requests (trim):
  /// by default the daemon's own.
  uid_t admin_uid{::geteuid()};
  /// How long a request that finds its pool short waits for other sessions to
  /// give back idle slabs that could serve it (see allocate()); 0: it is
  /// refused at once. A reload may change it (core_reload).
  std::chrono::milliseconds reclaim_timeout{default_reclaim_timeout};
  /// Packed leases. A CUDA pool's direct allocation of at most this many
  /// bytes, asked for with may_pack, is carved out of a block of
  /// pack_block_size bytes that the daemon leases to that session alone
  /// (exported and imported once), instead of being an allocation of its own:
  /// no driver call per allocation, and no driver memory per lease. 0: never.
  /// pack_up_to is at most pack_block_size (the constructor lowers it); a
  /// reload may change it (core_reload), the block size and pack_idle not.
  std::size_t pack_up_to{default_pack_up_to};
  std::size_t pack_block_size{default_pack_block_size};
  /// A session keeps one empty packed block per pool this long, then it is
  /// retired too.
  std::chrono::milliseconds pack_idle{default_pack_idle};
  /// Which sessions share a backend (tenants.hpp): by default every uid has
  /// backends of its own, in the pools added with a backend_maker. Fixed
  /// while the daemon runs.
  tenancy_policy tenancy{};
};

/// What the configuration file can change while the daemon runs (SIGHUP):
/// see daemon_core::reconfigure.
struct core_reload {
  access_policy access;
  quota_limits quotas;
  std::chrono::milliseconds reclaim_timeout{default_reclaim_timeout};
  std::size_t pack_up_to{default_pack_up_to};
};

}  // namespace rmmd::core
