#pragma once

// Users and groups of this system, looked up by name through NSS
// (getpwnam_r, getgrnam_r, getgrouplist): how the daemon resolves the names
// in its configuration, and how the test and bench harness finds the users
// it runs the daemon and its clients as.
//
// Thread safety: free functions without shared state (the reentrant NSS
// calls, each with a buffer of its own).

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace rmmd::common {

struct system_user {
  std::string name;
  uid_t uid{};
  gid_t gid{};  ///< primary group
};

/// The user named `name`; nullopt if there is none (or NSS cannot say).
[[nodiscard]] std::optional<system_user> find_user(std::string const& name);

/// The gid of the group named `name`; nullopt if there is none.
[[nodiscard]] std::optional<gid_t> find_group(std::string const& name);

/// The user's primary and supplementary gids.
[[nodiscard]] std::vector<gid_t> groups_of(system_user const& user);

}  // namespace rmmd::common
