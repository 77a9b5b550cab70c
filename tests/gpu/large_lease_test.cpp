// Allocations larger than 4 GiB, as engines ask for a KV cache or a weights
// arena in one piece. The driver of CUDA 13.0 kills a process that imports
// a pool pointer of about 5.5 GiB or more (SIGSEGV, a call through a null
// pointer inside cudaMemPoolImportPointer; 5 GiB works: an H200,
// bench/experiments/large_pool_import.cu), so ipc_memory_resource serves
// what exceeds own_allocation_above (4 GiB) as an allocation of its own and
// never leases a slab larger than that. Each case runs in a client process
// (rmmd_test_client), so that a crash fails this test and not its shard.

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/child_process.hpp"
#include "tests/tools/daemon_process.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace rmmd::test {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t GiB = std::size_t{1} << 30;

/// Bytes in use in every pool of the daemon.
std::uint64_t in_use_anywhere(v1::Stats const& stats)
{
  std::uint64_t bytes = 0;
  for (auto const& p : stats.pools()) { bytes += p.in_use_bytes(); }
  return bytes;
}

class LargeLeases : public ::testing::TestWithParam<std::tuple<char const*, std::size_t>> {};

TEST_P(LargeLeases, AClientProcessWritesAndReadsBackEveryByteAndTheDaemonCountsIt)
{
  REQUIRE_GPUS(1);
  auto const [command, bytes] = GetParam();
  daemon_process daemon({"--cuda-pool-bytes", "8GiB"});
  child_process client(
      {program_path("rmmd_test_client").string(), command, std::to_string(bytes), "77"},
      {"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()},
      spawn_options{.merge_stderr = true});
  auto const ready = client.read_line(120s).value_or("(nothing)");
  ASSERT_EQ(ready, "ready") << client.read_all(1s);
  EXPECT_GE(in_use_anywhere(daemon.stats()), bytes) << "the pool's ledger counts it while held";
  client.close_stdin();  // it checks its bytes and exits
  auto const out = client.read_all(120s);
  EXPECT_THAT(out, HasSubstr("intact"));
  EXPECT_EQ(client.wait(60s), 0) << out;
  EXPECT_TRUE(eventually([&] { return in_use_anywhere(daemon.stats()) == 0u; }))
      << "it went back with its client";
}

// 4 GiB: the largest a pool pointer serves; above it, allocations of their
// own, up to most of the pool.
INSTANTIATE_TEST_SUITE_P(
    Sizes,
    LargeLeases,
    ::testing::Combine(::testing::Values("device-hold", "slab-hold"),
                       ::testing::Values(4 * GiB, 4 * GiB + 2 * MiB, 6 * GiB, 7 * GiB + 512 * MiB)),
    [](auto const& info) {
      return std::string(std::get<0>(info.param) == std::string("device-hold") ? "direct"
                                                                               : "slab") +
             "_" + std::to_string(std::get<1>(info.param) / MiB) + "MiB";
    });

TEST(LargeSlabs, ACarvingPoolThatGrowsPast10GiBLeasesNoSlabAbove4GiB)
{
  REQUIRE_GPUS(1);
  // 80 x 256 MiB: RMM's pool grows by what it holds so far (64 MiB, 256,
  // 320, 640 MiB, 1.25, 2.5, 5 and then 10 GiB), which the 24 GiB pool has
  // room for; without the cap, the 10 GiB slab's import would kill the client.
  daemon_process daemon({"--cuda-pool-bytes", "24GiB"});
  child_process client(
      {program_path("rmmd_test_client").string(), "slab-fill", "80", std::to_string(256 * MiB)},
      {"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()},
      spawn_options{.merge_stderr = true});
  auto const out = client.read_all(180s);
  EXPECT_THAT(out, HasSubstr("filled 80"));
  EXPECT_EQ(client.wait(60s), 0) << out;
  EXPECT_TRUE(eventually([&] { return in_use_anywhere(daemon.stats()) == 0u; }))
      << "its slabs went back with it";
}

// A shared buffer above 4 GiB of a daemon that serves buffers as pointers
// of the pool (--cuda-shared-buffer-memory=pool) is an allocation of its
// own: its consumer, another process, would die importing a 6 GiB pool
// pointer.
TEST(LargeBuffers, A6GiBBufferOfAPoolPointerDaemonReachesAnotherProcessIntact)
{
  REQUIRE_GPUS(1);
  daemon_process daemon({"--cuda-pool-bytes", "8GiB", "--cuda-shared-buffer-memory", "pool"});
  std::vector<std::string> const env{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  auto const share = program_path("rmmd_share_client").string();
  auto const bytes = std::to_string(6 * GiB);
  child_process producer(
      {share, "produce", "big/kv", bytes, "41"}, env, spawn_options{.merge_stderr = true});
  std::string line;
  while (auto l = producer.read_line(120s)) {
    if ((line = *l) == "published") { break; }
  }
  ASSERT_EQ(line, "published") << producer.read_all(1s);
  child_process consumer(
      {share, "consume", "big/kv", bytes, "41"}, env, spawn_options{.merge_stderr = true});
  auto const verified = consumer.read_line(180s).value_or("(nothing)");
  EXPECT_THAT(verified, ::testing::StartsWith("verified " + bytes)) << consumer.read_all(1s);
  consumer.close_stdin();
  EXPECT_EQ(consumer.wait(120s), 0) << consumer.read_all(1s);
  producer.close_stdin();
  EXPECT_EQ(producer.wait(120s), 0) << producer.read_all(1s);
  EXPECT_TRUE(eventually([&] { return in_use_anywhere(daemon.stats()) == 0u; }))
      << "the buffer went with its last holder";
}

}  // namespace
}  // namespace rmmd::test
