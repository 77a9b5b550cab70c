#pragma once

// A user of this system, as children are started under it (spawn_options::user,
// daemon_process::options::user): the way the shipped systemd unit runs rmmd
// as `rmmd` and clients run as other users.

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace rmmd::tools {

struct system_user {
  std::string name;
  uid_t uid{};
  gid_t gid{};  ///< primary group
};

/// The user named `name` (NSS: getpwnam_r); nullopt if there is none.
std::optional<system_user> find_user(std::string const& name);

/// The user's primary and supplementary gids (getgrouplist).
std::vector<gid_t> groups_of(system_user const& user);

/// The prefix that runs a program as `user` with its primary group and its
/// supplementary groups: `setpriv --reuid=UID --regid=GID --init-groups --`
/// (util-linux; setpriv execs the program, so the child keeps its pid).
/// Throws std::runtime_error, saying what to do, if there is no such user,
/// if setpriv is missing, or if this process is not root and `user` is not
/// this process's own user.
std::vector<std::string> run_as_prefix(std::string const& user);

}  // namespace rmmd::tools
