// cuda_pool_per_gpu: the settings every GPU's pool shares and the overrides
// of particular GPUs, as the file gives them (errors with line and column),
// and the pools they make once the daemon knows its GPUs (config/gpu_pools).

#include "daemon/config/config_loader.hpp"
#include "daemon/config/gpu_pools.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

namespace rmmd::config {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr std::size_t GiB = std::size_t{1} << 30;

daemon_settings parse_ok(std::string const& text)
{
  auto result = parse_config(text);
  EXPECT_TRUE(result.ok()) << (result.errors.empty() ? "" : format_error("t", result.errors[0]));
  return result.settings.value_or(daemon_settings{});
}

config_error only_error(std::string const& text)
{
  auto result = parse_config(text);
  EXPECT_FALSE(result.settings.has_value());
  EXPECT_THAT(result.errors, SizeIs(1)) << text;
  return result.errors.empty() ? config_error{} : result.errors.front();
}

auto error_at(int line, int column, std::string const& text)
{
  return AllOf(Field(&config_error::line, line),
               Field(&config_error::column, column),
               Field(&config_error::message, HasSubstr(text)));
}

/// Two GPUs as a daemon would see them: their UUIDs and PCI bus ids.
struct fake_gpu {
  std::string uuid;
  std::string pci;
};
std::vector<fake_gpu> const two_gpus{{"GPU-00000000-0000-0000-0000-000000000000", "0000:3b:00.0"},
                                     {"GPU-11111111-1111-1111-1111-111111111111", "0000:86:00.0"}};

gpu_matcher matcher(std::vector<fake_gpu> const& gpus)
{
  return [gpus](int device, std::string const& selector) {
    auto const& g = gpus.at(static_cast<std::size_t>(device));
    return selector == g.uuid || selector == g.pci;
  };
}

TEST(PerGpuPools, EveryFieldReachesTheSettings)
{
  auto const s = parse_ok(R"(
    pools { name: "host" backend: HOST }
    cuda_pool_per_gpu {
      name_prefix: "cuda"
      handle_types: [POSIX_FD]
      initial_size_bytes: 1048576
      release_threshold_bytes: 1073741824
      limit_bytes: 34359738368
      gpu_overrides { device: 1 limit_bytes: 8589934592 handle_types: [POSIX_FD, FABRIC] }
      gpu_overrides { gpu: "GPU-11111111-1111-1111-1111-111111111111" skip: true }
      gpu_overrides { gpu: "0000:3b:00.0" name: "big" release_threshold_bytes: 0
                      initial_size_bytes: 0 }
    }
  )");
  ASSERT_TRUE(s.cuda_pool_per_gpu.has_value());
  auto const& g = *s.cuda_pool_per_gpu;
  EXPECT_EQ(g.name_prefix, "cuda");
  EXPECT_EQ(g.fabric, fabric_mode::off);
  EXPECT_EQ(g.initial_size_bytes, 1048576u);
  EXPECT_EQ(g.release_threshold_bytes, GiB);
  EXPECT_EQ(g.limit_bytes, 32 * GiB);
  ASSERT_THAT(g.overrides, SizeIs(3));
  EXPECT_EQ(
      g.overrides[0],
      (gpu_pool_override{.device = 1, .fabric = fabric_mode::required, .limit_bytes = 8 * GiB}));
  EXPECT_EQ(g.overrides[0].line, 9);
  EXPECT_EQ(g.overrides[1],
            (gpu_pool_override{.gpu = "GPU-11111111-1111-1111-1111-111111111111", .skip = true}));
  // A size written as 0 replaces the shared one (it is not "left out").
  EXPECT_EQ(g.overrides[2],
            (gpu_pool_override{.gpu                     = "0000:3b:00.0",
                               .name                    = "big",
                               .initial_size_bytes      = 0,
                               .release_threshold_bytes = 0}));
}

TEST(PerGpuPools, ListedPoolsGetNoneUnlessTheFileAsks)
{
  EXPECT_FALSE(parse_ok("pools { name: \"h\" backend: HOST }\n").cuda_pool_per_gpu.has_value());
  auto const s = parse_ok("pools { name: \"h\" backend: HOST }\ncuda_pool_per_gpu {}\n");
  ASSERT_TRUE(s.cuda_pool_per_gpu.has_value());
  EXPECT_EQ(*s.cuda_pool_per_gpu, per_gpu_pools{});
  // Without pools, the built-in host pool stays.
  auto const only = parse_ok("cuda_pool_per_gpu { limit_bytes: 1073741824 }\n");
  ASSERT_THAT(only.pools, SizeIs(1));
  EXPECT_EQ(only.pools[0].name, "host");
  EXPECT_EQ(only.cuda_pool_per_gpu->limit_bytes, GiB);
}

TEST(PerGpuPools, SharedSettingErrorsNameTheField)
{
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  name_prefix: \"gpu 0\"\n}\n"),
              error_at(2, 3, "name_prefix \"gpu 0\" must be 1 to 61 letters"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu { name_prefix: \"\" }\n"),
              error_at(1, 21, "name_prefix \"\""));
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  handle_types: [FABRIC]\n}\n"),
              error_at(2, 3, "cuda_pool_per_gpu: handle_types must include POSIX_FD"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu { limit_bytes: 0 }\n"),
              error_at(1, 21, "cuda_pool_per_gpu: limit_bytes is 0"));
  EXPECT_THAT(
      only_error("cuda_pool_per_gpu {\n  limit_bytes: 1024\n  release_threshold_bytes: 2048\n}\n"),
      error_at(3, 3, "release_threshold_bytes (2048) is larger than limit_bytes (1024)"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu { capacity_bytes: 1 }\n"),
              error_at(1, 35, "no field named \"capacity_bytes\""));
}

TEST(PerGpuPools, OverrideErrorsNameTheOverrideAndField)
{
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  gpu_overrides { limit_bytes: 1024 }\n}\n"),
              error_at(2, 3, "cuda_pool_per_gpu.gpu_overrides[0] names no GPU"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  gpu_overrides { device: -1 }\n}\n"),
              error_at(2, 19, "gpu_overrides[0]: device -1 is negative"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  gpu_overrides { gpu: \"GPU-1\" }\n}\n"),
              error_at(2, 19, "gpu \"GPU-1\" is neither a GPU UUID"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu { gpu_overrides { device: 0 gpu: \"0000:3b:00.0\" } }"),
              error_at(1, 50, "oneof"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n"
                         "  gpu_overrides { gpu: \"0000:3B:00.0\" }\n"
                         "  gpu_overrides { gpu: \"0000:3b:00.0\" skip: true }\n}\n"),
              error_at(3, 19, "gpu_overrides[1] names the same GPU as the override at line 2"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n"
                         "  gpu_overrides { device: 1 }\n"
                         "  gpu_overrides { device: 1 }\n}\n"),
              error_at(3, 19, "names the same GPU as the override at line 2; keep one"));
  EXPECT_THAT(
      only_error(
          "cuda_pool_per_gpu {\n  gpu_overrides { device: 1 skip: true limit_bytes: 1 }\n}\n"),
      error_at(2, 29, "skip: true serves no pool on this GPU, so it takes no other setting"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  gpu_overrides { device: 1 name: \"gpu0\" }\n}\n"),
              error_at(2, 29, "pool name \"gpu0\" is how cuda_pool_per_gpu names another GPU's"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  gpu_overrides { device: 1 name: \"a b\" }\n}\n"),
              error_at(2, 29, "pool name \"a b\" may hold only"));
  EXPECT_THAT(only_error("pools { name: \"big\" backend: HOST }\n"
                         "cuda_pool_per_gpu {\n  gpu_overrides { device: 1 name: \"big\" }\n}\n"),
              error_at(3, 29, "pool name \"big\" is already used by the pool at line 1"));
  EXPECT_THAT(
      only_error("cuda_pool_per_gpu {\n"
                 "  gpu_overrides { device: 1 handle_types: [POSIX_FD, FABRIC, FABRIC] }\n}\n"),
      error_at(2, 29, "handle type FABRIC is listed twice"));
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  gpu_overrides { device: 1 limit_bytes: 0 }\n}\n"),
              error_at(2, 29, "gpu_overrides[0]: limit_bytes is 0"));
}

TEST(PerGpuPools, AnOverridesSizesAreCheckedWithTheSharedOnes)
{
  // Its own threshold above the shared limit: said at its threshold.
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  limit_bytes: 1024\n"
                         "  gpu_overrides { device: 1 release_threshold_bytes: 2048 }\n}\n"),
              error_at(3,
                       29,
                       "release_threshold_bytes (2048) is larger than limit_bytes (1024, from "
                       "cuda_pool_per_gpu)"));
  // Its own limit below the shared initial size: said at its limit.
  EXPECT_THAT(only_error("cuda_pool_per_gpu {\n  initial_size_bytes: 4096\n"
                         "  gpu_overrides { device: 1 limit_bytes: 1024 }\n}\n"),
              error_at(3,
                       29,
                       "initial_size_bytes (4096, from cuda_pool_per_gpu) is larger than "
                       "limit_bytes (1024)"));
  // A limit of its own that makes room for the shared threshold is fine.
  parse_ok(
      "cuda_pool_per_gpu {\n  limit_bytes: 1073741824\n  release_threshold_bytes: "
      "1073741824\n  gpu_overrides { device: 0 limit_bytes: 34359738368 }\n}\n");
}

TEST(PerGpuPools, APoolListedUnderAPerGpuNameIsRefused)
{
  EXPECT_THAT(
      only_error("pools { name: \"host\" backend: HOST }\n"
                 "pools {\n  name: \"gpu0\"\n  backend: CUDA\n}\n"
                 "cuda_pool_per_gpu {}\n"),
      error_at(3, 3, "pool name \"gpu0\" is also the name cuda_pool_per_gpu gives a GPU's pool"));
  // With another prefix it is free.
  parse_ok(
      "pools {\n  name: \"gpu0\"\n  backend: CUDA\n}\n"
      "cuda_pool_per_gpu { name_prefix: \"cuda\" }\n");
}

TEST(PerGpuPools, EveryGpuGetsAPoolWithItsOverrideApplied)
{
  auto const s    = parse_ok(R"(
    cuda_pool_per_gpu {
      limit_bytes: 34359738368
      release_threshold_bytes: 1073741824
      gpu_overrides { gpu: "GPU-11111111-1111-1111-1111-111111111111" name: "big"
                      limit_bytes: 68719476736 handle_types: [POSIX_FD] }
    }
  )");
  auto const plan = plan_per_gpu_pools(*s.cuda_pool_per_gpu, 2, matcher(two_gpus));
  EXPECT_THAT(plan.unmatched, IsEmpty());
  EXPECT_EQ(plan.error, "");
  ASSERT_THAT(plan.pools, SizeIs(2));
  EXPECT_EQ(plan.pools[0],
            (pool_settings{.name                    = "gpu0",
                           .backend                 = config::pool_kind::cuda,
                           .device                  = 0,
                           .release_threshold_bytes = GiB,
                           .limit_bytes             = 32 * GiB}));
  EXPECT_EQ(plan.pools[1],
            (pool_settings{.name                    = "big",
                           .backend                 = config::pool_kind::cuda,
                           .device                  = 1,
                           .fabric                  = fabric_mode::off,
                           .release_threshold_bytes = GiB,
                           .limit_bytes             = 64 * GiB}));
  // Eight GPUs, no overrides: gpu0 .. gpu7.
  std::vector<std::string> names;
  for (auto const& p : plan_per_gpu_pools(per_gpu_pools{}, 8, matcher({})).pools) {
    names.push_back(p.name);
  }
  EXPECT_THAT(names, ElementsAre("gpu0", "gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6", "gpu7"));
}

TEST(PerGpuPools, SkippedGpusGetNoneAndOverridesOfAbsentGpusAreReported)
{
  auto const s    = parse_ok(R"(
    cuda_pool_per_gpu {
      gpu_overrides { device: 0 skip: true }
      gpu_overrides { device: 5 limit_bytes: 1024 }
      gpu_overrides { gpu: "GPU-22222222-2222-2222-2222-222222222222" skip: true }
    }
  )");
  auto const plan = plan_per_gpu_pools(*s.cuda_pool_per_gpu, 2, matcher(two_gpus));
  EXPECT_EQ(plan.error, "");
  ASSERT_THAT(plan.pools, SizeIs(1));
  EXPECT_EQ(plan.pools[0].name, "gpu1");
  EXPECT_THAT(
      plan.unmatched,
      ElementsAre("cuda_pool_per_gpu.gpu_overrides at line 4 (device 5) names no GPU that CUDA "
                  "shows this daemon",
                  "cuda_pool_per_gpu.gpu_overrides at line 5 (gpu "
                  "GPU-22222222-2222-2222-2222-222222222222) names no GPU that CUDA shows this "
                  "daemon"));
}

TEST(PerGpuPools, TwoOverridesOfOneGpuByDifferentNamesStopThePlan)
{
  auto const s    = parse_ok(R"(
    cuda_pool_per_gpu {
      gpu_overrides { device: 1 limit_bytes: 1024 }
      gpu_overrides { gpu: "0000:86:00.0" limit_bytes: 2048 }
    }
  )");
  auto const plan = plan_per_gpu_pools(*s.cuda_pool_per_gpu, 2, matcher(two_gpus));
  EXPECT_EQ(plan.error,
            "cuda_pool_per_gpu.gpu_overrides at line 3 (device 1) and "
            "cuda_pool_per_gpu.gpu_overrides at line 4 (gpu 0000:86:00.0) both name CUDA device "
            "1; keep one");
}

TEST(PerGpuPools, TheShippedConfigServesEveryGpu)
{
  auto const file   = std::filesystem::path(RMMD_SOURCE_DIR) / "deploy/rmmd.conf.example";
  auto const result = load_config_file(file);
  ASSERT_TRUE(result.ok()) << (result.errors.empty() ? "" : format_error(file, result.errors[0]));
  auto const& s = *result.settings;
  ASSERT_TRUE(s.cuda_pool_per_gpu.has_value());
  for (int gpus : {1, 2, 8}) {
    auto const plan = plan_per_gpu_pools(*s.cuda_pool_per_gpu, gpus, matcher({}));
    ASSERT_THAT(plan.pools, SizeIs(gpus));
    EXPECT_EQ(plan.pools.back().name, "gpu" + std::to_string(gpus - 1));
    EXPECT_EQ(plan.pools.back().device, gpus - 1);
  }
}

}  // namespace
}  // namespace rmmd::config
