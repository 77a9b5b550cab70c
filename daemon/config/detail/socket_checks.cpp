#include "common/system_user.hpp"
#include "daemon/config/detail/checks.hpp"
#include "daemon/config/detail/value_formats.hpp"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>

namespace rmmd::config::detail {
namespace {

/// A socket path must fit sockaddr_un::sun_path (108 bytes with the NUL).
constexpr std::size_t max_socket_path = 107;

}  // namespace

void check_runtime(checked_file& f, daemon_settings& s)
{
  if (!f.config().runtime_dir().empty()) {
    std::filesystem::path dir = f.config().runtime_dir();
    if (!dir.is_absolute()) {
      f.error(f.root(),
              "runtime_dir",
              -1,
              "runtime_dir \"%s\" is relative; give an absolute path such as \"/run/rmmd\"",
              f.config().runtime_dir());
    } else if ((dir / "rmmd-session.sock").native().size() > max_socket_path) {
      f.error(f.root(),
              "runtime_dir",
              -1,
              "runtime_dir \"%s\" is too long: a socket path in it must fit in %d bytes",
              f.config().runtime_dir(),
              max_socket_path);
    } else {
      s.runtime_dir = dir;
    }
  }
  if (auto const& file = f.config().state_file(); !file.empty()) {
    if (std::filesystem::path(file).is_absolute() && !std::filesystem::path(file).has_filename()) {
      f.error(f.root(), "state_file", -1, "state_file \"%s\" names a directory; name a file", file);
    } else if (!std::filesystem::path(file).is_absolute()) {
      f.error(f.root(),
              "state_file",
              -1,
              "state_file \"%s\" is relative; give an absolute path such as "
              "\"/var/lib/rmmd/buffers.state\"",
              file);
    } else {
      s.state_file = file;
    }
  }
  if (auto const& g = f.config().socket_group(); !g.empty()) {
    std::uint32_t gid = 0;
    if (std::all_of(g.begin(), g.end(), absl::ascii_isdigit) && absl::SimpleAtoi(g, &gid)) {
      s.socket_group = gid;
    } else if (auto found = common::find_group(g)) {
      s.socket_group = *found;
    } else {
      f.error(f.root(),
              "socket_group",
              -1,
              "socket_group \"%s\": no such group; create it (the package's sysusers.d file "
              "creates \"rmmd\") or give another group name or gid",
              g);
    }
    s.socket_group_name = g;
  }
  if (!f.config().runtime_dir_mode().empty()) {
    auto mode = parse_mode(f.config().runtime_dir_mode());
    if (!mode || *mode > 07777) {
      f.error(f.root(),
              "runtime_dir_mode",
              -1,
              "runtime_dir_mode \"%s\" is not an octal mode; write it like \"0750\"",
              f.config().runtime_dir_mode());
    } else if ((*mode & 0700) != 0700) {
      f.error(f.root(),
              "runtime_dir_mode",
              -1,
              "runtime_dir_mode \"%s\" must give the owner rwx (0700): the daemon creates its "
              "sockets there",
              f.config().runtime_dir_mode());
    } else {
      s.runtime_dir_mode = *mode;
    }
  }
  if (!f.config().socket_mode().empty()) {
    auto mode = parse_mode(f.config().socket_mode());
    if (!mode || *mode > 0777) {
      f.error(f.root(),
              "socket_mode",
              -1,
              "socket_mode \"%s\" is not an octal permission mode; write it like \"0660\"",
              f.config().socket_mode());
    } else if ((*mode & 0600) != 0600) {
      f.error(f.root(),
              "socket_mode",
              -1,
              "socket_mode \"%s\" must give the owner read and write (0600)",
              f.config().socket_mode());
    } else {
      s.socket_mode = *mode;
    }
  }
}

void check_access(checked_file& f, daemon_settings& s)
{
  bool const any = f.config().allowed_uids_size() + f.config().allowed_gids_size() +
                       f.config().allowed_users_size() + f.config().allowed_groups_size() >
                   0;
  if (!any) { return; }  // the default policy stays
  s.access_is_default = false;
  s.access            = {};
  for (auto uid : f.config().allowed_uids()) { s.access.uids.push_back(uid); }
  for (auto gid : f.config().allowed_gids()) { s.access.gids.push_back(gid); }
  for (int i = 0; i < f.config().allowed_users_size(); ++i) {
    auto const& name = f.config().allowed_users(i);
    if (auto user = common::find_user(name)) {
      s.access.uids.push_back(user->uid);
    } else {
      f.error(f.root(),
              "allowed_users",
              i,
              "allowed_users: no user named \"%s\" on this system; give an existing user name or "
              "its uid in allowed_uids",
              name);
    }
  }
  for (int i = 0; i < f.config().allowed_groups_size(); ++i) {
    auto const& name = f.config().allowed_groups(i);
    if (auto gid = common::find_group(name)) {
      s.access.gids.push_back(*gid);
    } else {
      f.error(f.root(),
              "allowed_groups",
              i,
              "allowed_groups: no group named \"%s\" on this system; give an existing group name "
              "or its gid in allowed_gids",
              name);
    }
  }
}

void check_tenancy(checked_file& f, daemon_settings& s)
{
  if (!f.config().has_tenancy()) { return; }
  auto const& t = f.config().tenancy();
  auto const n  = f.nested(f.root(), "tenancy");
  s.tenancy     = {.isolate = t.mode() != v1::Tenancy::SHARED, .shared_gids = {}};
  for (auto gid : t.shared_gids()) { s.tenancy.shared_gids.push_back(gid); }
  for (int i = 0; i < t.shared_groups_size(); ++i) {
    auto const& name = t.shared_groups(i);
    if (auto gid = common::find_group(name)) {
      s.tenancy.shared_gids.push_back(*gid);
    } else {
      f.error(n,
              "shared_groups",
              i,
              "tenancy.shared_groups: no group named \"%s\" on this system; give an existing "
              "group name or its gid in shared_gids",
              name);
    }
  }
  if (!s.tenancy.isolate && !s.tenancy.shared_gids.empty()) {
    f.error(n,
            t.shared_gids_size() > 0 ? "shared_gids" : "shared_groups",
            0,
            "tenancy: shared groups mean nothing with mode SHARED (every session shares every "
            "pool then); drop them, or use mode PER_UID");
  }
}

}  // namespace rmmd::config::detail
