// daemon_core's admin side: trim (who may, which pools, what the backend
// gave back), the backend's release threshold in the stats, the high-water
// mark, and the draining flag Health reports.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"
#include "tests/core/fake_pool_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t MiB = std::size_t{1} << 20;

pool_config config(std::string name)
{
  return pool_config{.name = std::move(name), .device = -1, .handle_types = {}};
}

peer_credentials peer(uid_t uid)
{
  return peer_credentials{.pid = 42, .uid = uid, .gid = 100};
}

class Admin : public ::testing::Test {
 protected:
  Admin()
  {
    core_options o;
    o.access.uids = {0, 1000, 2000};
    o.admin_uid   = 1000;  // as if the daemon ran as uid 1000
    core_         = std::make_unique<daemon_core>(std::move(o));
    core_->pools().add_pool(config("host"),
                            std::make_unique<backends::host::host_backend>("h", 16 * MiB));
    // A pool that says it holds 10 MiB from the system, gives 6 MiB of them
    // back on trim(), and has a release threshold.
    auto gpu = std::make_unique<fake_pool_backend>(fake_pool_backend::options{
        .capacity = 16 * MiB, .traits = device_like_traits, .release_threshold = 4 * MiB});
    backend_ = gpu.get();
    backend_->set_reserved(10 * MiB, 6 * MiB);
    core_->pools().add_pool(config("gpu"), std::move(gpu));
  }
  session_id open(uid_t uid)
  {
    return core_->sessions().open_session(peer(uid), "cmd", "client").value().id;
  }

  std::unique_ptr<daemon_core> core_;
  fake_pool_backend* backend_{};  // owned by core_
};

TEST_F(Admin, TrimReportsWhatEveryPoolGaveBack)
{
  auto trimmed = core_->pools().trim(open(1000), {});
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  ASSERT_EQ(trimmed->size(), 2u);
  EXPECT_EQ((*trimmed)[0].name, "host");
  EXPECT_EQ((*trimmed)[0].released_bytes, 0u);  // the host backend punches holes on free
  EXPECT_FALSE((*trimmed)[0].backend_reserved_before.has_value());
  EXPECT_EQ((*trimmed)[1].pool, 1u);
  EXPECT_EQ((*trimmed)[1].released_bytes, 6 * MiB);
  EXPECT_EQ((*trimmed)[1].backend_reserved_before, 10 * MiB);
  EXPECT_EQ((*trimmed)[1].backend_reserved_after, 4 * MiB);
  EXPECT_EQ(backend_->trim_calls(), 1);
}

TEST_F(Admin, RootMayTrimOneChosenPool)
{
  auto trimmed = core_->pools().trim(open(0), {1});
  ASSERT_TRUE(trimmed.ok()) << trimmed.status();
  ASSERT_EQ(trimmed->size(), 1u);
  EXPECT_EQ((*trimmed)[0].name, "gpu");
}

TEST_F(Admin, OtherUidsMayNotTrim)
{
  auto trimmed = core_->pools().trim(open(2000), {});
  ASSERT_FALSE(trimmed.ok());
  EXPECT_EQ(trimmed.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(trimmed.status().message()),
              HasSubstr("uid 2000 may not trim pools; only root (uid 0) and the daemon's own uid "
                        "1000 may"));
  EXPECT_EQ(backend_->trim_calls(), 0);
}

TEST_F(Admin, AnUnknownPoolTrimsNothing)
{
  auto trimmed = core_->pools().trim(open(1000), {1, 5});
  ASSERT_FALSE(trimmed.ok());
  EXPECT_EQ(trimmed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(trimmed.status().message()),
              HasSubstr("unknown pool id 5; this daemon serves pool ids 0 to 1"));
  EXPECT_EQ(backend_->trim_calls(), 0);  // pool 1 came first, and was not trimmed either
}

TEST_F(Admin, ABackendFailureIsReportedWithThePoolName)
{
  backend_->fail_trim(absl::InternalError("cudaMemPoolTrimTo: cudaErrorInvalidValue"));
  auto trimmed = core_->pools().trim(open(0), {});
  ASSERT_FALSE(trimmed.ok());
  EXPECT_EQ(trimmed.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(trimmed.status().message()),
              HasSubstr("trim pool 'gpu': cudaMemPoolTrimTo: cudaErrorInvalidValue"));
}

TEST_F(Admin, AClosedSessionCannotTrim)
{
  auto id = open(0);
  core_->close_session(id);
  EXPECT_EQ(core_->pools().trim(id, {}).status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(Admin, StatsCarryTheReleaseThresholdAndTheHighWaterMark)
{
  auto s = open(1000);
  auto a = core_->leases().allocate(s, 0, 3 * MiB, 0);
  auto b = core_->leases().allocate(s, 0, 2 * MiB, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(core_->leases().free(s, a->id).ok());
  auto c = core_->leases().allocate(s, 0, 1 * MiB, 0);
  ASSERT_TRUE(c.ok());
  auto stats = core_->pools().stats();
  EXPECT_EQ(stats.pools[0].in_use_bytes, 3 * MiB);
  EXPECT_EQ(stats.pools[0].high_water_bytes, 5 * MiB);  // the most at once, not the sum
  EXPECT_EQ(stats.pools[0].total_allocations, 3u);
  EXPECT_FALSE(stats.pools[0].release_threshold_bytes.has_value());
  EXPECT_EQ(stats.pools[1].release_threshold_bytes, 4 * MiB);
  EXPECT_EQ(stats.pools[1].backend_reserved_bytes, 10 * MiB);
}

TEST_F(Admin, DrainingIsVisible)
{
  EXPECT_FALSE(core_->draining());
  core_->begin_drain();
  EXPECT_TRUE(core_->draining());
}

TEST(CoreOptions, TheAdminUidIsTheDaemonsOwnByDefault)
{
  EXPECT_EQ(core_options{}.admin_uid, ::geteuid());
}

}  // namespace
}  // namespace rmmd::core
