#pragma once

// Test support: the users that tests run the daemon and its clients as, the
// way the shipped systemd unit does (rmmd as user `rmmd`, clients as other
// users in group `rmmd`). Tests that need them make sure they exist and skip,
// saying why, where they cannot (not root):
//
//   auto a = ensure_user(client_user_a, daemon_group);
//   if (!a) { GTEST_SKIP() << users_need_root(); }
//
// CI runs as root on a clean machine, where the users are created on first
// use (useradd --system --no-create-home) and stay for later runs.

#include "common/system_user.hpp"

#include <filesystem>
#include <optional>
#include <string>

namespace rmmd::test {

using common::system_user;

/// By convention: rmmd runs as `daemon_user`, whose primary group is
/// `daemon_group`; `client_user_a` and `client_user_b` are members of
/// `daemon_group` (allowed by the daemon's default policy, and able to reach
/// its sockets); `outsider_user` is not.
inline constexpr char const* daemon_user   = "rmmd";
inline constexpr char const* daemon_group  = "rmmd";
inline constexpr char const* client_user_a = "rmmd-test-a";
inline constexpr char const* client_user_b = "rmmd-test-b";
inline constexpr char const* outsider_user = "rmmd-test-outsider";

/// Makes sure user `name` exists and, if `group` is given, belongs to it
/// (created with groupadd --system if missing; it is the user's primary
/// group when it has the user's name, as for `rmmd`, else a supplementary
/// one). Creates the user with useradd --system --no-create-home and no login
/// shell. Returns nullopt when this process is not root (the test skips with
/// users_need_root()); throws std::runtime_error, with groupadd's, useradd's
/// or usermod's output, if root cannot do it. Safe against other processes
/// creating the same users at once.
std::optional<system_user> ensure_user(std::string const& name, std::string const& group = {});

/// Why ensure_user() returned nullopt, for GTEST_SKIP().
std::string users_need_root();

/// Empty if `user` can execute `program` (every directory above it
/// searchable, the file executable, by owner, group or other bits); else why
/// not, naming the first path in the way and what to change. A build tree
/// under a private home directory is the usual cause; tests skip with this
/// reason rather than fail for where the tree was checked out.
std::string unreachable_for(system_user const& user, std::filesystem::path const& program);

}  // namespace rmmd::test
