// The daemon's log: lines a client can cause go through a rate_limit (a
// burst, then a rate; what is held back is counted and reported), and no
// text can forge a line of its own.

#include "daemon/log.hpp"

#include <gtest/gtest.h>

namespace rmmd::log {
namespace {

TEST(RateLimit, LetsABurstThroughThenCountsWhatItHoldsBack)
{
  rate_limit limit("test lines", 1e-6, 3);  // no refill within the test
  std::uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(limit.take(level::warning, suppressed));
    EXPECT_EQ(suppressed, 0u);
  }
  EXPECT_FALSE(limit.take(level::info, suppressed));
  EXPECT_FALSE(limit.take(level::warning, suppressed));

  ::testing::internal::CaptureStderr();
  report_suppressed();  // every rate_limit alive, this one among them
  report_suppressed();  // reported once, then nothing is left
  auto const out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "<4>rmmd: 2 similar line(s) suppressed: test lines\n")
      << "the count, once, at the most severe level held back";
}

// (That the next line let through carries the count is seen in the
// integration test that floods the daemon with bad hellos.)
TEST(RateLimit, AnEmptyBucketHoldsEveryLineBackAndReportsHowMany)
{
  rate_limit empty("held lines", 1e-6, 0);
  std::uint64_t suppressed = 0;
  EXPECT_FALSE(empty.take(level::info, suppressed));
  ::testing::internal::CaptureStderr();
  limited(empty, level::info, "never %s", "written");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ::testing::internal::CaptureStderr();
  empty.report();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "<6>rmmd: 2 similar line(s) suppressed: held lines\n");
}

TEST(RateLimit, LinesAboveTheThresholdAreNeitherWrittenNorCounted)
{
  rate_limit limit("debug lines", 1e-6, 0);
  ::testing::internal::CaptureStderr();
  limited(limit, level::debug, "%s", "quiet");  // the threshold is info
  limit.report();
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(WriteLine, ControlCharactersCannotForgeALine)
{
  ::testing::internal::CaptureStderr();
  info("session opened (%s)", "name\n<3>rmmd: forged\x1b[31m");
  auto const out = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "<6>rmmd: session opened (name\\n<3>rmmd: forged\\x1b[31m)\n");
}

}  // namespace
}  // namespace rmmd::log
