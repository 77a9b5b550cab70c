// A standby's write lease in the core on its own (docs/failover.md, "A
// standby that is ready"): a standby open answers at once, holding the
// buffer, with the lease where it is free and a place in line otherwise;
// wait_buffer_lease() finds the grant (waiting for it, or at once when it
// came first) and leaves the standby in line when its wait ends; the grant
// adds no hold; closing the standby or ending its session takes it out of
// line; standbys and waiting exclusive opens share one line, first come
// first served; every refusal leaves the core as it was; a host buffer's
// memfd comes read-write to a standby (its mapping is made writable at the
// grant) and read-only to a reader. The pool is a real host_backend (memfd).

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"

#include <fcntl.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr uid_t alice     = 1000;

using steady = std::chrono::steady_clock;

buffer_open_options exclusive(bool standby = false)
{
  return {.access = buffer_access::read_write, .exclusive = true, .standby = standby};
}

class StandbyLease : public ::testing::Test {
 protected:
  void SetUp() override
  {
    core_options o;
    o.access.uids = {0, alice};
    core_         = std::make_unique<daemon_core>(std::move(o));
    core_->pools().add_pool(pool_config{.name = "host", .handle_types = {handle_type::host_offset}},
                            std::make_unique<backends::host::host_backend>("test", 16 * MiB));
    // A persistent buffer that others may write, which nobody holds.
    auto creator = open();
    auto made    = core_->buffers().create_buffer(
        creator, "kv/0", 0, MiB, {.persistent = true, .allow_writers = true});
    ASSERT_TRUE(made.ok()) << made.status();
    ASSERT_TRUE(core_->buffers().publish_buffer(creator, made->id).ok());
    ASSERT_TRUE(core_->buffers().close_buffer(creator, made->id, hold_kind::read_write).ok());
    id_ = made->id;
  }

  session_id open()
  {
    auto grant = core_->sessions().open_session(
        peer_credentials{.pid = next_pid_++, .uid = alice, .gid = 100, .supplementary_gids = {}},
        "test",
        "test");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant->id;
  }

  absl::StatusOr<buffer_grant> take(session_id s, std::chrono::milliseconds wait = {})
  {
    return core_->buffers().open_buffer(s, "kv/0", steady::now() + wait, exclusive());
  }

  absl::StatusOr<buffer_grant> standby(session_id s)
  {
    return core_->buffers().open_buffer(s, "kv/0", steady::now(), exclusive(true));
  }

  absl::StatusOr<std::uint64_t> wait_lease(session_id s, std::chrono::milliseconds wait = {})
  {
    return core_->buffers().wait_buffer_lease(s, id_, steady::now() + wait);
  }

  /// wait_lease() up to 20 s on a thread of its own.
  std::future<absl::StatusOr<std::uint64_t>> wait_lease_async(session_id s)
  {
    return std::async(std::launch::async, [this, s] { return wait_lease(s, 20s); });
  }

  /// Waits (up to 20 s) until `n` calls wait in the core.
  bool waiting(std::size_t n) const
  {
    auto const deadline = steady::now() + 20s;
    while (core_->buffers().waiting_opens() != n) {
      if (steady::now() > deadline) { return false; }
      std::this_thread::yield();
    }
    return true;
  }

  buffer_info info() const
  {
    for (auto const& b : core_->buffers().all()) {
      if (b.id == id_) { return b; }
    }
    ADD_FAILURE() << "no buffer " << id_;
    return {};
  }

  std::size_t held_by(session_id s) const
  {
    for (auto const& x : core_->pools().stats().sessions) {
      if (x.id == s) { return x.buffers_held; }
    }
    return 0;
  }

  /// The state a refused call must leave untouched.
  std::string fingerprint() const
  {
    auto b   = info();
    auto out = std::to_string(b.holders);
    if (b.lease) {
      out += " lease " + std::to_string(b.lease->generation) + "/" +
             std::to_string(b.lease->holder) + " waiters";
      for (auto const& w : b.lease->waiters) { out += " " + std::to_string(w.session); }
    }
    for (auto const& s : core_->pools().stats().sessions) {
      out += ";" + std::to_string(s.id) + ":" + std::to_string(s.buffers_held);
    }
    return out;
  }

  std::unique_ptr<daemon_core> core_;
  buffer_id id_{};
  pid_t next_pid_{5000};
};

TEST_F(StandbyLease, AStandbyOfAFreeLeaseHoldsItAtOnce)
{
  auto s     = open();
  auto grant = standby(s);
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->lease_generation, 1u);
  EXPECT_EQ(grant->access, buffer_access::read_write);
  auto generation = wait_lease(s);
  ASSERT_TRUE(generation.ok()) << generation.status();
  EXPECT_EQ(*generation, 1u);
  EXPECT_EQ(info().holders, 1u);
  EXPECT_EQ(held_by(s), 1u);
}

TEST_F(StandbyLease, AStandbyStandsInLineHoldingTheBufferAndTheGrantAddsNoHold)
{
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto s     = open();
  auto grant = standby(s);  // answered at once, without a wait
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->lease_generation, 0u);
  EXPECT_EQ(grant->access, buffer_access::read_write);
  EXPECT_EQ(held_by(s), 1u);  // the standby holds the buffer: its process maps it
  auto b = info();
  EXPECT_EQ(b.holders, 2u);
  ASSERT_TRUE(b.lease);
  ASSERT_EQ(b.lease->waiters.size(), 1u);  // rmmctl shows the standby as a waiter
  EXPECT_EQ(b.lease->waiters[0].session, s);
  EXPECT_EQ(core_->buffers().leases().waiters, 1u);

  auto granted = wait_lease_async(s);
  ASSERT_TRUE(waiting(1));
  core_->close_session(engine);  // SIGKILL, as the daemon sees it
  auto generation = granted.get();
  ASSERT_TRUE(generation.ok()) << generation.status();
  EXPECT_EQ(*generation, 2u);
  EXPECT_EQ(held_by(s), 1u);  // the same one hold: the grant added none
  b = info();
  EXPECT_EQ(b.holders, 1u);
  EXPECT_EQ(b.lease->holder, s);
  EXPECT_EQ(b.lease->generation, 2u);
  EXPECT_TRUE(b.lease->waiters.empty());
  // Asked again, the same answer at once.
  EXPECT_EQ(*wait_lease(s), 2u);
  // Closing the standby's open ends its lease and its hold.
  ASSERT_TRUE(core_->buffers().close_buffer(s, id_, hold_kind::lease).ok());
  EXPECT_EQ(info().holders, 0u);
  EXPECT_EQ(info().lease->holder, 0u);
}

TEST_F(StandbyLease, AGrantBeforeTheWaitIsFoundAtOnce)
{
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto s = open();
  ASSERT_TRUE(standby(s).ok());
  ASSERT_TRUE(core_->buffers().close_buffer(engine, id_, hold_kind::lease).ok());
  EXPECT_EQ(info().lease->holder, s);  // granted in the close's critical section
  auto generation = wait_lease(s);
  ASSERT_TRUE(generation.ok()) << generation.status();
  EXPECT_EQ(*generation, 2u);
}

TEST_F(StandbyLease, AWaitThatEndsFirstIsDeadlineExceededAndTheStandbyStaysInLine)
{
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto s = open();
  ASSERT_TRUE(standby(s).ok());
  auto before = fingerprint();
  auto ended  = wait_lease(s, 30ms);
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(ended.status().message(),
              HasSubstr("held by session " + std::to_string(engine) + " (pid"));
  EXPECT_THAT(ended.status().message(), HasSubstr("the standby stays in line"));
  EXPECT_EQ(fingerprint(), before);
  core_->close_session(engine);
  EXPECT_EQ(*wait_lease(s), 2u);
}

TEST_F(StandbyLease, StandbysAndWaitingOpensShareOneLineFirstComeFirstServed)
{
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto first = open();
  ASSERT_TRUE(standby(first).ok());
  auto second = open();
  auto opened = std::async(std::launch::async, [&] { return take(second, 20s); });
  ASSERT_TRUE(waiting(1));
  auto third = open();
  ASSERT_TRUE(standby(third).ok());
  ASSERT_EQ(info().lease->waiters.size(), 3u);

  core_->close_session(engine);
  EXPECT_EQ(*wait_lease(first), 2u);
  EXPECT_EQ(wait_lease(third).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(core_->buffers().close_buffer(first, id_, hold_kind::lease).ok());
  auto grant = opened.get();
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->lease_generation, 3u);
  core_->close_session(second);
  EXPECT_EQ(*wait_lease(third), 4u);
  EXPECT_EQ(info().holders, 1u);
}

TEST_F(StandbyLease, ClosingAStandbyBeforeItsGrantTakesItOutOfLine)
{
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto s    = open();
  auto next = open();
  ASSERT_TRUE(standby(s).ok());
  ASSERT_TRUE(standby(next).ok());
  ASSERT_TRUE(core_->buffers().close_buffer(s, id_, hold_kind::lease).ok());
  EXPECT_EQ(held_by(s), 0u);
  ASSERT_EQ(info().lease->waiters.size(), 1u);
  EXPECT_EQ(info().lease->waiters[0].session, next);
  EXPECT_EQ(wait_lease(s).status().code(), absl::StatusCode::kNotFound);  // holds nothing
  core_->close_session(engine);
  EXPECT_EQ(*wait_lease(next), 2u);
}

TEST_F(StandbyLease, AStandbyWhoseSessionEndsLeavesTheLineAndItsWaitEnds)
{
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto s    = open();
  auto next = open();
  ASSERT_TRUE(standby(s).ok());
  ASSERT_TRUE(standby(next).ok());
  auto waited = wait_lease_async(s);
  ASSERT_TRUE(waiting(1));
  core_->close_session(s);
  EXPECT_EQ(waited.get().status().code(), absl::StatusCode::kUnauthenticated);
  ASSERT_EQ(info().lease->waiters.size(), 1u);
  core_->close_session(engine);
  EXPECT_EQ(*wait_lease(next), 2u);  // the next in line, with the next generation
}

TEST_F(StandbyLease, RefusedRequestsChangeNothing)
{
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto s = open();
  ASSERT_TRUE(standby(s).ok());
  auto other  = open();
  auto before = fingerprint();
  auto bad    = core_->buffers().open_buffer(
      other,
      "kv/0",
      steady::now(),
      buffer_open_options{.access = buffer_access::read_write, .standby = true});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("ask for exclusive"));
  auto twice = standby(s);  // one lease per session
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(take(s).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fingerprint(), before);
  // No standby: nothing to wait for; a plain writer may not cut in.
  EXPECT_EQ(wait_lease(other).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(core_->buffers().open_buffer(other, "kv/0", steady::now(), {}).ok());
  before = fingerprint();
  EXPECT_EQ(wait_lease(other).status().code(), absl::StatusCode::kFailedPrecondition);
  auto plain = core_->buffers().open_buffer(
      other, "kv/0", steady::now(), {.access = buffer_access::read_write});
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fingerprint(), before);
}

TEST_F(StandbyLease, ADeleteEndsTheStandbysWaitNotItsHold)
{
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto s = open();
  ASSERT_TRUE(standby(s).ok());
  auto waited = wait_lease_async(s);
  ASSERT_TRUE(waiting(1));
  auto root = core_->sessions().open_session(
      peer_credentials{.pid = 1, .uid = 0, .gid = 0, .supplementary_gids = {}}, "rmmctl", "rmmctl");
  ASSERT_TRUE(root.ok());
  ASSERT_TRUE(core_->buffers().delete_buffer(root->id, "kv/0").ok());
  auto ended = waited.get();
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ended.status().message(), HasSubstr("deleted"));
  EXPECT_EQ(held_by(s), 1u);
  EXPECT_TRUE(core_->buffers().close_buffer(s, id_, hold_kind::lease).ok());
}

TEST_F(StandbyLease, TheDrainStopsTheWaitTheStandbyKeepsItsHold)
{
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto s = open();
  ASSERT_TRUE(standby(s).ok());
  auto waited = wait_lease_async(s);
  ASSERT_TRUE(waiting(1));
  core_->stop_new_sessions();
  EXPECT_EQ(waited.get().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(held_by(s), 1u);
}

TEST_F(StandbyLease, AStandbyGetsTheMemfdReadWriteAReaderReadOnly)
{
  auto const access = [](absl::StatusOr<int> fd) {
    EXPECT_TRUE(fd.ok()) << fd.status();
    return fd.ok() ? ::fcntl(*fd, F_GETFL) & O_ACCMODE : -1;
  };
  auto engine = open();
  ASSERT_TRUE(take(engine).ok());
  auto s = open();
  ASSERT_TRUE(standby(s).ok());
  auto reader = open();
  ASSERT_TRUE(core_->buffers().open_buffer(reader, "kv/0", steady::now(), {}).ok());
  EXPECT_EQ(access(core_->buffers().buffer_fd(s, id_)), O_RDWR);       // in line
  EXPECT_EQ(access(core_->buffers().buffer_fd(engine, id_)), O_RDWR);  // the holder
  EXPECT_EQ(access(core_->buffers().buffer_fd(reader, id_)), O_RDONLY);
}

}  // namespace
}  // namespace rmmd::core
