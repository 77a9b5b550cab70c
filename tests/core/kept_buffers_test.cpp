// daemon_core's side of buffers that outlive the daemon (buffer_keeper.hpp):
// the keeper hears of every buffer published with an fd of its own and of
// every one deleted or freed; a stopped keeper hears nothing; adopted
// buffers are served published, charged to their pool and owner, and freed
// through their own release. Real host_backends (memfd buffers).

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr uid_t alice     = 1000;
constexpr uid_t bob       = 2000;

class recording_keeper final : public buffer_keeper {
 public:
  void keep(kept_buffer const& b) noexcept override
  {
    kept.push_back(b.info.name);
    fds_valid = fds_valid && ::fcntl(b.fd, F_GETFD) >= 0 && b.host_memfd &&
                b.allocation_bytes >= b.info.size;
  }
  void forget(buffer_id id) noexcept override
  {
    forgotten.push_back(id);
  }
  std::vector<std::string> kept;
  std::vector<buffer_id> forgotten;
  bool fds_valid{true};
};

class KeptBuffers : public ::testing::Test {
 protected:
  void SetUp() override
  {
    core_options o;
    o.access.uids = {0, alice, bob};
    core_         = std::make_unique<daemon_core>(std::move(o));
    core_->pools().add_pool(pool_config{.name = "host", .handle_types = {handle_type::host_offset}},
                            std::make_unique<backends::host::host_backend>("test", 16 * MiB));
    keeper_ = std::make_shared<recording_keeper>();
    core_->buffers().set_buffer_keeper(keeper_);
  }

  session_id open(uid_t uid)
  {
    auto grant = core_->sessions().open_session(
        peer_credentials{.pid = 1, .uid = uid, .gid = 100}, "test", "test");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant->id;
  }

  buffer_id publish(session_id s, std::string const& name, bool persistent)
  {
    auto b = core_->buffers().create_buffer(s, name, 0, MiB, {.persistent = persistent});
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(core_->buffers().publish_buffer(s, b->id).ok());
    return b->id;
  }

  /// A memfd of `bytes`, as the fd store would pass one back.
  static shared_allocation memfd(std::size_t bytes)
  {
    int fd = ::memfd_create("kept", MFD_CLOEXEC);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    return {.block = {.bytes = bytes}, .fd = fd, .host_memfd = true};
  }

  std::unique_ptr<daemon_core> core_;
  std::shared_ptr<recording_keeper> keeper_;
};

TEST_F(KeptBuffers, PublishKeepsDeleteAndTheLastCloseForget)
{
  auto s         = open(alice);
  auto weights   = publish(s, "team/weights", true);
  auto transient = publish(s, "team/transient", false);
  EXPECT_THAT(keeper_->kept, ElementsAre("team/weights", "team/transient"));
  EXPECT_TRUE(keeper_->fds_valid);
  EXPECT_THAT(keeper_->forgotten, IsEmpty());

  // A buffer created but never published is never kept.
  auto draft = core_->buffers().create_buffer(s, "team/draft", 0, MiB, {});
  ASSERT_TRUE(draft.ok());
  ASSERT_TRUE(core_->buffers().close_buffer(s, draft->id).ok());
  EXPECT_EQ(keeper_->kept.size(), 2u);

  ASSERT_TRUE(core_->buffers().delete_buffer(s, "team/weights").ok());
  EXPECT_THAT(keeper_->forgotten, ElementsAre(weights));
  ASSERT_TRUE(core_->buffers().close_buffer(s, transient).ok());  // its last holder
  EXPECT_THAT(keeper_->forgotten, ElementsAre(weights, transient));
}

TEST_F(KeptBuffers, WithoutAKeeperTheSessionsEndForgetsNothing)
{
  auto s = open(alice);
  publish(s, "team/held", false);
  core_->buffers().set_buffer_keeper(nullptr);  // what shutdown does before it closes the sessions
  core_->close_session(s);
  EXPECT_THAT(keeper_->forgotten, IsEmpty());
}

TEST_F(KeptBuffers, AnAdoptedBufferIsServedChargedAndFreedThroughItsRelease)
{
  int released = 0;
  auto memory  = memfd(MiB);
  auto id      = core_->buffers().adopt_buffer(adopted_buffer_spec{
           .name        = "team/adopted",
           .pool        = 0,
           .size        = MiB - 100,
           .persistent  = false,
           .gid         = 555,
           .creator_uid = alice,
           .creator_pid = 77,
           .manifest =
          std::make_shared<buffer_manifest const>(buffer_manifest{.labels = {{"model", "m1"}}}),
           .memory  = memory,
           .release = [&](shared_allocation const& m) {
        ++released;
        ::close(m.fd);
      }});
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_THAT(keeper_->kept, IsEmpty());  // the keeper has it already

  auto const stats = core_->pools().stats();
  EXPECT_EQ(stats.pools[0].in_use_bytes, MiB);
  EXPECT_EQ(stats.uid_shared_bytes.at(alice), MiB);
  // The pool's row per tenant (one backend for everyone here) counts it too.
  ASSERT_EQ(stats.pools[0].tenants.size(), 1u);
  EXPECT_EQ(stats.pools[0].tenants[0].in_use_bytes, MiB);
  EXPECT_EQ(stats.pools[0].tenants[0].shared_buffers, 1u);

  // Its owner's uid sees it published with its manifest; another uid does not.
  auto a    = open(alice);
  auto list = core_->buffers().list_buffers(a);
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].state, buffer_state::published);
  EXPECT_EQ((*list)[0].size, MiB - 100);
  EXPECT_EQ((*list)[0].creator_pid, 77);
  EXPECT_EQ((*list)[0].labels.at("model"), "m1");
  EXPECT_EQ(core_->buffers().open_buffer(open(bob), "team/adopted").status().code(),
            absl::StatusCode::kNotFound);
  auto grant = core_->buffers().open_buffer(a, "team/adopted");
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->block.fd, memory.fd);
  EXPECT_TRUE(grant->block.host_memfd);

  // Not persistent: its last holder after the restart frees it.
  ASSERT_TRUE(core_->buffers().close_buffer(a, grant->id).ok());
  EXPECT_EQ(released, 1);
  EXPECT_THAT(keeper_->forgotten, ElementsAre(*id));
  EXPECT_EQ(core_->pools().stats().pools[0].in_use_bytes, 0u);
  EXPECT_FALSE(core_->pools().stats().uid_shared_bytes.contains(alice));
}

TEST_F(KeptBuffers, AdoptionRefusesATakenNameABadPoolAndASizeAboveTheAllocation)
{
  auto s = open(alice);
  publish(s, "team/taken", true);
  auto memory = memfd(MiB);
  auto spec   = [&](std::string name, pool_id pool, std::size_t size) {
    return adopted_buffer_spec{.name        = std::move(name),
                                 .pool        = pool,
                                 .size        = size,
                                 .creator_uid = alice,
                                 .memory      = memory,
                                 .release     = [](shared_allocation const&) {}};
  };
  EXPECT_EQ(core_->buffers().adopt_buffer(spec("team/taken", 0, MiB)).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(core_->buffers().adopt_buffer(spec("team/x", 7, MiB)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->buffers().adopt_buffer(spec("team/x", 0, MiB + 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(core_->buffers().adopt_buffer(spec("../x", 0, MiB)).status().code(),
            absl::StatusCode::kInvalidArgument);
  ::close(memory.fd);
}

// With a backend per tenant, an adopted buffer is in its creator's tenant
// row: the rows add up to the pool's total, before and after a session of
// that tenant makes its slot.
TEST(AdoptedBuffers, CountInTheirTenantsRowOfThePool)
{
  core_options o;
  o.access.uids = {0, alice, bob};
  daemon_core core(std::move(o));
  auto const pool = core.pools().add_pool(
      pool_config{.name = "host", .handle_types = {handle_type::host_offset}},
      backend_traits{.name = "host", .space = memory_space::host},
      16 * MiB,
      [](tenant_key const& t) {
        return std::make_unique<backends::host::host_backend>("t", 16 * MiB, false, t.text());
      });
  int fd = ::memfd_create("kept", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(MiB)), 0);
  auto id = core.buffers().adopt_buffer(
      adopted_buffer_spec{.name        = "team/adopted",
                          .pool        = pool,
                          .size        = MiB,
                          .persistent  = true,
                          .creator_uid = alice,
                          .memory      = {.block = {.bytes = MiB}, .fd = fd, .host_memfd = true},
                          .release     = [](shared_allocation const& m) { ::close(m.fd); }});
  ASSERT_TRUE(id.ok()) << id.status();
  auto rows = [&] { return core.pools().stats().pools[pool].tenants; };
  ASSERT_EQ(rows().size(), 1u);  // no session of alice yet: a row of its own
  EXPECT_EQ(rows()[0].tenant, "uid 1000");
  EXPECT_EQ(rows()[0].in_use_bytes, MiB);
  EXPECT_EQ(rows()[0].shared_buffers, 1u);

  auto s = core.sessions().open_session(
      peer_credentials{.pid = 1, .uid = alice, .gid = 100}, "test", "test");
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(core.leases().allocate(s->id, pool, MiB, 0).ok());
  auto const after = rows();
  ASSERT_EQ(after.size(), 1u);  // its slot's row, with the adopted buffer in it
  EXPECT_EQ(after[0].in_use_bytes, 2 * MiB);
  EXPECT_EQ(after[0].shared_buffers, 1u);
  EXPECT_EQ(core.pools().stats().pools[pool].in_use_bytes, 2 * MiB);
  ASSERT_TRUE(core.buffers().delete_buffer(s->id, "team/adopted").ok());
  EXPECT_EQ(rows()[0].in_use_bytes, MiB);
}

}  // namespace
}  // namespace rmmd::core
