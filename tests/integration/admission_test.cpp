// Fair admission on the session socket: connections that have not said hello
// and open sessions are limited per uid and in all, so that one user holding
// silent connections or many sessions cannot get everyone else refused. The
// real daemon runs as `rmmd`, its clients as two users of group `rmmd` (as
// the shipped unit runs them); the tests skip without root.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/integration/logged_daemon.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/test_users.hpp"

#include <rmmd/error.hpp>

#include <httplib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

/// RESOURCE_EXHAUSTED, as the welcome's ErrorInfo carries it.
constexpr char const* refused_exhausted = "refused 8 ";

class Admission : public ::testing::Test {
 protected:
  void SetUp() override
  {
    daemon_account_ = ensure_user(daemon_user, daemon_group);
    if (!daemon_account_) { GTEST_SKIP() << users_need_root(); }
    a_ = ensure_user(client_user_a, daemon_group);
    b_ = ensure_user(client_user_b, daemon_group);
    ASSERT_TRUE(a_ && b_);
    for (auto const& [user, program] :
         {std::pair{*daemon_account_, "rmmd"}, std::pair{*a_, "rmmd_session_opener"}}) {
      if (auto why = unreachable_for(user, program_path(program)); !why.empty()) {
        GTEST_SKIP() << why;
      }
    }
    ::signal(SIGPIPE, SIG_IGN);  // child_process::write_line's requirement
  }

  /// Starts rmmd as `rmmd` with the admission flags `limits`. Root may open a
  /// session too (the observer, which finds the metrics endpoint); hellos
  /// never time out here, so only the tests close connections.
  void start(std::vector<std::string> limits)
  {
    limits.insert(limits.end(),
                  {"--hello-timeout-ms",
                   "600000",
                   "--host-pool-bytes",
                   "16MiB",
                   "--metrics-address",
                   "127.0.0.1:0",
                   "--allow-uid",
                   "0",
                   "--allow-gid",
                   std::to_string(daemon_account_->gid)});
    daemon_   = std::make_unique<daemon_process>(std::move(limits), daemon_user);
    observer_ = std::make_unique<rmmd::session>(daemon_->open_session("observer"));
  }

  /// rmmd_session_opener as `user`.
  std::unique_ptr<child_process> opener(char const* user) const
  {
    return std::make_unique<child_process>(
        std::vector<std::string>{program_path("rmmd_session_opener").string(),
                                 daemon_->runtime_dir().string()},
        std::vector<std::string>{},
        spawn_options{.user = user});
  }

  /// Sends one command to an opener and returns its answer.
  static std::string ask(child_process& opener, std::string const& command)
  {
    opener.write_line(command);
    return opener.read_line().value_or("(no answer: the opener exited)");
  }

  /// The value of one series (name and labels as written) in a scrape.
  std::optional<double> metric(std::string const& series) const
  {
    v1::HealthResponse health;
    auto ctx    = rmmd::detail::impl_of(*observer_).context();
    auto status = rmmd::detail::impl_of(*observer_).stub().Health(ctx.get(), {}, &health);
    EXPECT_TRUE(status.ok()) << status.error_message();
    auto const address = health.metrics_address();
    auto const colon   = address.rfind(':');
    httplib::Client client(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
    client.set_connection_timeout(std::chrono::seconds(10));
    client.set_read_timeout(std::chrono::seconds(10));
    auto r = client.Get("/metrics");
    if (!r || r->status != 200) { return std::nullopt; }
    std::istringstream in(r->body);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(series + " ", 0) == 0) { return std::stod(line.substr(series.size() + 1)); }
    }
    return std::nullopt;
  }

  /// Waits until the daemon counts `n` connections that have not said hello.
  bool pending_becomes(double n) const
  {
    return eventually([&] { return metric("rmmd_session_socket_pending_connections") == n; });
  }

  /// Sessions the daemon's core has open, per the observer.
  int sessions_of(uid_t uid) const
  {
    int n            = 0;
    auto const stats = stats_of(*observer_);
    for (auto const& s : stats.sessions()) { n += s.uid() == uid ? 1 : 0; }
    return n;
  }

  std::optional<system_user> daemon_account_, a_, b_;
  std::unique_ptr<daemon_process> daemon_;
  std::unique_ptr<rmmd::session> observer_;
};

TEST_F(Admission, ASecondUidIsServedWhileTheFirstHoldsAllItsSilentConnections)
{
  start({"--max-pending-per-uid", "3", "--max-pending-total", "5"});
  auto a = opener(client_user_a);
  auto b = opener(client_user_b);

  // A holds as many silent connections as one uid may; one more is refused.
  ASSERT_EQ(ask(*a, "silent 3"), "silent 3");
  ASSERT_TRUE(pending_becomes(3));
  EXPECT_THAT(
      ask(*a, "refused-silent"),
      AllOf(StartsWith(refused_exhausted),
            HasSubstr("uid " + std::to_string(a_->uid) +
                      " already has 3 connection(s) that have not sent their hello"),
            HasSubstr("the most one uid may have (admission.max_pending_per_uid in rmmd.conf, "
                      "--max-pending-per-uid)"),
            HasSubstr("send the SessionHello as soon as the connection is open")));

  // B is served meanwhile, and may wait silently too, up to the total.
  EXPECT_THAT(ask(*b, "hello"), StartsWith("welcome "));
  ASSERT_EQ(ask(*b, "silent 2"), "silent 2");
  ASSERT_TRUE(pending_becomes(5));
  EXPECT_THAT(ask(*b, "refused-silent"),
              AllOf(StartsWith(refused_exhausted),
                    HasSubstr("the daemon already has 5 connection(s) that have not sent their "
                              "hello, the most it takes from all users together "
                              "(admission.max_pending_total in rmmd.conf, --max-pending-total)")));

  // Closing a silent connection frees its slot: A may wait again.
  ASSERT_EQ(ask(*a, "close-silent 1"), "closed 1");
  ASSERT_TRUE(pending_becomes(4));
  ASSERT_EQ(ask(*a, "silent 1"), "silent 3");
  EXPECT_TRUE(pending_becomes(5)) << "A's new silent connection was not taken";

  // The refusals changed nothing: B has its one session, A none.
  EXPECT_EQ(sessions_of(a_->uid), 0);
  EXPECT_EQ(sessions_of(b_->uid), 1);
  EXPECT_EQ(metric("rmmd_admission_refusals_total{limit=\"max_pending_per_uid\"}"), 1);
  EXPECT_EQ(metric("rmmd_admission_refusals_total{limit=\"max_pending_total\"}"), 1);
  EXPECT_EQ(metric("rmmd_admission_refusals_total{limit=\"max_sessions_per_uid\"}"), 0);
  EXPECT_TRUE(daemon_->alive());
}

TEST_F(Admission, ASecondUidOpensSessionsWhileTheFirstIsAtItsSessionLimit)
{
  start({"--max-sessions-per-uid", "2", "--max-sessions-total", "4"});
  auto a = opener(client_user_a);
  auto b = opener(client_user_b);

  ASSERT_THAT(ask(*a, "hello"), StartsWith("welcome "));
  ASSERT_THAT(ask(*a, "hello"), StartsWith("welcome "));
  EXPECT_THAT(ask(*a, "hello"),
              AllOf(StartsWith(refused_exhausted),
                    HasSubstr("uid " + std::to_string(a_->uid) +
                              " already has 2 open session(s), the most one uid may have "
                              "(admission.max_sessions_per_uid in rmmd.conf, "
                              "--max-sessions-per-uid)"),
                    HasSubstr("close sessions this user no longer needs")));
  EXPECT_EQ(sessions_of(a_->uid), 2) << "the refused hello opened a session";

  // B is served while A is at its limit; then the daemon is full (the
  // observer's session counts too).
  ASSERT_THAT(ask(*b, "hello"), StartsWith("welcome "));
  EXPECT_THAT(ask(*b, "hello"),
              AllOf(StartsWith(refused_exhausted),
                    HasSubstr("the daemon already serves 4 session(s), the most it takes from all "
                              "users together (admission.max_sessions_total in rmmd.conf, "
                              "--max-sessions-total)")));
  EXPECT_EQ(sessions_of(b_->uid), 1);

  // A session that ends frees its slot (the daemon frees it before its stats
  // stop showing the session).
  ASSERT_EQ(ask(*a, "close-sessions 1"), "closed 1");
  ASSERT_TRUE(eventually([&] { return sessions_of(a_->uid) == 1; }));
  EXPECT_THAT(ask(*a, "hello"), StartsWith("welcome "));
  EXPECT_EQ(sessions_of(a_->uid), 2);

  EXPECT_EQ(metric("rmmd_admission_refusals_total{limit=\"max_sessions_per_uid\"}"), 1);
  EXPECT_EQ(metric("rmmd_admission_refusals_total{limit=\"max_sessions_total\"}"), 1);
  EXPECT_EQ(metric("rmmd_admission_refusals_total{limit=\"max_pending_per_uid\"}"), 0);
}

// Reload applies new limits as it does quotas: to the next hello, leaving
// what is open alone. One uid (this process's) is enough here.
TEST(AdmissionReload, NewLimitsApplyToTheNextHelloAndOpenSessionsStay)
{
  scratch_dir dir;
  auto const conf = dir.write("rmmd.conf", "admission { max_sessions_per_uid: 2 }\n");
  logged_daemon daemon({"--config", conf.string(), "--host-pool-bytes", "16MiB"});
  auto first  = daemon.open_session("first");
  auto second = daemon.open_session("second");
  try {
    auto third = daemon.open_session("third");
    FAIL() << "a third session opened past max_sessions_per_uid 2";
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("already has 2 open session(s)")) << e.what();
  }

  // Lowered below what is open: both sessions carry on.
  dir.write("rmmd.conf", "admission { max_sessions_per_uid: 1 }\n");
  daemon.process().kill(SIGHUP);
  ASSERT_TRUE(daemon.wait_log("applied admission.max_sessions_per_uid=1"));
  EXPECT_EQ(stats_of(second).sessions_size(), 2);

  // Raised: the next hello is welcome.
  dir.write("rmmd.conf", "admission { max_sessions_per_uid: 3 }\n");
  daemon.process().kill(SIGHUP);
  ASSERT_TRUE(daemon.wait_log("applied admission.max_sessions_per_uid=3"));
  auto third = daemon.open_session("third");
  EXPECT_EQ(stats_of(third).sessions_size(), 3);
}

}  // namespace
}  // namespace rmmd::test
