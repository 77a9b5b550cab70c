#pragma once

// Starting a program as another user of this system (spawn_options::user,
// daemon_process::options::user): the way the shipped systemd unit runs rmmd
// as `rmmd` and clients run as other users. The lookup itself is
// common/system_user.hpp.

#include "common/system_user.hpp"

#include <string>
#include <vector>

namespace rmmd::harness {

using common::find_user;
using common::groups_of;
using common::system_user;

/// The prefix that runs a program as `user` with its primary group and its
/// supplementary groups: `setpriv --reuid=UID --regid=GID --init-groups --`
/// (util-linux; setpriv execs the program, so the child keeps its pid).
/// Throws std::runtime_error, saying what to do, if there is no such user,
/// if setpriv is missing, or if this process is not root and `user` is not
/// this process's own user.
std::vector<std::string> run_as_prefix(std::string const& user);

}  // namespace rmmd::harness
