// The configuration the packages ship (deploy/rmmd.conf.example, installed
// as /etc/rmmd/rmmd.conf) on a real node: every GPU CUDA sees gets a pool,
// as `rmmctl pools` and a session show, and each pool lends memory of its
// own GPU. Skips, saying why, where CUDA sees no GPU.

#include "common/gpu_identity.hpp"
#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"

#include <rmmd/ipc_memory_resource.hpp>

#include <rmm/device_uvector.hpp>

#include <google/protobuf/util/json_util.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

namespace rmmd::test {
namespace {

namespace fs = std::filesystem;

/// The shipped file: $RMMD_SHIPPED_CONFIG, else deploy/ of the source tree
/// this was built from, else deploy/ below the current directory (a copy of
/// the tree beside a bundle).
std::optional<fs::path> shipped_config()
{
  if (char const* env = std::getenv("RMMD_SHIPPED_CONFIG")) { return fs::path(env); }
  for (auto const& dir : {fs::path(RMMD_SOURCE_DIR), fs::current_path()}) {
    if (auto p = dir / "deploy/rmmd.conf.example"; fs::exists(p)) { return p; }
  }
  return std::nullopt;
}

v1::ListPoolsResponse rmmctl_pools(daemon_process const& d)
{
  auto r = run({program_path("rmmctl").string(),
                "--runtime-dir",
                d.runtime_dir().string(),
                "pools",
                "--json"});
  EXPECT_EQ(r.status, 0) << r.out;
  v1::ListPoolsResponse m;
  auto status = google::protobuf::util::JsonStringToMessage(r.out, &m);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << r.out;
  return m;
}

TEST(ShippedConfig, EveryGpuCudaSeesGetsAPool)
{
  REQUIRE_GPUS(1);
  auto const config = shipped_config();
  if (!config) {
    GTEST_SKIP() << "the shipped config is not here: set RMMD_SHIPPED_CONFIG to "
                    "deploy/rmmd.conf.example, or run from the source tree";
  }
  int const gpus = gpu_count();
  daemon_process daemon({"--config", config->string()});

  // rmmctl pools: the host pool, then gpu0 .. gpuN-1, each on its own GPU.
  auto const listed = rmmctl_pools(daemon);
  std::set<std::string> uuids;
  int cuda_pools = 0;
  for (auto const& p : listed.pools()) {
    if (p.pool().backend() != v1::BACKEND_CUDA) { continue; }
    int const d = p.pool().device();
    EXPECT_EQ(p.pool().name(), "gpu" + std::to_string(d));
    auto const id = gpu::identify(d);
    ASSERT_TRUE(id.has_value()) << "device " << d;
    EXPECT_EQ(p.pool().gpu_uuid(), id->uuid) << "device " << d;
    uuids.insert(p.pool().gpu_uuid());
    ++cuda_pools;
  }
  EXPECT_EQ(cuda_pools, gpus) << "CUDA sees " << gpus << " GPU(s); rmmctl pools:\n"
                              << listed.DebugString();
  EXPECT_EQ(uuids.size(), static_cast<std::size_t>(gpus)) << "two pools on one GPU";

  // Each GPU's pool lends memory on that GPU, through the client library.
  auto session = daemon.open_session("shipped-config");
  for (int d = 0; d < gpus; ++d) {
    ASSERT_EQ(cudaSetDevice(d), cudaSuccess);
    rmmd::ipc_memory_resource mr(session, d);
    cuda::stream_ref stream{cudaStream_t{}};
    rmm::device_uvector<int> v(1 << 20, stream, mr);
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, v.data()), cudaSuccess);
    EXPECT_EQ(attributes.device, d);
    ASSERT_EQ(cudaMemsetAsync(v.data(), 0, v.size() * sizeof(int), stream.get()), cudaSuccess);
    EXPECT_EQ(v.element(v.size() - 1, stream), 0);
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

}  // namespace
}  // namespace rmmd::test
