#include "tests/tools/test_users.hpp"

#include "tests/tools/child_process.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <absl/strings/str_format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace rmmd::test {
namespace {

bool member_of(system_user const& user, gid_t gid)
{
  auto groups = common::groups_of(user);
  return std::find(groups.begin(), groups.end(), gid) != groups.end();
}

/// Runs one of the shadow tools; what it printed if it failed, else empty.
std::string run_tool(std::vector<std::string> argv)
{
  auto const command = argv.front();
  child_process tool(std::move(argv), {}, spawn_options{.merge_stderr = true});
  tool.close_stdin();
  auto out    = tool.read_all(30s);
  auto status = tool.wait(30s);
  if (status == 0) { return {}; }
  return absl::StrFormat("%s exited with %d: %s", command, status.value_or(-1), out);
}

}  // namespace

std::string users_need_root()
{
  return absl::StrFormat(
      "needs root to create the test users (%s, %s, %s, %s) and start processes as them; this "
      "process runs as uid %d (CI runs as root)",
      daemon_user,
      client_user_a,
      client_user_b,
      outsider_user,
      ::geteuid());
}

std::optional<system_user> ensure_user(std::string const& name, std::string const& group)
{
  if (::geteuid() != 0) { return std::nullopt; }
  // Other test processes may create the same users at once: each step checks
  // the state first, and a tool that fails (the other process holds the lock,
  // or got there first) is tried again until the state is right or the time
  // is up.
  std::string last_failure;
  std::optional<system_user> user;
  bool done = eventually(
      [&] {
        std::optional<gid_t> gid;
        if (!group.empty()) {
          gid = common::find_group(group);
          if (!gid) {
            last_failure = run_tool({"/usr/sbin/groupadd", "--system", group});
            return false;
          }
        }
        user = common::find_user(name);
        if (!user) {
          std::vector<std::string> argv{
              "/usr/sbin/useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"};
          if (auto own = common::find_group(name)) {
            argv.insert(argv.end(), {"--gid", std::to_string(*own)});
          } else {
            argv.emplace_back("--user-group");
          }
          if (gid && group != name) { argv.insert(argv.end(), {"--groups", group}); }
          argv.push_back(name);
          last_failure = run_tool(std::move(argv));
          return false;
        }
        if (gid && !member_of(*user, *gid)) {
          last_failure = run_tool({"/usr/sbin/usermod", "--append", "--groups", group, name});
          return false;
        }
        return true;
      },
      30s);
  if (!done) {
    throw std::runtime_error(absl::StrFormat(
        "cannot make test user \"%s\"%s: %s",
        name,
        group.empty() ? std::string() : absl::StrFormat(" (member of group \"%s\")", group),
        last_failure.empty() ? std::string("no tool reported an error") : last_failure));
  }
  return user;
}

std::string unreachable_for(system_user const& user, std::filesystem::path const& program)
{
  auto const groups = common::groups_of(user);
  // The permission bit (of 07: r=4, w=2, x=1) that applies to `user` for `st`.
  auto allows = [&](struct stat const& st, mode_t bit) {
    if (st.st_uid == user.uid) { return (st.st_mode & (bit << 6)) != 0; }
    if (std::find(groups.begin(), groups.end(), st.st_gid) != groups.end()) {
      return (st.st_mode & (bit << 3)) != 0;
    }
    return (st.st_mode & bit) != 0;
  };
  auto const absolute      = std::filesystem::absolute(program);
  std::filesystem::path at = absolute.root_path();
  for (auto it = absolute.begin(); it != absolute.end(); ++it) {
    if (it != absolute.begin()) { at /= *it; }
    struct stat st {};
    if (::stat(at.c_str(), &st) != 0) {
      return absl::StrFormat("%s: %s", at.string(), std::strerror(errno));
    }
    bool const is_program = at == absolute;
    if (!allows(st, 01)) {
      return absl::StrFormat(
          "user %s (uid %d) cannot %s %s (mode %04o, owner uid %d gid %d), so it cannot run "
          "%s; give others x on it (chmod o+x) or build in a directory every user can reach",
          user.name,
          user.uid,
          is_program ? "execute" : "search the directory",
          at.string(),
          st.st_mode & 07777,
          st.st_uid,
          st.st_gid,
          absolute.string());
    }
  }
  return {};
}

}  // namespace rmmd::test
