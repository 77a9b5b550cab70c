// Tenants (daemon/core/tenants.hpp): each uid's sessions are served by
// backends of their own, made on its first session and retired after its
// last; memory reaches another tenant only by a trim; a buffer that is a
// pointer into one tenant's pool is never opened by another.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"
#include "fake_pool_backend.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

namespace rmmd::core {
namespace {

constexpr std::size_t MiB       = std::size_t{1} << 20;
constexpr std::size_t pool_size = 64 * MiB;
constexpr uid_t alice           = 1001;
constexpr uid_t bob             = 1002;
constexpr uid_t carol           = 1003;

peer_credentials peer(uid_t uid, gid_t gid = 100)
{
  return peer_credentials{.pid = 4321, .uid = uid, .gid = gid, .supplementary_gids = {}};
}

class Tenants : public ::testing::Test {
 protected:
  /// A core whose one pool makes a backend per tenant: real host backends
  /// (a memfd each), or fakes that look like a CUDA pool.
  void make_core(tenancy_policy tenancy, bool cuda_like = false)
  {
    core_options o;
    o.access.uids = {0, alice, bob, carol};
    o.tenancy     = std::move(tenancy);
    core_         = std::make_unique<daemon_core>(std::move(o));
    auto make     = [this, cuda_like](tenant_key const& t) -> std::unique_ptr<pool_backend> {
      made_.push_back(t);
      if (!cuda_like) { return std::make_unique<backends::host::host_backend>("t", pool_size); }
      auto fake = std::make_unique<fake_pool_backend>(
          fake_pool_backend::options{.capacity = pool_size,
                                         .traits   = device_like_traits,
                                         .source   = fake_pool_backend::memory::made_up});
      fakes_.push_back(fake.get());
      return fake;
    };
    pool_ = core_->pools().add_pool(
        pool_config{.name = "p", .handle_types = {handle_type::host_offset}},
        cuda_like ? device_like_traits : host_like_traits,
        pool_size,
        make);
  }

  session_id open(peer_credentials p)
  {
    auto grant = core_->sessions().open_session(std::move(p), "test", "test");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant.ok() ? grant->id : 0;
  }

  int fd_of(session_id s)
  {
    auto pools = core_->pools().pools_for(s);
    EXPECT_TRUE(pools.ok()) << pools.status();
    return pools.ok() ? (*pools)[0].shareable_fd : -2;
  }

  std::unique_ptr<daemon_core> core_;
  pool_id pool_{};
  std::vector<tenant_key> made_;
  std::vector<fake_pool_backend*> fakes_;  // owned by core_
};

TEST_F(Tenants, EachUidIsServedByAPoolOfItsOwnMadeOnItsFirstSession)
{
  make_core({});
  EXPECT_TRUE(made_.empty());  // nothing until a session comes
  auto a1 = open(peer(alice));
  auto a2 = open(peer(alice));
  auto b  = open(peer(bob));
  ASSERT_EQ(made_.size(), 2u);
  EXPECT_EQ(made_[0].text(), "uid 1001");
  EXPECT_EQ(made_[1].text(), "uid 1002");
  EXPECT_GE(fd_of(a1), 0);
  EXPECT_EQ(fd_of(a1), fd_of(a2));  // one uid, one memfd
  EXPECT_NE(fd_of(a1), fd_of(b));
  // The pool list without a session names no tenant's fd.
  EXPECT_EQ(core_->pools().list()[0].shareable_fd, -1);

  // Each tenant's leases come from its own memfd: both start at offset 0.
  auto la = core_->leases().allocate(a1, pool_, MiB, 0);
  auto lb = core_->leases().allocate(b, pool_, MiB, 0);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(la->block.offset, 0u);
  EXPECT_EQ(lb->block.offset, 0u);
  auto stats = core_->pools().stats();
  ASSERT_EQ(stats.pools[0].tenants.size(), 2u);
  EXPECT_EQ(stats.pools[0].tenants[0].tenant, "uid 1001");
  EXPECT_EQ(stats.pools[0].tenants[0].in_use_bytes, MiB);
  EXPECT_EQ(stats.pools[0].tenants[1].in_use_bytes, MiB);
  EXPECT_EQ(stats.pools[0].in_use_bytes, 2 * MiB);
}

TEST_F(Tenants, TheirPoolsTogetherStayWithinThePoolsCapacity)
{
  make_core({});
  auto a = open(peer(alice));
  auto b = open(peer(bob));
  ASSERT_TRUE(core_->leases().allocate(a, pool_, 48 * MiB, 0, reclaim_policy::refuse).ok());
  auto refused = core_->leases().allocate(b, pool_, 32 * MiB, 0, reclaim_policy::refuse);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
}

TEST_F(Tenants, AListedGroupSharesOneTenantAndSharedModeHasOnlyOne)
{
  make_core({.isolate = true, .shared_gids = {500}});
  auto a = open(peer(alice, 500));
  auto b = open(peer(bob, 500));
  auto c = open(peer(carol, 600));
  EXPECT_EQ(fd_of(a), fd_of(b));
  EXPECT_NE(fd_of(a), fd_of(c));
  ASSERT_EQ(made_.size(), 2u);
  EXPECT_EQ(made_[0].text(), "gid 500");

  made_.clear();
  make_core({.isolate = false, .shared_gids = {}});
  EXPECT_EQ(made_.size(), 1u);  // made at once, for everyone
  auto x = open(peer(alice));
  auto y = open(peer(bob));
  EXPECT_EQ(fd_of(x), fd_of(y));
  EXPECT_EQ(made_.size(), 1u);
  EXPECT_EQ(core_->pools().list()[0].shareable_fd, fd_of(x));
}

TEST_F(Tenants, ATenantsPoolGoesWithItsLastSessionUnlessABufferKeepsIt)
{
  make_core({});
  auto a = open(peer(alice));
  ASSERT_TRUE(core_->leases().allocate(a, pool_, MiB, 0).ok());
  core_->close_session(a);
  open(peer(alice));
  EXPECT_EQ(made_.size(), 2u);  // the first was retired with its session

  auto b    = open(peer(bob));
  auto made = core_->buffers().create_buffer(b, "kept", pool_, MiB, {.persistent = true});
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(core_->buffers().publish_buffer(b, made->id).ok());
  core_->close_session(b);
  auto b2 = open(peer(bob));
  EXPECT_EQ(made_.size(), 3u);  // bob's pool stayed for its buffer
  EXPECT_TRUE(core_->buffers().open_buffer(b2, "kept").ok());
}

TEST_F(Tenants, ATenantShortOfDeviceMemoryHasTheOthersTrimmed)
{
  make_core({}, /*cuda_like=*/true);
  auto a = open(peer(alice));
  auto b = open(peer(bob));
  ASSERT_EQ(fakes_.size(), 2u);
  // Alice's pool keeps 32 MiB it does not lend; bob's finds the device full
  // until the driver has that back.
  fakes_[0]->set_reserved(32 * MiB, 32 * MiB);
  fakes_[1]->fail_next(absl::ResourceExhaustedError("device out of memory"));
  auto lease = core_->leases().allocate(b, pool_, 16 * MiB, 0, reclaim_policy::refuse);
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(fakes_[0]->trim_calls(), 1);
  EXPECT_EQ(fakes_[1]->allocate_calls(), 2u);
  EXPECT_EQ(fakes_[1]->trim_calls(), 0);
  static_cast<void>(a);
}

TEST_F(Tenants, ABufferThatIsAPointerIntoOneTenantsPoolIsRefusedToAnother)
{
  make_core({}, /*cuda_like=*/true);
  auto a    = open(peer(alice, 100));
  auto made = core_->buffers().create_buffer(a, "weights", pool_, MiB, {.gid = 200});
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_TRUE(core_->buffers().publish_buffer(a, made->id).ok());
  auto const before = core_->buffers().all()[0].holders;
  auto refused      = core_->buffers().open_buffer(open(peer(bob, 200)), "weights");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find("uid 1001"), std::string_view::npos)
      << refused.status();
  EXPECT_EQ(core_->buffers().all()[0].holders, before);  // nothing changed
  EXPECT_TRUE(core_->buffers().open_buffer(open(peer(alice, 100)), "weights").ok());
}

TEST_F(Tenants, APoolsRowCountsEveryTenantsLeasesBuffersAndHolders)
{
  // Tenants split a pool between backends; the pool's row (stats, rmmctl
  // pools, /metrics) still counts what every one of them holds, whoever
  // asks for it.
  for (bool const cuda_like : {false, true}) {
    SCOPED_TRACE(cuda_like ? "a CUDA-like pool (a packed lease)" : "a host pool");
    made_.clear();
    fakes_.clear();
    make_core({}, cuda_like);
    auto a = open(peer(alice));
    auto b = open(peer(bob));
    ASSERT_TRUE(core_->leases().allocate(a, pool_, MiB, 0).ok());
    ASSERT_TRUE(core_->leases().allocate(b, pool_, MiB, 0).ok());
    auto small = core_->leases().allocate(b, pool_, 4096, 0, reclaim_policy::refuse, true);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_EQ(small->packed_block != 0, cuda_like);
    // Each tenant's buffer, opened twice more by the session that created it
    // (one process opening it twice), then closed twice: one holder each.
    for (auto const& [s, name] : {std::pair{a, "alice/kv"}, std::pair{b, "bob/kv"}}) {
      auto made = core_->buffers().create_buffer(s, name, pool_, MiB, {});
      ASSERT_TRUE(made.ok()) << made.status();
      ASSERT_TRUE(core_->buffers().publish_buffer(s, made->id).ok());
      ASSERT_TRUE(core_->buffers().open_buffer(s, name).ok());
      ASSERT_TRUE(core_->buffers().open_buffer(s, name).ok());
      ASSERT_TRUE(core_->buffers().close_buffer(s, made->id).ok());
      ASSERT_TRUE(core_->buffers().close_buffer(s, made->id).ok());
    }
    open(peer(carol));  // an observer of a tenant that holds nothing

    auto const stats = core_->pools().stats();
    ASSERT_EQ(stats.pools.size(), 1u);
    auto const& row = stats.pools[0];
    EXPECT_EQ(row.allocation_count, 3u);
    EXPECT_EQ(row.total_allocations, 3u);
    EXPECT_EQ(row.shared_buffers, 2u);
    EXPECT_EQ(row.shared_holders, 2u);
    EXPECT_GE(row.shared_bytes, 2 * MiB);
    EXPECT_GE(row.in_use_bytes, 4 * MiB + 4096);
    std::size_t in_use  = 0;
    std::size_t buffers = 0;
    for (auto const& t : row.tenants) {
      in_use += t.in_use_bytes;
      buffers += t.shared_buffers;
    }
    EXPECT_EQ(row.tenants.size(), 3u);
    EXPECT_EQ(in_use, row.in_use_bytes);
    EXPECT_EQ(buffers, row.shared_buffers);
  }
}

}  // namespace
}  // namespace rmmd::core
