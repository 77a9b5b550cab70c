#include "common/system_user.hpp"

#include <grp.h>
#include <pwd.h>

#include <cerrno>
#include <utility>

namespace rmmd::common {
namespace {

/// Calls a get*nam_r function with a buffer that grows until the entry fits,
/// and returns `take(entry)` while the buffer its strings point into lives.
template <typename Entry, typename Lookup, typename Take>
auto lookup(std::string const& name, Lookup lookup_r, Take take)
    -> std::optional<decltype(take(std::declval<Entry const&>()))>
{
  std::vector<char> buffer(16384);
  while (true) {
    Entry entry{};
    Entry* found = nullptr;
    int const rc = lookup_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
    if (rc == ERANGE) {
      buffer.resize(buffer.size() * 2);
      continue;
    }
    if (rc != 0 || found == nullptr) { return std::nullopt; }
    return take(entry);
  }
}

}  // namespace

std::optional<system_user> find_user(std::string const& name)
{
  return lookup<passwd>(name, ::getpwnam_r, [](passwd const& entry) {
    return system_user{.name = entry.pw_name, .uid = entry.pw_uid, .gid = entry.pw_gid};
  });
}

std::optional<gid_t> find_group(std::string const& name)
{
  return lookup<group>(name, ::getgrnam_r, [](group const& entry) { return entry.gr_gid; });
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

}  // namespace rmmd::common
