// Trim and the driver's figures of a CUDA pool, through rmmctl, on a real GPU.
// Skips, saying why, where CUDA sees no GPU.

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"

#include <google/protobuf/util/json_util.h>

#include <gtest/gtest.h>

namespace rmmd::test {
namespace {

constexpr std::uint64_t MiB = 1 << 20;

template <typename Message>
Message rmmctl_json(daemon_process const& d, std::vector<std::string> args)
{
  std::vector<std::string> argv{
      program_path("rmmctl").string(), "--runtime-dir", d.runtime_dir().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--json");
  auto r = run(argv);
  EXPECT_EQ(r.status, 0) << r.out;
  Message m;
  auto status = google::protobuf::util::JsonStringToMessage(r.out, &m);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << r.out;
  return m;
}

v1::PoolStats gpu0(v1::ListPoolsResponse const& pools)
{
  for (auto const& p : pools.pools()) {
    if (p.pool().backend() == v1::BACKEND_CUDA && p.pool().device() == 0) { return p; }
  }
  ADD_FAILURE() << "no CUDA pool for device 0";
  return {};
}

TEST(CudaTrim, GivesFreedMemoryKeptByTheReleaseThresholdBackToTheDriver)
{
  if (gpu_count() < 1) { GTEST_SKIP() << "needs a CUDA GPU; CUDA sees none"; }
  // A release threshold keeps freed memory reserved: only trim gives it back.
  daemon_process daemon(
      {"--cuda-pool-bytes", "2GiB", "--cuda-release-threshold", "1GiB", "--fabric", "off"});
  auto session = daemon.open_session("trim-test");
  auto pool    = session.device_pool(0).id;
  auto a       = session.allocate(pool, 256 * MiB, 0);
  session.free(a.id);

  auto before = gpu0(rmmctl_json<v1::ListPoolsResponse>(daemon, {"pools"}));
  EXPECT_EQ(before.release_threshold_bytes(), 1024 * MiB);
  ASSERT_TRUE(before.has_backend_reserved_bytes());
  EXPECT_GE(before.backend_reserved_bytes(), 256 * MiB);
  EXPECT_EQ(before.in_use_bytes(), 0u);
  EXPECT_EQ(before.high_water_bytes(), 256 * MiB);

  auto trimmed = rmmctl_json<v1::TrimResponse>(daemon, {"trim", "--pool", "gpu0"});
  ASSERT_EQ(trimmed.pools_size(), 1);
  auto const& t = trimmed.pools(0);
  EXPECT_EQ(t.name(), "gpu0");
  EXPECT_GE(t.released_bytes(), 256 * MiB);
  EXPECT_EQ(t.backend_reserved_bytes_before() - t.backend_reserved_bytes_after(),
            t.released_bytes());
  auto after = gpu0(rmmctl_json<v1::ListPoolsResponse>(daemon, {"pools"}));
  EXPECT_LT(after.backend_reserved_bytes(), 256 * MiB);

  // Live allocations are untouched: trimming with one held keeps it.
  auto b = session.allocate(pool, 64 * MiB, 0);
  // Every pool: host, and one per GPU.
  EXPECT_EQ(rmmctl_json<v1::TrimResponse>(daemon, {"trim"}).pools_size(),
            rmmctl_json<v1::ListPoolsResponse>(daemon, {"pools"}).pools_size());
  auto held = gpu0(rmmctl_json<v1::ListPoolsResponse>(daemon, {"pools"}));
  EXPECT_GE(held.backend_reserved_bytes(), 64 * MiB);
  EXPECT_EQ(held.in_use_bytes(), 64 * MiB);
  session.free(b.id);
}

}  // namespace
}  // namespace rmmd::test
