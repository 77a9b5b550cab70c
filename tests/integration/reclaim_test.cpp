// A client killed with SIGKILL loses its session; the daemon frees all it held.

#include "tests/tools/daemon_process.hpp"

#include <gtest/gtest.h>

#include <signal.h>

namespace rmmd::test {
namespace {

TEST(Reclaim, SigkilledClientsLeasesAreFreed)
{
  daemon_process daemon;
  auto const before = in_use(daemon.stats());
  child_process holder({program_path("rmmd_test_client").string(), "hold", "65536", "7", "3"},
                       {"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()});
  while (auto line = holder.read_line()) {
    if (*line == "ready") { break; }
  }
  auto held = daemon.stats();
  ASSERT_EQ(in_use(held), before + 3 * 65536);
  ASSERT_EQ(held.sessions_size(), 2);  // the holder and our observer

  holder.kill(SIGKILL);
  ASSERT_EQ(holder.wait(), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] {
    auto s = daemon.stats();
    return in_use(s) == before && s.sessions_size() == 1;
  })) << daemon.stats().DebugString();
  auto after = daemon.stats();
  EXPECT_EQ(after.pools(0).allocation_count(), 0u);
  EXPECT_EQ(after.pools(0).high_water_bytes(), before + 3 * 65536);  // history stays
}

TEST(Reclaim, ClosingTheSessionFreesWhatItHeld)
{
  daemon_process daemon;
  {
    auto s = daemon.open_session("short-lived");
    (void)s.allocate(s.host_pool().id, 4096, 0);
    (void)s.allocate(s.host_pool().id, 8192, 0);
    EXPECT_EQ(in_use(daemon.stats()), 4096u + 8192u);
  }
  EXPECT_TRUE(eventually([&] { return in_use(daemon.stats()) == 0; }));
}

}  // namespace
}  // namespace rmmd::test
