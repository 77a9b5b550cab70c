// A shared buffer's write lease in the core on its own (docs/failover.md):
// a grant and its generation, the line (first come, first served), the
// deadline, a waiter's session ending, the holder closing and its session
// ending, plain writers and the lease keeping apart, a delete and a drain
// ending the waits, and every refusal leaving the core as it was. The pool
// is a real host_backend (memfd).

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::size_t MiB = std::size_t{1} << 20;

constexpr uid_t alice = 1000;
constexpr uid_t bob   = 2000;

using steady = std::chrono::steady_clock;

peer_credentials peer(uid_t uid, pid_t pid)
{
  return peer_credentials{.pid = pid, .uid = uid, .gid = 100, .supplementary_gids = {}};
}

buffer_open_options exclusive()
{
  return {.access = buffer_access::read_write, .exclusive = true};
}

class WriteLease : public ::testing::Test {
 protected:
  void SetUp() override
  {
    core_options o;
    o.access.uids = {0, alice, bob};
    core_         = std::make_unique<daemon_core>(std::move(o));
    core_->pools().add_pool(pool_config{.name = "host", .handle_types = {handle_type::host_offset}},
                            std::make_unique<backends::host::host_backend>("test", 16 * MiB));
  }

  session_id open(uid_t uid = alice)
  {
    auto grant = core_->sessions().open_session(peer(uid, next_pid_++), "test", "test");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant->id;
  }

  /// A published buffer `name` of alice's that others may write, which
  /// nobody holds (`persistent`), or which its creator keeps open (else);
  /// returns the creating session.
  session_id publish(std::string const& name, bool persistent = true)
  {
    auto creator = open();
    auto made    = core_->buffers().create_buffer(
        creator, name, 0, MiB, {.persistent = persistent, .allow_writers = true});
    EXPECT_TRUE(made.ok()) << made.status();
    EXPECT_TRUE(core_->buffers().publish_buffer(creator, made->id).ok());
    if (persistent) {
      EXPECT_TRUE(core_->buffers().close_buffer(creator, made->id, hold_kind::read_write).ok());
    }
    id_ = made->id;
    return creator;
  }

  absl::StatusOr<buffer_grant> take(session_id s,
                                    std::string const& name,
                                    std::chrono::milliseconds wait = {})
  {
    return core_->buffers().open_buffer(s, name, steady::now() + wait, exclusive());
  }

  /// An exclusive open waiting (up to 20 s) on a thread of its own.
  std::future<absl::StatusOr<buffer_grant>> wait_for(session_id s, std::string const& name)
  {
    return std::async(std::launch::async, [this, s, name] { return take(s, name, 20s); });
  }

  /// Waits (up to 20 s) until `n` opens wait in the core.
  bool waiting(std::size_t n) const
  {
    auto const deadline = steady::now() + 20s;
    while (core_->buffers().waiting_opens() != n) {
      if (steady::now() > deadline) { return false; }
      std::this_thread::yield();
    }
    return true;
  }

  /// The lease of buffer `name` as rmmctl would see it.
  buffer_lease_info lease(std::string const& name = "kv/0") const
  {
    for (auto const& b : core_->buffers().all()) {
      if (b.name == name && b.lease) { return *b.lease; }
    }
    ADD_FAILURE() << "no lease of " << name;
    return {};
  }

  /// The state a refused call must leave untouched.
  std::string fingerprint() const
  {
    std::string out;
    for (auto const& b : core_->buffers().all()) {
      out += b.name + "=" + std::to_string(b.holders);
      if (b.lease) {
        out += " lease " + std::to_string(b.lease->generation) + "/" +
               std::to_string(b.lease->holder) + " waiters";
        for (auto const& w : b.lease->waiters) { out += " " + std::to_string(w.session); }
        out += " writers " + std::to_string(b.lease->plain_writers);
      }
      out += ";";
    }
    for (auto const& s : core_->pools().stats().sessions) {
      out += std::to_string(s.id) + ":" + std::to_string(s.buffers_held) + ";";
    }
    return out;
  }

  std::unique_ptr<daemon_core> core_;
  buffer_id id_{};
  pid_t next_pid_{5000};
};

TEST_F(WriteLease, TheFirstExclusiveOpenGetsItAtOnceWithGenerationOne)
{
  publish("kv/0");
  EXPECT_FALSE(core_->buffers().all()[0].lease);  // nobody asked yet: rmmctl shows none
  auto engine = open();
  auto grant  = take(engine, "kv/0");
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->lease_generation, 1u);
  EXPECT_EQ(grant->access, buffer_access::read_write);
  auto l = lease();
  EXPECT_EQ(l.generation, 1u);
  EXPECT_EQ(l.holder, engine);
  EXPECT_EQ(l.holder_uid, alice);
  EXPECT_GT(l.holder_pid, 0);
  EXPECT_TRUE(l.waiters.empty());
  EXPECT_EQ(core_->buffers().all()[0].holders, 1u);
  auto t = core_->buffers().leases();
  EXPECT_EQ(t.held, 1u);
  EXPECT_EQ(t.grants, 1u);
  EXPECT_EQ(t.waits, 0u);
}

TEST_F(WriteLease, WithoutAWaitABusyLeaseIsDeadlineExceededNamingTheHolderAndNothingChanges)
{
  publish("kv/0");
  auto engine = open();
  ASSERT_TRUE(take(engine, "kv/0").ok());
  auto standby = open();
  auto before  = fingerprint();
  auto busy    = take(standby, "kv/0");
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(busy.status().message(), HasSubstr("open buffer 'kv/0' exclusively"));
  EXPECT_THAT(busy.status().message(),
              HasSubstr("held by session " + std::to_string(engine) + " (pid"));
  EXPECT_THAT(busy.status().message(), HasSubstr("generation 1"));
  EXPECT_EQ(fingerprint(), before);
  EXPECT_EQ(core_->buffers().leases().waits, 0u);
}

TEST_F(WriteLease, WaitersAreServedFirstComeFirstServedEachWithTheNextGeneration)
{
  publish("kv/0");
  auto engine = open();
  ASSERT_TRUE(take(engine, "kv/0").ok());
  std::vector<session_id> standbys{open(), open(), open()};
  std::vector<std::future<absl::StatusOr<buffer_grant>>> waits;
  for (std::size_t i = 0; i < standbys.size(); ++i) {
    waits.push_back(wait_for(standbys[i], "kv/0"));
    ASSERT_TRUE(waiting(i + 1));  // in this order
  }
  auto l = lease();
  ASSERT_EQ(l.waiters.size(), 3u);
  for (std::size_t i = 0; i < standbys.size(); ++i) {
    EXPECT_EQ(l.waiters[i].session, standbys[i]);
  }

  // The holder closes its exclusive open: the first in line has it.
  ASSERT_TRUE(core_->buffers().close_buffer(engine, id_, hold_kind::lease).ok());
  auto first = waits[0].get();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->lease_generation, 2u);
  EXPECT_EQ(lease().holder, standbys[0]);
  EXPECT_EQ(waits[1].wait_for(0s), std::future_status::timeout);  // the others wait on

  // Its session ends: the second.
  core_->close_session(standbys[0]);
  auto second = waits[1].get();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->lease_generation, 3u);
  EXPECT_EQ(lease().holder, standbys[1]);

  // Its last open closes, whichever kind it names: the third.
  ASSERT_TRUE(core_->buffers().close_buffer(standbys[1], id_, hold_kind::read).ok());
  auto third = waits[2].get();
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->lease_generation, 4u);
  EXPECT_TRUE(lease().waiters.empty());

  auto t = core_->buffers().leases();
  EXPECT_EQ(t.grants, 4u);
  EXPECT_EQ(t.waits, 3u);
  std::uint64_t takeovers = 0;
  for (auto n : t.takeover_buckets) { takeovers += n; }
  EXPECT_EQ(takeovers, 3u);
  EXPECT_GE(t.takeover_seconds_sum, 0.0);
}

TEST_F(WriteLease, ANonPersistentBufferPassesFromTheDeadHolderToTheWaiterAndStays)
{
  auto creator = publish("scratch", false);
  auto engine  = open();
  // The creator's create is a plain write open: the lease waits for it.
  EXPECT_EQ(take(engine, "scratch").status().code(), absl::StatusCode::kDeadlineExceeded);
  // The creator keeps a read open and lets its create go: now the lease is free.
  ASSERT_TRUE(core_->buffers().open_buffer(creator, "scratch").ok());
  ASSERT_TRUE(core_->buffers().close_buffer(creator, id_, hold_kind::read_write).ok());
  ASSERT_TRUE(take(engine, "scratch").ok());
  core_->close_session(creator);
  auto standby = open();
  auto waited  = wait_for(standby, "scratch");
  ASSERT_TRUE(waiting(1));
  core_->close_session(engine);  // SIGKILL, as the daemon sees it
  auto got = waited.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->lease_generation, 2u);
  ASSERT_EQ(core_->buffers().all().size(), 1u);  // the new holder keeps it
  EXPECT_EQ(core_->buffers().all()[0].holders, 1u);
  core_->close_session(standby);
  EXPECT_TRUE(core_->buffers().all().empty());  // and its end frees it
}

TEST_F(WriteLease, AWaitThatReachesItsDeadlineIsDeadlineExceededAndLeavesNothing)
{
  publish("kv/0");
  auto engine = open();
  ASSERT_TRUE(take(engine, "kv/0").ok());
  auto standby = open();
  auto before  = fingerprint();
  auto started = steady::now();
  auto late    = take(standby, "kv/0", 50ms);
  EXPECT_GE(steady::now() - started, 50ms);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(late.status().message(), HasSubstr("for the write lease, in vain"));
  EXPECT_THAT(late.status().message(), HasSubstr("nothing changed"));
  EXPECT_EQ(fingerprint(), before);
  EXPECT_TRUE(lease().waiters.empty());
  auto t = core_->buffers().leases();
  EXPECT_EQ(t.waits, 1u);
  EXPECT_EQ(t.wait_timeouts, 1u);
  EXPECT_EQ(t.waiters, 0u);
  // The holder lets go later: nobody is in line, and nobody holds it.
  ASSERT_TRUE(core_->buffers().close_buffer(engine, id_, hold_kind::lease).ok());
  EXPECT_EQ(lease().holder, 0u);
  EXPECT_EQ(lease().generation, 1u);
}

TEST_F(WriteLease, AWaiterWhoseSessionEndsLeavesTheLineAndTheNextGetsTheNextGeneration)
{
  publish("kv/0");
  auto engine = open();
  ASSERT_TRUE(take(engine, "kv/0").ok());
  auto gone   = open();
  auto second = open();
  auto w1     = wait_for(gone, "kv/0");
  ASSERT_TRUE(waiting(1));
  auto w2 = wait_for(second, "kv/0");
  ASSERT_TRUE(waiting(2));
  core_->close_session(gone);
  auto ended = w1.get();
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(ended.status().message(), HasSubstr("closed while it waited for the write lease"));
  ASSERT_EQ(lease().waiters.size(), 1u);
  EXPECT_EQ(lease().waiters[0].session, second);
  core_->close_session(engine);
  auto got = w2.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->lease_generation, 2u);
}

TEST_F(WriteLease, PlainWritersAndTheLeaseKeepOutOfEachOthersWay)
{
  auto creator = publish("kv/0", false);  // its create is a plain write open
  auto engine  = open();
  auto in_way  = take(engine, "kv/0");
  EXPECT_EQ(in_way.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(in_way.status().message(), HasSubstr("1 other holder(s) have it open for writing"));
  auto waited = wait_for(engine, "kv/0");
  ASSERT_TRUE(waiting(1));
  EXPECT_EQ(lease().plain_writers, 1u);

  // While it waits, another plain writer is refused; readers are not.
  auto writer = open();
  auto before = fingerprint();
  auto plain  = core_->buffers().open_buffer(
      writer, "kv/0", {}, buffer_open_options{.access = buffer_access::read_write});
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plain.status().message(), HasSubstr("1 exclusive open(s) wait for its write lease"));
  EXPECT_EQ(fingerprint(), before);
  ASSERT_TRUE(core_->buffers().open_buffer(writer, "kv/0").ok());

  // The creator keeps reading but lets its create go: the lease is granted.
  ASSERT_TRUE(core_->buffers().open_buffer(creator, "kv/0").ok());
  ASSERT_TRUE(core_->buffers().close_buffer(creator, id_, hold_kind::read_write).ok());
  auto got = waited.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->lease_generation, 1u);

  // While it is held: another session's plain write open is refused, the
  // holder's own is not.
  before = fingerprint();
  plain  = core_->buffers().open_buffer(
      writer, "kv/0", {}, buffer_open_options{.access = buffer_access::read_write});
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plain.status().message(), HasSubstr("held by session " + std::to_string(engine)));
  EXPECT_EQ(fingerprint(), before);
  EXPECT_TRUE(
      core_->buffers().open_buffer(engine, "kv/0", {}, {.access = buffer_access::read_write}).ok());
  // The holder lets the lease go but keeps its plain write open: the next
  // exclusive open waits for that one too.
  ASSERT_TRUE(core_->buffers().close_buffer(engine, id_, hold_kind::lease).ok());
  EXPECT_EQ(take(writer, "kv/0").status().code(), absl::StatusCode::kDeadlineExceeded);
  // Its own lease is no conflict with its own plain write open.
  auto again = take(engine, "kv/0");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->lease_generation, 2u);
}

TEST_F(WriteLease, AWaiterLeavingTheLineLetsThroughOneOnlyItKeptWaiting)
{
  // The creator keeps its create (a plain write open) and waits for the
  // lease behind another session, which its own write open keeps waiting.
  auto creator = publish("kv/0", false);
  auto other   = open();
  auto first   = std::async(std::launch::async, [&] { return take(other, "kv/0", 1500ms); });
  ASSERT_TRUE(waiting(1));
  auto second = wait_for(creator, "kv/0");
  ASSERT_TRUE(waiting(2));
  EXPECT_EQ(first.get().status().code(), absl::StatusCode::kDeadlineExceeded);
  auto got = second.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->lease_generation, 1u);
  EXPECT_EQ(lease().holder, creator);
}

TEST_F(WriteLease, RefusedRequestsChangeNothing)
{
  publish("kv/0");
  auto engine    = open();
  auto other_uid = open(bob);
  auto before    = fingerprint();

  auto read_only = core_->buffers().open_buffer(
      engine, "kv/0", {}, buffer_open_options{.access = buffer_access::read, .exclusive = true});
  EXPECT_EQ(read_only.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(read_only.status().message(), HasSubstr("ask for read-write access too"));
  EXPECT_EQ(take(engine, "no/such").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(take(engine, "bad//name").status().code(), absl::StatusCode::kInvalidArgument);
  // alice's buffer names no group: not there for bob.
  EXPECT_EQ(take(other_uid, "kv/0").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(fingerprint(), before);

  // A buffer without writers: the lease is a write open, refused.
  auto creator = open();
  auto reader  = open();
  auto ro      = core_->buffers().create_buffer(creator, "weights", 0, MiB, {.persistent = true});
  ASSERT_TRUE(ro.ok());
  ASSERT_TRUE(core_->buffers().publish_buffer(creator, ro->id).ok());
  ASSERT_TRUE(core_->buffers().close_buffer(creator, ro->id, hold_kind::read_write).ok());
  before = fingerprint();
  EXPECT_EQ(take(engine, "weights").status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(fingerprint(), before);

  ASSERT_TRUE(take(engine, "kv/0").ok());
  before     = fingerprint();
  auto twice = take(engine, "kv/0", 1s);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.status().message(), HasSubstr("holds its write lease already"));
  EXPECT_EQ(fingerprint(), before);

  // A close of a lease it does not hold closes one of its other opens.
  ASSERT_TRUE(core_->buffers().open_buffer(reader, "kv/0").ok());
  ASSERT_TRUE(core_->buffers().close_buffer(reader, id_, hold_kind::lease).ok());
  EXPECT_EQ(lease().holder, engine);
  EXPECT_EQ(core_->buffers().close_buffer(reader, id_, hold_kind::lease).code(),
            absl::StatusCode::kNotFound);
}

TEST_F(WriteLease, ADeleteEndsTheWaitsNotTheLease)
{
  publish("kv/0");
  auto engine = open();
  ASSERT_TRUE(take(engine, "kv/0").ok());
  auto standby = open();
  auto waited  = wait_for(standby, "kv/0");
  ASSERT_TRUE(waiting(1));
  auto admin = open(0);
  ASSERT_TRUE(core_->buffers().delete_buffer(admin, "kv/0").ok());
  auto ended = waited.get();
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ended.status().message(), HasSubstr("deleted while this session waited"));
  EXPECT_EQ(lease().holder, engine);  // the holder keeps the deleted buffer until it closes
  core_->close_session(engine);
  EXPECT_TRUE(core_->buffers().all().empty());
}

TEST_F(WriteLease, TheDrainStopsTheWaits)
{
  publish("kv/0");
  auto engine = open();
  ASSERT_TRUE(take(engine, "kv/0").ok());
  auto standby = open();
  auto waited  = wait_for(standby, "kv/0");
  ASSERT_TRUE(waiting(1));
  core_->stop_new_sessions();
  auto ended = waited.get();
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(lease().waiters.empty());
  EXPECT_EQ(lease().holder, engine);
}

TEST_F(WriteLease, ARestartedDaemonsGenerationsStartAboveEveryEarlierOne)
{
  core_->pools().set_restart_summary({.restarts = 3, .keeping = true});
  publish("kv/0");
  auto engine = open();
  auto grant  = take(engine, "kv/0");
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(grant->lease_generation, (std::uint64_t{3} << 32) + 1);
  EXPECT_EQ(lease().generation, grant->lease_generation);
  core_->close_session(engine);
  auto next = open();
  grant     = take(next, "kv/0");
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(grant->lease_generation, (std::uint64_t{3} << 32) + 2);
}

}  // namespace
}  // namespace rmmd::core
