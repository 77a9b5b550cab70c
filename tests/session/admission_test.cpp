// Fair admission's counting: per uid and in all, for connections that have
// not said hello and for sessions; refusals count nothing and name the limit.

#include "daemon/session/admission.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace rmmd::session_socket {
namespace {

using metrics::admission_limit;
using ::testing::HasSubstr;

constexpr core::admission_limits small{.max_pending_per_uid  = 2,
                                       .max_pending_total    = 3,
                                       .max_sessions_per_uid = 2,
                                       .max_sessions_total   = 3};

std::uint64_t refusals(metrics::admission_metrics const& m, admission_limit l)
{
  return m.snapshot().refusals[static_cast<std::size_t>(l)];
}

TEST(Admission, PendingIsLimitedPerUidThenInAll)
{
  metrics::admission_metrics m;
  admission a(small, &m);
  EXPECT_TRUE(a.admit_pending(1000).ok());
  EXPECT_TRUE(a.admit_pending(1000).ok());
  auto refused = a.admit_pending(1000);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("uid 1000 already has 2 connection(s)"));
  EXPECT_THAT(refused.message(), HasSubstr("admission.max_pending_per_uid"));
  EXPECT_EQ(a.pending(), 2u) << "a refusal counted";

  EXPECT_TRUE(a.admit_pending(1001).ok());  // another uid is served
  refused = a.admit_pending(1002);          // but the total is reached
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("admission.max_pending_total"));
  EXPECT_EQ(refusals(m, admission_limit::max_pending_per_uid), 1u);
  EXPECT_EQ(refusals(m, admission_limit::max_pending_total), 1u);
  EXPECT_EQ(m.snapshot().pending_connections, 3u);

  a.end_pending(1000);
  EXPECT_TRUE(a.admit_pending(1000).ok()) << "an ended connection frees its slot";
  EXPECT_EQ(m.snapshot().pending_connections, 3u);
}

TEST(Admission, SessionsAreLimitedPerUidThenInAllAndEndingFreesTheSlot)
{
  admission a(small);
  EXPECT_TRUE(a.admit_session(7).ok());
  EXPECT_TRUE(a.admit_session(7).ok());
  auto refused = a.admit_session(7);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("uid 7 already has 2 open session(s)"));
  EXPECT_THAT(refused.message(), HasSubstr("--max-sessions-per-uid"));
  EXPECT_TRUE(a.admit_session(8).ok());
  EXPECT_THAT(a.admit_session(9).message(), HasSubstr("already serves 3 session(s)"));
  EXPECT_EQ(a.sessions(), 3u);
  a.end_session(7);
  EXPECT_TRUE(a.admit_session(9).ok());
  EXPECT_EQ(a.sessions(), 3u);
}

TEST(Admission, NewLimitsApplyToTheNextAdmissionAndWhatIsOpenStays)
{
  admission a(small);
  EXPECT_TRUE(a.admit_session(7).ok());
  EXPECT_TRUE(a.admit_session(7).ok());
  a.set_limits(core::admission_limits{.max_pending_per_uid  = 2,
                                      .max_pending_total    = 3,
                                      .max_sessions_per_uid = 1,
                                      .max_sessions_total   = 3});
  EXPECT_EQ(a.sessions(), 2u);
  EXPECT_FALSE(a.admit_session(7).ok());
  a.end_session(7);
  EXPECT_FALSE(a.admit_session(7).ok()) << "still at the lowered limit";
  a.end_session(7);
  EXPECT_TRUE(a.admit_session(7).ok());
}

TEST(Admission, AnEndWithoutAnAdmissionChangesNothing)
{
  admission a(small);
  a.end_pending(5);
  a.end_session(5);
  EXPECT_EQ(a.pending(), 0u);
  EXPECT_EQ(a.sessions(), 0u);
  EXPECT_TRUE(a.admit_session(5).ok());
}

}  // namespace
}  // namespace rmmd::session_socket
