// The test support runs the daemon and its clients as different users, as the
// shipped systemd unit does: rmmd as `rmmd`, clients as members of group
// `rmmd`. These tests check that support itself; they skip without root.

#include "tests/tools/daemon_process.hpp"
#include "tests/tools/test_users.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace rmmd::test {
namespace {

/// The real uid of `pid`, from /proc/PID/status.
uid_t real_uid_of(pid_t pid)
{
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("Uid:", 0) == 0) { return static_cast<uid_t>(std::stoul(line.substr(4))); }
  }
  return static_cast<uid_t>(-1);
}

TEST(RunAs, AChildRunsAsTheUserWithItsGroups)
{
  auto a = ensure_user(client_user_a, daemon_group);
  if (!a) { GTEST_SKIP() << users_need_root(); }
  auto group = common::groups_of(*a);

  child_process id({"/usr/bin/id", "-u", "-n"}, {}, spawn_options{.user = client_user_a});
  EXPECT_EQ(id.read_line(), client_user_a);
  EXPECT_EQ(id.wait(), 0);

  child_process groups({"/usr/bin/id", "-G"}, {}, spawn_options{.user = client_user_a});
  auto line = groups.read_line();
  ASSERT_TRUE(line);
  std::istringstream in(*line);
  std::vector<gid_t> seen;
  for (gid_t g; in >> g;) { seen.push_back(g); }
  std::sort(seen.begin(), seen.end());
  std::sort(group.begin(), group.end());
  group.erase(std::unique(group.begin(), group.end()), group.end());
  EXPECT_EQ(seen, group) << "the child's groups are not the user's primary and supplementary ones";
}

TEST(RunAs, AnUnknownUserIsRefusedSayingSo)
{
  try {
    child_process c({"/usr/bin/true"}, {}, spawn_options{.user = "rmmd-test-no-such-user"});
    FAIL() << "a child was started as a user that does not exist";
  } catch (std::runtime_error const& e) {
    EXPECT_NE(std::string(e.what()).find("no such user"), std::string::npos) << e.what();
  }
}

TEST(RunAs, DaemonAsRmmdServesItsGroupAndOnlyItsGroupReachesIt)
{
  auto daemon_account = ensure_user(daemon_user, daemon_group);
  if (!daemon_account) { GTEST_SKIP() << users_need_root(); }
  auto a        = ensure_user(client_user_a, daemon_group);
  auto outsider = ensure_user(outsider_user);
  ASSERT_TRUE(a && outsider);
  for (auto [user, program] : {std::pair{*daemon_account, std::string("rmmd")},
                               std::pair{*a, std::string("rmmd_test_client")},
                               std::pair{*outsider, std::string("rmmd_test_client")}}) {
    if (auto why = unreachable_for(user, program_path(program)); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }

  // Root may watch (the observer session of stats()); the group may use it.
  daemon_process daemon({"--allow-uid", "0", "--allow-gid", std::to_string(daemon_account->gid)},
                        daemon_user);
  EXPECT_EQ(real_uid_of(daemon.pid()), daemon_account->uid);

  std::vector<std::string> env{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  child_process holder({program_path("rmmd_test_client").string(), "hold", "4096", "7", "1"},
                       env,
                       spawn_options{.user = client_user_a});
  std::string line;
  while (auto l = holder.read_line()) {
    line = *l;
    if (line == "ready") { break; }
  }
  ASSERT_EQ(line, "ready") << "the client of group rmmd did not get its memory";
  auto stats = daemon.stats();
  bool found = false;
  for (auto const& s : stats.sessions()) {
    if (s.uid() == a->uid) {
      found = true;
      EXPECT_EQ(s.bytes(), 4096u);
    }
  }
  EXPECT_TRUE(found) << "no session of uid " << a->uid << " in the daemon's stats";
  holder.close_stdin();
  EXPECT_EQ(holder.read_line(), "freed");
  EXPECT_EQ(holder.wait(), 0);

  // Not in group rmmd: the runtime directory (0750 rmmd:rmmd) keeps it out.
  child_process stranger({program_path("rmmd_test_client").string(), "hold", "4096", "7", "1"},
                         env,
                         spawn_options{.user = outsider_user});
  stranger.close_stdin();
  auto out = stranger.read_all();
  EXPECT_EQ(stranger.wait(), 3) << out;
  EXPECT_NE(out.find("no permission to connect"), std::string::npos) << out;
}

}  // namespace
}  // namespace rmmd::test
