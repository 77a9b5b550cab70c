// Buffers that outlive the daemon, on device memory: the real rmmd under
// harness::service_manager (a stand-in for systemd's fd store) makes a
// 256 MiB shared buffer as a VMM allocation of its own, hands its POSIX fd to
// the store, is SIGKILLed and started again: the new daemon imports the
// allocation from the fd the store passed back and serves it under its name,
// and a new process reads every byte. Imported by POSIX fd, and by fabric
// handle where the host has an IMEX channel (skipped otherwise, saying so).
// The driver exports no fabric handle from an allocation imported by POSIX
// fd (580.159.04, CUDA 13.0), so a fabric pool's buffer is served with the
// fabric handle the state file recorded where the driver still imports it
// (the fd in the store keeps the allocation alive); where it does not, it
// is served by its POSIX fd and the log says so. The host-pool version,
// with the failure cases: tests/integration/buffers_outlive_daemon_test.cpp.

#include "daemon/restart/state_file.hpp"
#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/kept_buffer_clients.hpp"
#include "tests/tools/kv_takeover.hpp"
#include "tests/tools/managed_rmmd.hpp"

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <cuda_runtime_api.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include <iostream>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr std::size_t buffer_bytes = std::size_t{256} << 20;
constexpr std::uint64_t seed       = 2027;

enum class import_by { posix_fd, fabric };

class DeviceBuffersOutliveDaemon : public ::testing::TestWithParam<import_by> {};

bool exports_fabric(v1::PoolStats const& pool)
{
  auto const& types = pool.pool().handle_types();
  return std::find(types.begin(), types.end(), v1::HANDLE_TYPE_FABRIC) != types.end();
}

TEST_P(DeviceBuffersOutliveDaemon, A256MiBVmmBufferKeepsEveryByteAcrossSigkillAndRestart)
{
  REQUIRE_GPUS(1);
  managed_rmmd daemon({"--cuda-pool-bytes", "2GiB", "--host-pool-bytes", "64MiB"});
  ASSERT_TRUE(daemon.start());
  auto const before = stats_of(daemon);
  auto pool         = std::find_if(before.pools().begin(), before.pools().end(), [](auto& p) {
    return p.pool().backend() == v1::BACKEND_CUDA;
  });
  ASSERT_NE(pool, before.pools().end()) << "no CUDA pool; the log:\n" << daemon.log();
  auto const pool_name = pool->pool().name();
  bool const fabric    = exports_fabric(*pool);
  if (GetParam() == import_by::fabric && !fabric) {
    GTEST_SKIP() << "the daemon's pool exports no fabric handle: no IMEX channel "
                    "(/dev/nvidia-caps-imex-channels/channel0) on this host";
  }
  std::vector<std::string> how;
  if (GetParam() == import_by::fabric) { how.emplace_back("--fabric"); }
  auto with = [&](std::vector<std::string> options) {
    options.insert(options.end(), how.begin(), how.end());
    return options;
  };

  produce(daemon,
          "team/gpu-weights",
          buffer_bytes,
          seed,
          with({"--pool", pool_name, "--persistent", "--tensors", "2", "--label", "model=m"}));
  ASSERT_TRUE(daemon.wait_for_stored(1, ".team/gpu-weights")) << daemon.log();
  std::optional<v1::BufferRegistryState> state;
  ASSERT_TRUE(eventually([&] {
    auto read = restart::read_state_file(daemon.state_file());
    if (read.ok() && *read && (*read)->buffers_size() == 1) { state = **read; }
    return state.has_value();
  }));
  auto const& record = state->buffers(0);
  EXPECT_EQ(record.kind(), v1::STORED_BUFFER_KIND_VMM_POSIX_FD);
  EXPECT_EQ(record.gpu_uuid(), pool->pool().gpu_uuid());
  EXPECT_GE(record.allocation_bytes(), buffer_bytes);
  EXPECT_EQ(record.fabric(), fabric);
  EXPECT_EQ(record.fabric_handle().size(), fabric ? 64u : 0u);

  auto killed = daemon.manager().kill_service(SIGKILL);
  ASSERT_TRUE(killed && WIFSIGNALED(*killed));
  ASSERT_TRUE(daemon.start());
  auto const log = daemon.log();
  EXPECT_THAT(log, HasSubstr("buffer 'team/gpu-weights' (268435456 bytes in pool '" + pool_name));
  EXPECT_THAT(listed(daemon), ElementsAre("team/gpu-weights"));

  // A fabric pool's buffer: a handle exported again, the recorded one, or
  // (said in words) none. Whichever, its POSIX fd serves it.
  bool const recorded =
      log.find("with the fabric handle it had before the restart") != std::string::npos;
  bool const fd_only = log.find("is served by its POSIX fd only") != std::string::npos;
  if (!fabric) { EXPECT_FALSE(recorded || fd_only) << log; }
  if (fabric) {
    std::cout << "note: after the restart the buffer's fabric handle is "
              << (fd_only    ? "gone (POSIX fd only)"
                  : recorded ? "the one the state file recorded"
                             : "exported again from the re-imported allocation")
              << "\n"
              << std::flush;
  }
  if (GetParam() == import_by::fabric && fd_only) {
    // Said in words; processes import it by its fd.
    std::cout << "note: the log says:\n" << log << std::flush;
    EXPECT_EQ(consume(daemon, "team/gpu-weights", buffer_bytes, seed, {"--pool", pool_name}),
              "verified");
  } else {
    EXPECT_EQ(consume(daemon, "team/gpu-weights", buffer_bytes, seed, with({"--pool", pool_name})),
              "verified");
  }
  auto const after = stats_of(daemon);
  EXPECT_EQ(after.restart().restarts(), 1u);
  EXPECT_EQ(after.restart().readopted_buffers(), 1u);
  EXPECT_EQ(after.restart().readopted_bytes(), record.allocation_bytes());
  EXPECT_EQ(after.restart().dropped_at_start(), 0u);
  ASSERT_FALSE(after.gpu_memory().empty());
  EXPECT_GE(after.gpu_memory(0).ledger_bytes(), record.allocation_bytes());

  // Deleted: the store lets go of the fd, and the next start serves nothing.
  auto deleted = run({program_path("rmmctl").string(),
                      "--runtime-dir",
                      daemon.runtime_dir().string(),
                      "buffers",
                      "delete",
                      "team/gpu-weights"});
  EXPECT_EQ(deleted.status, 0) << deleted.out;
  EXPECT_TRUE(daemon.wait_for_stored(0)) << daemon.log();
  ASSERT_TRUE(daemon.manager().kill_service(SIGKILL));
  ASSERT_TRUE(daemon.start());
  EXPECT_THAT(listed(daemon), IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(ImportBy,
                         DeviceBuffersOutliveDaemon,
                         ::testing::Values(import_by::posix_fd, import_by::fabric),
                         [](auto const& info) {
                           return info.param == import_by::fabric ? "fabric" : "posix_fd";
                         });

// An engine's KV cache when rmmd dies under it: a persistent device buffer
// whose write lease the engine held while rmmd was SIGKILLed comes back
// with the engine's bytes, and the standby's exclusive open after the
// restart is granted at once, with a generation above every one before it
// (the host-pool version: tests/integration/buffers_outlive_daemon_test.cpp).
TEST(DeviceKvOutlivesDaemon, AWriterLeasedKvComesBackAndItsNextWriterHasALargerGeneration)
{
  REQUIRE_GPUS(1);
  managed_rmmd daemon({"--cuda-pool-bytes", "2GiB", "--host-pool-bytes", "64MiB"});
  ASSERT_TRUE(daemon.start());
  auto const first = engine_writes_kv_and_rmmd_dies(
      daemon, "kv/engine-0", buffer_bytes, {.device = 0}, [](void* p) {
        ASSERT_EQ(cudaMemset(p, 0x6b, buffer_bytes), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      });
  ASSERT_FALSE(::testing::Test::HasFailure());
  auto standby = kv_session(daemon, "standby");
  auto kv      = standby_takes_kv(standby, "kv/engine-0");
  EXPECT_GT(kv.lease_generation(), first);
  std::vector<unsigned char> read(buffer_bytes);
  ASSERT_EQ(cudaMemcpy(read.data(), kv.data(), buffer_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(std::all_of(read.begin(), read.end(), [](unsigned char c) { return c == 0x6b; }))
      << "the KV bytes the engine wrote before rmmd's SIGKILL";
}

}  // namespace
}  // namespace rmmd::test
