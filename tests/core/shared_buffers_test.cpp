// daemon_core's named shared buffers on their own: names, visibility before
// and after publishing, holders, persistence, deletion, permissions, quotas,
// waiting opens, and that every refused call leaves the core as it was. The
// pools are real host_backends (memfd); "the memory went back" is shown by
// the pool taking a block of its whole size again.

#include "common/buffer_name.hpp"
#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"

#include <absl/strings/str_replace.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

constexpr std::size_t MiB       = std::size_t{1} << 20;
constexpr std::size_t pool_size = 16 * MiB;

constexpr uid_t alice = 1000;
constexpr uid_t bob   = 2000;
constexpr gid_t team  = 500;

peer_credentials peer(uid_t uid, gid_t gid = 100, std::vector<gid_t> groups = {})
{
  return peer_credentials{
      .pid = 4321, .uid = uid, .gid = gid, .supplementary_gids = std::move(groups)};
}

class SharedBuffers : public ::testing::Test {
 protected:
  void make_core(quota_limits quotas = {})
  {
    core_options o;
    o.access.uids = {0, alice, bob};
    o.quotas      = std::move(quotas);
    o.admin_uid   = 999;
    core_         = std::make_unique<daemon_core>(std::move(o));
    core_->pools().add_pool(pool_config{.name = "host", .handle_types = {handle_type::host_offset}},
                            std::make_unique<backends::host::host_backend>("test", pool_size));
  }
  void SetUp() override
  {
    make_core();
  }

  session_id open(peer_credentials p)
  {
    auto grant = core_->sessions().open_session(std::move(p), "test", "test");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant->id;
  }

  /// Whether the pool's whole size can be lent now (nothing else is held).
  bool pool_is_empty()
  {
    auto s     = open(peer(0));
    auto lease = core_->leases().allocate(s, 0, pool_size, 0);
    core_->close_session(s);
    return lease.ok();
  }

  /// The state a refused call must leave untouched.
  std::string fingerprint()
  {
    std::string out;
    auto stats = core_->pools().stats();
    for (auto const& p : stats.pools) {
      out += std::to_string(p.in_use_bytes) + "/" + std::to_string(p.shared_buffers) + "/" +
             std::to_string(p.shared_bytes) + "/" + std::to_string(p.shared_holders) + ";";
    }
    for (auto const& s : stats.sessions) {
      out += std::to_string(s.id) + ":" + std::to_string(s.bytes) + "/" +
             std::to_string(s.shared_bytes) + "/" + std::to_string(s.buffers_held) + ";";
    }
    for (auto const& b : core_->buffers().all()) {
      out += b.name + "=" + std::to_string(b.holders) + "/" +
             std::to_string(static_cast<int>(b.state)) + ";";
    }
    return out;
  }

  /// Waits (up to 20 s) until `n` opens wait in the core.
  bool opens_waiting(std::size_t n) const
  {
    auto const deadline = std::chrono::steady_clock::now() + 20s;
    while (core_->buffers().waiting_opens() != n) {
      if (std::chrono::steady_clock::now() > deadline) { return false; }
      std::this_thread::yield();
    }
    return true;
  }

  std::unique_ptr<daemon_core> core_;
};

TEST(BufferName, AcceptsShortPathsAndRefusesTheRestWithTheRule)
{
  for (std::string_view good : {"a", "team/model/layer0", "A-Z_0.9", "x/y.z", ".hidden/v1.2"}) {
    EXPECT_FALSE(names::buffer_name_problem(good)) << good;
  }
  EXPECT_FALSE(names::buffer_name_problem(std::string(255, 'n')));
  struct bad {
    std::string name;
    std::string says;
  };
  for (auto const& [name, says] : std::vector<bad>{{"", "empty"},
                                                   {std::string(256, 'n'), "256 bytes"},
                                                   {"/abs", "starts with '/'"},
                                                   {"dir/", "ends with '/'"},
                                                   {"a//b", "empty segment"},
                                                   {"a/../b", "\"..\""},
                                                   {"..", "\"..\""},
                                                   {"a b", "0x20"},
                                                   {"caf\xc3\xa9", "0xc3"},
                                                   {std::string("a\0b", 3), "0x00"}}) {
    auto problem = names::buffer_name_problem(name);
    ASSERT_TRUE(problem) << name;
    EXPECT_THAT(*problem, HasSubstr(says));
    EXPECT_THAT(*problem, HasSubstr("A-Z a-z 0-9 . _ - /"));
  }
}

TEST_F(SharedBuffers, OnlyTheCreatorSeesABufferUntilItIsPublished)
{
  auto producer = open(peer(alice));
  auto consumer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "weights", 0, MiB, {});
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->size, MiB);
  EXPECT_EQ(made->state, buffer_state::writing);

  auto early = core_->buffers().open_buffer(consumer, "weights");
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("not published yet"));
  EXPECT_TRUE(core_->buffers().list_buffers(consumer)->empty());
  EXPECT_EQ(core_->buffers().list_buffers(producer)->size(), 1u);

  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  auto opened = core_->buffers().open_buffer(consumer, "weights");
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->id, made->id);
  EXPECT_EQ(opened->block.block.offset, made->block.block.offset);  // the same bytes
  EXPECT_EQ(opened->state, buffer_state::published);
  ASSERT_EQ(core_->buffers().list_buffers(consumer)->size(), 1u);
  EXPECT_EQ(core_->buffers().list_buffers(consumer)->front().holders, 2u);
}

TEST_F(SharedBuffers, TheMemoryGoesBackWithTheLastHolderNotBefore)
{
  auto producer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "batch/7", 0, 4 * MiB, {});
  ASSERT_TRUE(made.ok());
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  std::vector<session_id> consumers;
  for (int i = 0; i < 8; ++i) { consumers.push_back(open(peer(bob, team))); }
  // bob may not open alice's buffer: it names no group, so it is not there for him.
  EXPECT_EQ(core_->buffers().open_buffer(consumers[0], "batch/7").status().code(),
            absl::StatusCode::kNotFound);
  core_->close_session(producer);
  EXPECT_TRUE(pool_is_empty());  // nobody held it: gone with its creator

  producer = open(peer(alice));
  made     = core_->buffers().create_buffer(producer, "batch/7", 0, 4 * MiB, {.gid = team});
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  for (auto c : consumers) { ASSERT_TRUE(core_->buffers().open_buffer(c, "batch/7").ok()); }
  auto stats = core_->pools().stats();
  EXPECT_EQ(stats.pools[0].shared_buffers, 1u);
  EXPECT_EQ(stats.pools[0].shared_bytes, 4 * MiB);
  EXPECT_EQ(stats.pools[0].shared_holders, 9u);
  EXPECT_EQ(stats.pools[0].allocation_count, 0u);  // buffers are not leases

  core_->close_session(producer);  // the producer exits; the consumers read on
  EXPECT_FALSE(pool_is_empty());
  EXPECT_EQ(core_->buffers().all().at(0).holders, 8u);
  for (std::size_t i = 0; i + 1 < consumers.size(); ++i) {
    ASSERT_TRUE(core_->buffers().close_buffer(consumers[i], made->id).ok());
  }
  EXPECT_FALSE(pool_is_empty());
  core_->close_session(consumers.back());  // the last holder ends
  EXPECT_TRUE(core_->buffers().all().empty());
  EXPECT_TRUE(pool_is_empty());
  EXPECT_EQ(core_->pools().stats().pools[0].in_use_bytes, 0u);
}

TEST_F(SharedBuffers, ASessionHoldsOncePerOpenAndLetsGoOncePerClose)
{
  auto producer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "twice", 0, MiB, {});
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  auto consumer = open(peer(alice));
  ASSERT_TRUE(core_->buffers().open_buffer(consumer, "twice").ok());
  ASSERT_TRUE(core_->buffers().open_buffer(consumer, "twice").ok());
  ASSERT_TRUE(core_->buffers().close_buffer(producer, made->id).ok());
  ASSERT_TRUE(core_->buffers().close_buffer(consumer, made->id).ok());
  EXPECT_EQ(core_->buffers().all().size(), 1u);  // its second open still holds it
  ASSERT_TRUE(core_->buffers().close_buffer(consumer, made->id).ok());
  EXPECT_TRUE(core_->buffers().all().empty());
  auto again = core_->buffers().close_buffer(consumer, made->id);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
}

TEST_F(SharedBuffers, APersistentBufferOutlivesEveryHolderUntilDeleted)
{
  auto producer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "model/w", 0, MiB, {.persistent = true});
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  core_->close_session(producer);
  ASSERT_EQ(core_->buffers().all().size(), 1u);
  EXPECT_EQ(core_->buffers().all()[0].holders, 0u);

  auto restarted = open(peer(alice));
  auto reopened  = core_->buffers().open_buffer(restarted, "model/w");
  ASSERT_TRUE(reopened.ok());
  EXPECT_EQ(reopened->block.block.offset, made->block.block.offset);
  EXPECT_TRUE(reopened->persistent);
  core_->close_session(restarted);
  EXPECT_FALSE(pool_is_empty());

  auto other = open(peer(bob));
  EXPECT_EQ(core_->buffers().delete_buffer(other, "model/w").status().code(),
            absl::StatusCode::kNotFound);  // another uid's private buffer: not there for it
  auto admin   = open(peer(0));
  auto deleted = core_->buffers().delete_buffer(admin, "model/w");
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 0u);
  EXPECT_TRUE(pool_is_empty());
}

TEST_F(SharedBuffers, APersistentBufferNeverPublishedGoesWithItsCreator)
{
  auto producer = open(peer(alice));
  ASSERT_TRUE(core_->buffers().create_buffer(producer, "half", 0, MiB, {.persistent = true}).ok());
  core_->close_session(producer);
  EXPECT_TRUE(core_->buffers().all().empty());
  EXPECT_TRUE(pool_is_empty());
  auto again = open(peer(alice));
  EXPECT_TRUE(core_->buffers().create_buffer(again, "half", 0, MiB, {}).ok());  // the name is free
}

TEST_F(SharedBuffers, DeleteTakesTheNameAtOnceAndTheMemoryAfterTheLastHolder)
{
  auto producer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "kv/0", 0, 2 * MiB, {});
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  auto consumer = open(peer(alice));
  ASSERT_TRUE(core_->buffers().open_buffer(consumer, "kv/0").ok());

  auto deleted = core_->buffers().delete_buffer(consumer, "kv/0");  // same uid: allowed
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 2u);
  EXPECT_EQ(core_->buffers().open_buffer(consumer, "kv/0").status().code(),
            absl::StatusCode::kNotFound);
  auto info = core_->buffers().all();
  ASSERT_EQ(info.size(), 1u);
  EXPECT_EQ(info[0].state, buffer_state::deleted);
  auto successor = core_->buffers().create_buffer(producer, "kv/0", 0, MiB, {});
  ASSERT_TRUE(successor.ok());
  EXPECT_NE(successor->id, made->id);

  core_->close_session(producer);  // drops the old buffer's hold and frees the new one
  EXPECT_EQ(core_->buffers().all().size(), 1u);
  core_->close_session(consumer);
  EXPECT_TRUE(core_->buffers().all().empty());
  EXPECT_TRUE(pool_is_empty());
}

TEST_F(SharedBuffers, WhoMayOpenFollowsTheCreatorsUidTheGidAndRoot)
{
  auto producer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "g", 0, MiB, {.gid = team});
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  EXPECT_TRUE(core_->buffers().open_buffer(open(peer(alice, 7)), "g").ok());
  EXPECT_TRUE(core_->buffers().open_buffer(open(peer(bob, team)), "g").ok());
  EXPECT_TRUE(core_->buffers().open_buffer(open(peer(bob, 7, {8, team})), "g").ok());
  EXPECT_TRUE(core_->buffers().open_buffer(open(peer(0, 0)), "g").ok());
  auto outsider = open(peer(bob, 7, {8}));
  auto before   = fingerprint();
  auto refused  = core_->buffers().open_buffer(outsider, "g");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound);  // it is not there for it
  EXPECT_TRUE(core_->buffers().list_buffers(outsider)->empty());    // nor does it see it
  EXPECT_EQ(fingerprint(), before);
  EXPECT_EQ(core_->buffers().list_buffers(open(peer(0)))->size(), 1u);
}

// A buffer a caller may not see is, for every call, a buffer that does not
// exist, in the same words: nothing says it is there, whose it is or its id.
TEST_F(SharedBuffers, ABufferAnotherUidMayNotSeeAnswersEveryCallAsAMissingOne)
{
  auto producer = open(peer(alice));
  auto kept     = core_->buffers().create_buffer(producer, "a/private", 0, MiB, {});
  ASSERT_TRUE(kept.ok());
  auto draft = core_->buffers().create_buffer(producer, "a/draft", 0, MiB, {});
  ASSERT_TRUE(draft.ok());
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, kept->id).ok());
  auto other        = open(peer(bob, 7));
  auto const before = fingerprint();
  auto same = [](absl::Status const& hidden, absl::Status const& missing, std::string_view name) {
    EXPECT_EQ(hidden.code(), absl::StatusCode::kNotFound) << hidden;
    EXPECT_EQ(hidden.code(), missing.code());
    EXPECT_EQ(absl::StrReplaceAll(std::string(hidden.message()), {{std::string(name), "NAME"}}),
              absl::StrReplaceAll(std::string(missing.message()), {{"x/none", "NAME"}}));
    EXPECT_THAT(hidden.message(), Not(HasSubstr("1000")));
  };
  same(core_->buffers().open_buffer(other, "a/private").status(),
       core_->buffers().open_buffer(other, "x/none").status(),
       "a/private");
  same(core_->buffers().describe_buffer(other, "a/private").status(),
       core_->buffers().describe_buffer(other, "x/none").status(),
       "a/private");
  auto deleted = core_->buffers().delete_buffer(other, "a/private");
  same(deleted.status(), core_->buffers().delete_buffer(other, "x/none").status(), "a/private");
  // By id: another's unpublished buffer is no buffer, and says not its name.
  auto const published = core_->buffers().publish_buffer(other, draft->id);
  EXPECT_EQ(published.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(published.message(), Not(HasSubstr("a/draft")));
  // Names are the node's, so a taken one cannot be hidden; whose it is can.
  auto taken = core_->buffers().create_buffer(other, "a/private", 0, MiB, {});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(taken.status().message(), Not(HasSubstr("1000")));
  EXPECT_THAT(taken.status().message(), HasSubstr("may not see"));
  EXPECT_EQ(fingerprint(), before);
  // Its own uid and root still get the precise answers.
  EXPECT_TRUE(core_->buffers().open_buffer(open(peer(alice)), "a/private").ok());
  EXPECT_EQ(core_->buffers().create_buffer(open(peer(0)), "a/private", 0, MiB, {}).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(SharedBuffers, TheCreatorsUidIsChargedOnceHoweverManyOpen)
{
  quota_limits quotas;
  quotas.per_uid_bytes = 8 * MiB;
  make_core(quotas);
  auto producer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "q", 0, 6 * MiB, {.gid = team});
  ASSERT_TRUE(made.ok());
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  std::vector<session_id> consumers;
  for (int i = 0; i < 4; ++i) {
    consumers.push_back(open(peer(bob, team)));
    ASSERT_TRUE(core_->buffers().open_buffer(consumers.back(), "q").ok());
  }
  // bob is charged nothing for what he opened: his whole quota is his.
  auto bobs = core_->leases().allocate(consumers[0], 0, 8 * MiB, 0);
  EXPECT_TRUE(bobs.ok()) << bobs.status();
  ASSERT_TRUE(core_->leases().free(consumers[0], bobs->id).ok());
  // alice is charged once: 2 MiB left, whoever of hers asks.
  auto other_alice = open(peer(alice));
  auto refused     = core_->leases().allocate(other_alice, 0, 3 * MiB, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("uid 1000"));
  EXPECT_TRUE(core_->leases().allocate(other_alice, 0, 2 * MiB, 0).ok());
  auto more = core_->buffers().create_buffer(other_alice, "q2", 0, MiB, {});
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  // The charge stays with the uid after its creator left, until it is freed.
  core_->close_session(producer);
  core_->close_session(other_alice);
  EXPECT_EQ(core_->pools().stats().uid_shared_bytes.at(alice), 6 * MiB);
  EXPECT_EQ(core_->leases().allocate(open(peer(alice)), 0, 3 * MiB, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  for (auto c : consumers) { core_->close_session(c); }
  EXPECT_TRUE(core_->leases().allocate(open(peer(alice)), 0, 8 * MiB, 0).ok());
}

TEST_F(SharedBuffers, ThePerSessionQuotaCountsTheBuffersASessionCreated)
{
  quota_limits quotas;
  quotas.per_session_bytes = 4 * MiB;
  make_core(quotas);
  auto s = open(peer(alice));
  ASSERT_TRUE(core_->buffers().create_buffer(s, "a", 0, 3 * MiB, {}).ok());
  EXPECT_EQ(core_->leases().allocate(s, 0, 2 * MiB, 0).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(core_->pools().stats().sessions.at(0).shared_bytes, 3 * MiB);
  EXPECT_EQ(core_->pools().stats().sessions.at(0).buffers_held, 1u);
}

TEST_F(SharedBuffers, EveryRefusalSaysWhyAndChangesNothing)
{
  auto producer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "taken", 0, MiB, {});
  ASSERT_TRUE(made.ok());
  auto other = open(peer(bob));
  auto mine  = open(peer(alice));
  struct refusal {
    std::string call;
    absl::Status status;
    absl::StatusCode code;
    std::string says;
  };
  auto before = fingerprint();
  std::vector<refusal> refusals;
  auto add = [&](std::string call, absl::Status status, absl::StatusCode code, std::string says) {
    refusals.push_back({std::move(call), std::move(status), code, std::move(says)});
    EXPECT_EQ(fingerprint(), before) << refusals.back().call;
  };
  add("create, name taken",
      core_->buffers().create_buffer(mine, "taken", 0, MiB, {}).status(),
      absl::StatusCode::kAlreadyExists,
      "taken by buffer");
  add("create, bad name",
      core_->buffers().create_buffer(mine, "a//b", 0, MiB, {}).status(),
      absl::StatusCode::kInvalidArgument,
      "empty segment");
  add("create, size 0",
      core_->buffers().create_buffer(mine, "z", 0, 0, {}).status(),
      absl::StatusCode::kInvalidArgument,
      "size 0");
  add("create, unknown pool",
      core_->buffers().create_buffer(mine, "z", 9, MiB, {}).status(),
      absl::StatusCode::kInvalidArgument,
      "unknown pool id 9");
  add("create, bad alignment",
      core_->buffers().create_buffer(mine, "z", 0, MiB, {.alignment = 3}).status(),
      absl::StatusCode::kInvalidArgument,
      "alignment 3");
  add("create, larger than the pool",
      core_->buffers().create_buffer(mine, "z", 0, pool_size + 1, {}).status(),
      absl::StatusCode::kResourceExhausted,
      "capacity");
  add("create, pool full",
      core_->buffers().create_buffer(mine, "z", 0, pool_size, {}).status(),
      absl::StatusCode::kResourceExhausted,
      "in use");
  add("publish by another session",
      core_->buffers().publish_buffer(mine, made->id),
      absl::StatusCode::kFailedPrecondition,
      "only the session that created it");
  add("publish, unknown id",
      core_->buffers().publish_buffer(producer, 999),
      absl::StatusCode::kNotFound,
      "no such buffer");
  add("open, unknown name",
      core_->buffers().open_buffer(mine, "nothing").status(),
      absl::StatusCode::kNotFound,
      "no buffer has this name");
  add("open, unpublished",
      core_->buffers().open_buffer(mine, "taken").status(),
      absl::StatusCode::kFailedPrecondition,
      "not published yet");
  add("open, bad name",
      core_->buffers().open_buffer(mine, "/x").status(),
      absl::StatusCode::kInvalidArgument,
      "starts with '/'");
  add("close, not held",
      core_->buffers().close_buffer(mine, made->id),
      absl::StatusCode::kNotFound,
      "does not hold it");
  add("delete, another uid's private buffer (not there for it)",
      core_->buffers().delete_buffer(other, "taken").status(),
      absl::StatusCode::kNotFound,
      "no buffer has this name");
  add("delete, unknown",
      core_->buffers().delete_buffer(other, "nothing").status(),
      absl::StatusCode::kNotFound,
      "no buffer has this name");
  add("create, closed session",
      core_->buffers().create_buffer(12345, "z", 0, MiB, {}).status(),
      absl::StatusCode::kUnauthenticated,
      "session is closed");
  for (auto const& r : refusals) {
    EXPECT_EQ(r.status.code(), r.code) << r.call << ": " << r.status;
    EXPECT_THAT(std::string(r.status.message()), HasSubstr(r.says)) << r.call;
  }
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  EXPECT_EQ(core_->buffers().publish_buffer(producer, made->id).code(),
            absl::StatusCode::kFailedPrecondition);  // published already
}

TEST_F(SharedBuffers, AWaitingOpenReturnsWhenTheBufferIsPublished)
{
  auto producer = open(peer(alice));
  auto consumer = open(peer(alice));
  auto waiting  = std::async(std::launch::async, [&] {
    return core_->buffers().open_buffer(consumer, "later", std::chrono::steady_clock::now() + 20s);
  });
  ASSERT_TRUE(opens_waiting(1));  // it waits for a name that does not exist yet
  auto made = core_->buffers().create_buffer(producer, "later", 0, MiB, {});
  ASSERT_TRUE(made.ok());
  EXPECT_EQ(waiting.wait_for(50ms), std::future_status::timeout);  // created, not published
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  auto opened = waiting.get();
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->id, made->id);
}

TEST_F(SharedBuffers, AWaitingOpenEndsAtItsDeadlineOrTheDrainOrItsSessionsEnd)
{
  auto consumer = open(peer(alice));
  auto start    = std::chrono::steady_clock::now();
  auto timed    = core_->buffers().open_buffer(consumer, "never", start + 100ms);
  EXPECT_EQ(timed.status().code(), absl::StatusCode::kNotFound);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 100ms);

  auto closing = std::async(std::launch::async, [&] {
    return core_->buffers().open_buffer(consumer, "never", std::chrono::steady_clock::now() + 60s);
  });
  ASSERT_TRUE(opens_waiting(1));
  core_->close_session(consumer);
  EXPECT_EQ(closing.get().status().code(), absl::StatusCode::kUnauthenticated);

  auto other    = open(peer(alice));
  auto draining = std::async(std::launch::async, [&] {
    return core_->buffers().open_buffer(other, "never", std::chrono::steady_clock::now() + 60s);
  });
  ASSERT_TRUE(opens_waiting(1));
  core_->stop_new_sessions();
  EXPECT_EQ(draining.get().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(SharedBuffers, OnlyAHolderAsksForTheFdOfAHostBuffersOwnMemfd)
{
  auto producer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "fd", 0, MiB, {});
  ASSERT_TRUE(made.ok());
  EXPECT_TRUE(made->block.host_memfd);
  auto fd = core_->buffers().buffer_fd(producer, made->id);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_NE(*fd, core_->pools().pools_for(producer)->front().shareable_fd);  // not the pool's
  EXPECT_EQ(core_->buffers().buffer_fd(open(peer(alice)), made->id).status().code(),
            absl::StatusCode::kNotFound);  // holds none
}

TEST_F(SharedBuffers, TheDaemonsStopFreesPersistentBuffers)
{
  auto producer = open(peer(alice));
  auto made     = core_->buffers().create_buffer(producer, "p", 0, MiB, {.persistent = true});
  ASSERT_TRUE(core_->buffers().publish_buffer(producer, made->id).ok());
  core_->close_all_sessions();
  EXPECT_EQ(core_->buffers().all().size(), 1u);
  core_.reset();  // must give the block back before the backend goes (ASan would say)
}

}  // namespace
}  // namespace rmmd::core
