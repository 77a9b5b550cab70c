#include "tools/process/system_user.hpp"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

namespace rmmd::tools {
namespace {

constexpr char const* setpriv_path = "/usr/bin/setpriv";

}  // namespace

std::optional<system_user> find_user(std::string const& name)
{
  std::vector<char> buffer(16384);
  while (true) {
    passwd entry{};
    passwd* found = nullptr;
    int rc        = ::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (rc == ERANGE) {
      buffer.resize(buffer.size() * 2);
      continue;
    }
    if (rc != 0 || found == nullptr) { return std::nullopt; }
    return system_user{.name = entry.pw_name, .uid = entry.pw_uid, .gid = entry.pw_gid};
  }
}

std::vector<gid_t> groups_of(system_user const& user)
{
  std::vector<gid_t> groups(32);
  while (true) {
    int n = static_cast<int>(groups.size());
    if (::getgrouplist(user.name.c_str(), user.gid, groups.data(), &n) >= 0) {
      groups.resize(static_cast<std::size_t>(n));
      return groups;
    }
    groups.resize(static_cast<std::size_t>(n) > groups.size() ? static_cast<std::size_t>(n)
                                                              : groups.size() * 2);
  }
}

std::vector<std::string> run_as_prefix(std::string const& user)
{
  auto found = find_user(user);
  if (!found) {
    throw std::runtime_error("cannot run a program as user \"" + user +
                             "\": no such user on this system (create it, e.g. useradd --system "
                             "--no-create-home " +
                             user + ")");
  }
  if (::geteuid() != 0 && ::geteuid() != found->uid) {
    throw std::runtime_error("cannot run a program as user \"" + user +
                             "\": only root may start a process as another user (this process "
                             "runs as uid " +
                             std::to_string(::geteuid()) + ")");
  }
  if (::access(setpriv_path, X_OK) != 0) {
    throw std::runtime_error(std::string("cannot run a program as user \"") + user +
                             "\": " + setpriv_path +
                             " is missing; install util-linux (Debian and Ubuntu ship it)");
  }
  return {setpriv_path,
          "--reuid=" + std::to_string(found->uid),
          "--regid=" + std::to_string(found->gid),
          "--init-groups",
          "--"};
}

}  // namespace rmmd::tools
