// Leases larger than 4 GiB, as engines ask for a KV cache or a weights
// arena in one piece: a client process (rmmd_test_client device-hold /
// slab-hold; the slab resource leases what exceeds a slab directly) gets
// the lease, fills it, and reads every byte back. In a process of its own,
// so that a crash fails this test and not the shard it runs in: on an H200
// a 6 GiB lease ended its client on SIGSEGV (a call through a null pointer,
// inside the allocation) while 4 GiB + 2 MiB worked, in both modes.

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

TEST_P(LargeLeases, AClientProcessWritesAndReadsBackEveryByte)
{
  REQUIRE_GPUS(1);
  auto const [command, bytes] = GetParam();
  daemon_process daemon({"--cuda-pool-bytes", "8GiB"});
  child_process client(
      {program_path("rmmd_test_client").string(), command, std::to_string(bytes), "77"},
      {"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()},
      spawn_options{.merge_stderr = true});
  client.close_stdin();  // it checks its bytes and exits once it said "ready"
  auto const out = client.read_all(120s);
  EXPECT_THAT(out, HasSubstr("ready"));
  EXPECT_THAT(out, HasSubstr("intact"));
  EXPECT_EQ(client.wait(60s), 0) << out;
  EXPECT_TRUE(eventually([&] { return in_use_anywhere(daemon.stats()) == 0u; }))
      << "the lease went back with its client";
}

INSTANTIATE_TEST_SUITE_P(Sizes,
                         LargeLeases,
                         ::testing::Combine(::testing::Values("device-hold", "slab-hold"),
                                            ::testing::Values(4 * GiB + 2 * MiB, 6 * GiB)),
                         [](auto const& info) {
                           return std::string(std::get<0>(info.param) == std::string("device-hold")
                                                  ? "direct"
                                                  : "slab") +
                                  "_" + std::to_string(std::get<1>(info.param) / MiB) + "MiB";
                         });

}  // namespace
}  // namespace rmmd::test
