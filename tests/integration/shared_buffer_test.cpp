// Named shared buffers between real processes on the host pool of a real
// daemon: a producer writes and publishes, consumers open and check every
// byte, processes exit or are killed, and the ledger comes back to where it
// was. The same scenarios on device memory are in tests/gpu/shared_buffer_test.cpp.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/test_users.hpp"

#include <rmmd/shared_buffer.hpp>

#include <absl/strings/str_replace.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr std::size_t bytes = std::size_t{4} << 20;

/// What a refused or finished call must leave as it found: the pool's figures
/// and the buffers the daemon lists.
struct ledger {
  std::uint64_t in_use{};
  std::uint64_t shared_buffers{};
  std::uint64_t shared_bytes{};
  std::uint64_t shared_holders{};
  friend bool operator==(ledger const&, ledger const&) = default;
};

ledger ledger_of(v1::Stats const& stats)
{
  auto const& p = stats.pools(0);
  return {p.in_use_bytes(), p.shared_buffers(), p.shared_bytes(), p.shared_holders()};
}

std::ostream& operator<<(std::ostream& out, ledger const& l)
{
  return out << "in_use " << l.in_use << ", " << l.shared_buffers << " buffers of "
             << l.shared_bytes << " bytes, " << l.shared_holders << " holders";
}

class SharedBufferProcesses : public ::testing::Test {
 protected:
  void start(std::vector<std::string> args = {}, std::string user = {})
  {
    daemon_    = std::make_unique<daemon_process>(std::move(args), std::move(user));
    env_       = {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()};
    auto stats = daemon_->stats();
    ASSERT_EQ(stats.pools(0).pool().backend(), v1::BACKEND_HOST);
    pool_     = stats.pools(0).pool().name();
    baseline_ = ledger_of(stats);
  }
  void SetUp() override
  {
    if (!::testing::Test::IsSkipped()) { start(); }
  }

  /// rmmd_share_client MODE NAME [BYTES SEED] on the host pool.
  std::unique_ptr<child_process> client(std::vector<std::string> args, std::string user = {})
  {
    std::vector<std::string> argv{program_path("rmmd_share_client").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--pool", pool_});
    return std::make_unique<child_process>(argv, env_, spawn_options{.user = std::move(user)});
  }

  /// The producer's lines up to "published" (or "created" with --no-publish).
  static void expect_lines(child_process& p, std::vector<std::string> const& prefixes)
  {
    for (auto const& prefix : prefixes) {
      auto line = p.read_line();
      ASSERT_TRUE(line) << "the client exited before saying " << prefix;
      ASSERT_THAT(*line, StartsWith(prefix));
    }
  }

  ledger now() const
  {
    return ledger_of(daemon_->stats());
  }
  bool back_to_baseline() const
  {
    return eventually([&] { return now() == baseline_; });
  }

  std::unique_ptr<daemon_process> daemon_;
  std::vector<std::string> env_;
  std::string pool_;
  ledger baseline_;
};

TEST_F(SharedBufferProcesses, EightConsumersReadWhatTheProducerWroteAndTheLastOneGivesItBack)
{
  auto producer = client({"produce", "batch/0", std::to_string(bytes), "11"});
  expect_lines(*producer, {"created", "published"});
  std::vector<std::unique_ptr<child_process>> consumers;
  for (int i = 0; i < 8; ++i) {
    consumers.push_back(client({"consume", "batch/0", std::to_string(bytes), "11"}));
  }
  for (auto& c : consumers) { expect_lines(*c, {"verified " + std::to_string(bytes)}); }
  auto held = now();
  EXPECT_EQ(held.shared_buffers, 1u);
  EXPECT_EQ(held.shared_bytes, bytes);
  EXPECT_EQ(held.shared_holders, 9u);
  EXPECT_EQ(held.in_use, baseline_.in_use + bytes);

  // The producer exits: the consumers still hold, and read, every byte.
  producer->close_stdin();
  EXPECT_EQ(producer->wait(), 0);
  EXPECT_TRUE(eventually([&] { return now().shared_holders == 8; })) << now();
  for (std::size_t i = 0; i < consumers.size(); ++i) {
    consumers[i]->close_stdin();
    EXPECT_EQ(consumers[i]->read_line(), "intact");
    EXPECT_EQ(consumers[i]->wait(), 0);
    if (i + 1 < consumers.size()) {
      EXPECT_TRUE(eventually([&] { return now().shared_holders == 8 - i - 1; })) << now();
      EXPECT_EQ(now().shared_buffers, 1u);
    }
  }
  EXPECT_TRUE(back_to_baseline()) << now() << " against " << baseline_;
}

TEST_F(SharedBufferProcesses, APersistentBufferOutlivesEveryProcessAndANewOneReopensIt)
{
  auto producer = client({"produce", "model/w", std::to_string(bytes), "21", "--persistent"});
  expect_lines(*producer, {"created", "published"});
  producer->close_stdin();
  EXPECT_EQ(producer->wait(), 0);
  auto consumer = client({"consume", "model/w", std::to_string(bytes), "21"});
  expect_lines(*consumer, {"verified"});
  consumer->close_stdin();
  EXPECT_EQ(consumer->read_line(), "intact");
  EXPECT_EQ(consumer->wait(), 0);
  // Nobody holds it, and it stays.
  EXPECT_TRUE(eventually([&] { return now().shared_holders == 0; }));
  EXPECT_EQ(now().shared_buffers, 1u);

  auto restarted = client({"consume", "model/w", std::to_string(bytes), "21"});
  expect_lines(*restarted, {"verified"});
  restarted->close_stdin();
  EXPECT_EQ(restarted->wait(), 0);

  auto s = daemon_->open_session();
  EXPECT_EQ(shared_buffer::remove(s, "model/w"), 0u);
  EXPECT_TRUE(back_to_baseline()) << now();
}

TEST_F(SharedBufferProcesses, ACreatorKilledBeforePublishingLeavesNothing)
{
  auto producer = client({"produce", "half/done", std::to_string(bytes), "31", "--no-publish"});
  expect_lines(*producer, {"created"});
  EXPECT_EQ(now().shared_buffers, 1u);
  auto early = client({"try-open", "half/done"});
  EXPECT_THAT(early->read_line().value_or(""), HasSubstr("not published yet"));
  EXPECT_EQ(early->wait(), 2);

  producer->kill(SIGKILL);
  producer->wait();
  EXPECT_TRUE(back_to_baseline()) << now();
  auto gone = client({"try-open", "half/done"});
  EXPECT_THAT(gone->read_line().value_or(""), StartsWith("error not_found"));
  EXPECT_EQ(gone->wait(), 2);
}

TEST_F(SharedBufferProcesses, AConsumerKilledDropsItsHold)
{
  auto producer = client({"produce", "kv/1", std::to_string(bytes), "41"});
  expect_lines(*producer, {"created", "published"});
  auto victim   = client({"consume", "kv/1", std::to_string(bytes), "41"});
  auto survivor = client({"consume", "kv/1", std::to_string(bytes), "41"});
  expect_lines(*victim, {"verified"});
  expect_lines(*survivor, {"verified"});
  EXPECT_EQ(now().shared_holders, 3u);
  victim->kill(SIGKILL);
  victim->wait();
  EXPECT_TRUE(eventually([&] { return now().shared_holders == 2; })) << now();
  producer->close_stdin();
  EXPECT_EQ(producer->wait(), 0);
  survivor->close_stdin();
  EXPECT_EQ(survivor->read_line(), "intact");
  EXPECT_EQ(survivor->wait(), 0);
  EXPECT_TRUE(back_to_baseline()) << now();
}

TEST_F(SharedBufferProcesses, DeleteWithHoldersFreesTheNameNowAndTheMemoryAfterTheLastHolder)
{
  auto producer = client({"produce", "kv/2", std::to_string(bytes), "51"});
  expect_lines(*producer, {"created", "published"});
  auto consumer = client({"consume", "kv/2", std::to_string(bytes), "51"});
  expect_lines(*consumer, {"verified"});

  auto s = daemon_->open_session();
  EXPECT_EQ(shared_buffer::remove(s, "kv/2"), 2u);
  EXPECT_THROW(static_cast<void>(shared_buffer::open(s, "kv/2")), rmmd::not_found_error);
  // The name is free; the old memory is still held and readable.
  auto successor = shared_buffer::create(s, "kv/2", 4096, {.pool = pool_});
  EXPECT_EQ(now().shared_buffers, 2u);
  producer->close_stdin();
  EXPECT_EQ(producer->wait(), 0);
  consumer->close_stdin();
  EXPECT_EQ(consumer->read_line(), "intact");
  EXPECT_EQ(consumer->wait(), 0);
  EXPECT_TRUE(eventually([&] { return now().shared_buffers == 1; })) << now();
  successor.close();
  EXPECT_TRUE(back_to_baseline()) << now();
}

TEST_F(SharedBufferProcesses, TwoUidsAndAGroup)
{
  auto daemon_account = ensure_user(daemon_user, daemon_group);
  if (!daemon_account) { GTEST_SKIP() << users_need_root(); }
  auto a = ensure_user(client_user_a, daemon_group);
  auto b = ensure_user(client_user_b, daemon_group);
  ASSERT_TRUE(a && b);
  for (auto const& [user, program] : {std::pair{*daemon_account, std::string("rmmd")},
                                      std::pair{*a, std::string("rmmd_share_client")},
                                      std::pair{*b, std::string("rmmd_share_client")}}) {
    if (auto why = unreachable_for(user, program_path(program)); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
  // As deployed: the daemon as rmmd, clients as other users of its group.
  daemon_.reset();
  start({"--allow-uid", "0", "--allow-gid", std::to_string(daemon_account->gid)}, daemon_user);

  auto own = client({"produce", "a/private", "65536", "61"}, client_user_a);
  expect_lines(*own, {"created", "published"});
  // Another uid learns nothing of a private buffer: its open is answered
  // word for word as that of a name no buffer has.
  for (auto transport : {"--socket", "--grpc"}) {
    auto denied  = client({"try-open", "a/private", transport}, client_user_b);
    auto missing = client({"try-open", "a/missing", transport}, client_user_b);
    auto line    = denied->read_line().value_or("");
    auto nothing = missing->read_line().value_or("");
    EXPECT_THAT(line, StartsWith("error not_found")) << transport;
    EXPECT_THAT(line, Not(HasSubstr(std::to_string(a->uid))));
    EXPECT_EQ(absl::StrReplaceAll(line, {{"a/private", "NAME"}}),
              absl::StrReplaceAll(nothing, {{"a/missing", "NAME"}}));
    denied->wait();
    missing->wait();
  }
  auto same_uid = client({"consume", "a/private", "65536", "61"}, client_user_a);
  expect_lines(*same_uid, {"verified"});
  same_uid->close_stdin();
  EXPECT_EQ(same_uid->wait(), 0);

  auto grouped =
      client({"produce", "a/team", "65536", "62", "--gid", std::to_string(daemon_account->gid)},
             client_user_a);
  expect_lines(*grouped, {"created", "published"});
  auto member = client({"consume", "a/team", "65536", "62"}, client_user_b);
  expect_lines(*member, {"verified"});
  member->close_stdin();
  EXPECT_EQ(member->wait(), 0);

  // Only the creator's uid (and root) may delete.
  auto as_b = client({"try-open", "a/team"}, client_user_b);
  expect_lines(*as_b, {"opened"});
  auto root = daemon_->open_session();
  EXPECT_EQ(shared_buffer::remove(root, "a/private"), 1u);
  as_b->close_stdin();
  EXPECT_EQ(as_b->wait(), 0);
  own->close_stdin();
  grouped->close_stdin();
  EXPECT_EQ(own->wait(), 0);
  EXPECT_EQ(grouped->wait(), 0);
  EXPECT_TRUE(back_to_baseline()) << now();
}

/// Every refusal, over each transport that carries the call, with the
/// exception the table gives and the ledger untouched.
class SharedBufferErrors : public SharedBufferProcesses,
                           public ::testing::WithParamInterface<call_transport> {};

TEST_P(SharedBufferErrors, EachRefusalIsPreciseAndChangesNothing)
{
  auto creator          = daemon_->open_session("creator", GetParam());
  auto other            = daemon_->open_session("other", GetParam());
  auto made             = shared_buffer::create(creator, "taken", 65536, {.pool = pool_});
  auto before           = now();
  auto expect_unchanged = [&](char const* call) { EXPECT_EQ(now(), before) << call; };

  EXPECT_THROW(static_cast<void>(shared_buffer::create(other, "taken", 4096, {.pool = pool_})),
               rmmd::already_exists_error);
  expect_unchanged("create, name taken");
  EXPECT_THROW(static_cast<void>(shared_buffer::create(other, "a//b", 4096, {.pool = pool_})),
               rmmd::logic_error);
  expect_unchanged("create, bad name");
  EXPECT_THROW(
      static_cast<void>(shared_buffer::create(other, "big", std::size_t{1} << 40, {.pool = pool_})),
      rmm::out_of_memory);
  expect_unchanged("create, larger than the pool");
  EXPECT_THROW(
      static_cast<void>(shared_buffer::create(other, "odd", 4096, {.pool = pool_, .alignment = 3})),
      rmmd::logic_error);
  expect_unchanged("create, bad alignment");
  EXPECT_THROW(static_cast<void>(shared_buffer::open(other, "nothing")), rmmd::not_found_error);
  expect_unchanged("open, unknown name");
  try {
    static_cast<void>(shared_buffer::open(other, "taken"));
    ADD_FAILURE() << "an unpublished buffer was opened by another session";
  } catch (rmmd::not_found_error const&) {
    ADD_FAILURE() << "unpublished reads as NOT_FOUND, not FAILED_PRECONDITION";
  } catch (rmmd::logic_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("not published yet"));
  }
  expect_unchanged("open, unpublished");
  auto const start = std::chrono::steady_clock::now();
  EXPECT_THROW(static_cast<void>(shared_buffer::open(other, "taken", 100ms)), rmmd::logic_error);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);
  expect_unchanged("open, unpublished, after a wait");

  made.publish();
  before = now();
  EXPECT_THROW(made.publish(), rmmd::logic_error);  // twice
  expect_unchanged("publish twice");
  auto opened = shared_buffer::open(other, "taken");
  EXPECT_THROW(opened.publish(), rmmd::logic_error);  // not the creator
  EXPECT_EQ(now().shared_holders, 2u);
  EXPECT_THROW(static_cast<void>(shared_buffer::remove(other, "/x")), rmmd::logic_error);
  EXPECT_THROW(static_cast<void>(shared_buffer::remove(other, "nothing")), rmmd::not_found_error);
}

// What the client library checks before it asks, the daemon checks too: the
// raw requests, past the library's checks, over each transport.
TEST_P(SharedBufferErrors, TheDaemonRefusesWhatTheLibraryWouldNotHaveSent)
{
  daemon_.reset();
  start({"--uid-quota-bytes", "1MiB"});
  auto s       = daemon_->open_session("raw", GetParam());
  auto before  = now();
  auto request = [&](std::string name, std::uint64_t size) {
    v1::CreateBufferRequest r;
    r.set_name(std::move(name));
    r.set_pool_id(0);
    r.set_size(size);
    v1::BufferGrant grant;
    return rmmd::detail::impl_of(s).create_buffer(r, &grant);
  };
  for (auto const& [name, size, code] :
       std::vector<std::tuple<std::string, std::uint64_t, grpc::StatusCode>>{
           {"../up", 4096, grpc::StatusCode::INVALID_ARGUMENT},
           {std::string(256, 'x'), 4096, grpc::StatusCode::INVALID_ARGUMENT},
           {"zero", 0, grpc::StatusCode::INVALID_ARGUMENT},
           {"over/quota", 2 << 20, grpc::StatusCode::RESOURCE_EXHAUSTED},
           {"over/pool", std::uint64_t{1} << 50, grpc::StatusCode::RESOURCE_EXHAUSTED}}) {
    auto status = request(name, size);
    EXPECT_EQ(status.error_code(), code) << name << ": " << status.error_message();
    EXPECT_EQ(now(), before) << name;
  }
  v1::BufferGrant grant;
  EXPECT_EQ(rmmd::detail::impl_of(s).open_buffer("a//b", 0ms, &grant).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(rmmd::detail::impl_of(s).publish_buffer(12345).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(rmmd::detail::impl_of(s).close_buffer(12345).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(now(), before);
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         SharedBufferErrors,
                         ::testing::Values(call_transport::session_socket, call_transport::grpc),
                         [](auto const& info) {
                           return info.param == call_transport::grpc ? "Grpc" : "SessionSocket";
                         });

TEST_F(SharedBufferProcesses, AWaitingOpenReturnsAtThePublication)
{
  auto consumer = client({"consume", "late", std::to_string(bytes), "71", "--wait-ms", "30000"});
  auto producer = client({"produce", "late", std::to_string(bytes), "71"});
  expect_lines(*producer, {"created", "published"});
  expect_lines(*consumer, {"verified"});
  consumer->close_stdin();
  producer->close_stdin();
  EXPECT_EQ(consumer->wait(), 0);
  EXPECT_EQ(producer->wait(), 0);
  EXPECT_TRUE(back_to_baseline()) << now();
}

}  // namespace
}  // namespace rmmd::test
