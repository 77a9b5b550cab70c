// Named shared buffers of device memory between real processes, imported by
// posix fd and by fabric handle (the latter needs an IMEX channel; without one
// those cases skip, saying so). The producer writes with an asynchronous copy
// on a stream held back by a host function and publishes on that stream right
// after, while its consumers already wait: they must see every byte, which
// only a stream-ordered publication gives them. tests/integration/
// shared_buffer_test.cpp has the same lifetimes on the host pool.

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"

#include <rmmd/shared_buffer.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::StartsWith;

enum class import_by { posix_fd, fabric };
/// --cuda-shared-buffer-memory: a pointer of the pool, or an allocation of its own.
enum class buffer_memory { pool, own };

struct case_params {
  import_by import{};
  buffer_memory memory{};
};

class DeviceSharedBuffers : public ::testing::TestWithParam<case_params> {
 protected:
  void SetUp() override
  {
    REQUIRE_GPUS(1);
    // Device 0, whose pool's row the tests read, is this process's current
    // device whatever an earlier test left current.
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    daemon_ = std::make_unique<daemon_process>(
        std::vector<std::string>{"--cuda-pool-bytes",
                                 "8GiB",
                                 "--cuda-shared-buffer-memory",
                                 GetParam().memory == buffer_memory::own ? "own" : "pool"});
    env_      = {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()};
    auto s    = daemon_->open_session();
    auto pool = s.device_pool(0);
    pool_id_  = pool.id;
    if (GetParam().import == import_by::fabric && !pool.has_fabric_handle) {
      GTEST_SKIP() << "the daemon's pool exports no fabric handle: no IMEX channel "
                      "(/dev/nvidia-caps-imex-channels/channel0) on this host";
    }
    baseline_ = daemon_->stats().pools(static_cast<int>(pool_id_)).in_use_bytes();
  }

  std::unique_ptr<child_process> client(std::vector<std::string> args)
  {
    std::vector<std::string> argv{program_path("rmmd_share_client").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    if (GetParam().import == import_by::fabric) { argv.push_back("--fabric"); }
    return std::make_unique<child_process>(argv, env_);
  }

  static void expect_line(child_process& p, std::string const& prefix)
  {
    auto line = p.read_line(60s);
    ASSERT_TRUE(line) << "the client exited before saying " << prefix;
    ASSERT_THAT(*line, StartsWith(prefix));
  }

  v1::PoolStats pool() const
  {
    return daemon_->stats().pools(static_cast<int>(pool_id_));
  }
  bool back_to_baseline() const
  {
    return eventually([&] {
      auto p = pool();
      return p.in_use_bytes() == baseline_ && p.shared_buffers() == 0;
    });
  }

  std::unique_ptr<daemon_process> daemon_;
  std::vector<std::string> env_;
  std::uint32_t pool_id_{};
  std::uint64_t baseline_{};
};

TEST_P(DeviceSharedBuffers, ConsumersWaitingBeforeTheStreamPublishesSeeEveryByte)
{
  constexpr std::size_t bytes = std::size_t{64} << 20;
  auto producer = client({"produce", "gpu/batch", std::to_string(bytes), "5", "--delay-ms", "500"});
  expect_line(*producer, "created");
  // The consumers wait while the producer's stream is still held back.
  std::vector<std::unique_ptr<child_process>> consumers;
  for (int i = 0; i < 8; ++i) {
    consumers.push_back(client({"consume", "gpu/batch", std::to_string(bytes), "5"}));
  }
  expect_line(*producer, "published");
  for (auto& c : consumers) { expect_line(*c, "verified " + std::to_string(bytes)); }
  EXPECT_EQ(pool().shared_holders(), 9u);
  EXPECT_EQ(pool().shared_bytes(), bytes);

  // The producer exits; the consumers read on from their imports.
  producer->close_stdin();
  EXPECT_EQ(producer->wait(60s), 0);
  for (auto& c : consumers) {
    c->close_stdin();
    EXPECT_EQ(c->read_line(60s), "intact");
    EXPECT_EQ(c->wait(60s), 0);
  }
  EXPECT_TRUE(back_to_baseline()) << pool().DebugString();
}

TEST_P(DeviceSharedBuffers, AFourGiBPersistentBufferOutlivesItsProducerAndIsReopened)
{
  constexpr std::size_t bytes = std::size_t{4} << 30;
  auto producer               = client(
      {"produce", "gpu/weights", std::to_string(bytes), "9", "--persistent", "--delay-ms", "0"});
  expect_line(*producer, "created");
  expect_line(*producer, "published");
  producer->close_stdin();
  EXPECT_EQ(producer->wait(60s), 0);
  EXPECT_TRUE(eventually([&] { return pool().shared_holders() == 0; }));
  EXPECT_EQ(pool().shared_buffers(), 1u);
  for (int round = 0; round < 2; ++round) {  // a restarted server re-opens it
    auto consumer = client({"consume", "gpu/weights", std::to_string(bytes), "9"});
    expect_line(*consumer, "verified");
    consumer->close_stdin();
    EXPECT_EQ(consumer->read_line(60s), "intact");
    EXPECT_EQ(consumer->wait(60s), 0);
  }
  auto s = daemon_->open_session();
  EXPECT_EQ(shared_buffer::remove(s, "gpu/weights"), 0u);
  EXPECT_TRUE(back_to_baseline()) << pool().DebugString();
}

TEST_P(DeviceSharedBuffers, KilledCreatorsLeaveNothingAndKilledConsumersDropTheirHold)
{
  constexpr std::size_t bytes = std::size_t{16} << 20;
  auto unfinished = client({"produce", "gpu/half", std::to_string(bytes), "3", "--no-publish"});
  expect_line(*unfinished, "created");
  unfinished->kill(SIGKILL);
  unfinished->wait(60s);
  EXPECT_TRUE(back_to_baseline()) << pool().DebugString();

  auto producer = client({"produce", "gpu/kv", std::to_string(bytes), "4", "--delay-ms", "0"});
  expect_line(*producer, "created");
  expect_line(*producer, "published");
  auto victim   = client({"consume", "gpu/kv", std::to_string(bytes), "4"});
  auto survivor = client({"consume", "gpu/kv", std::to_string(bytes), "4"});
  expect_line(*victim, "verified");
  expect_line(*survivor, "verified");
  victim->kill(SIGKILL);
  victim->wait(60s);
  EXPECT_TRUE(eventually([&] { return pool().shared_holders() == 2; }));
  producer->close_stdin();
  EXPECT_EQ(producer->wait(60s), 0);
  survivor->close_stdin();
  EXPECT_EQ(survivor->read_line(60s), "intact");
  EXPECT_EQ(survivor->wait(60s), 0);
  EXPECT_TRUE(back_to_baseline()) << pool().DebugString();
}

TEST_P(DeviceSharedBuffers, OneProcessOpensABufferTwiceAndKeepsItUntilItsLastClose)
{
  constexpr std::size_t bytes = std::size_t{1} << 20;
  session::options o;
  o.runtime_dir      = daemon_->runtime_dir();
  o.import_by_fabric = GetParam().import == import_by::fabric;
  session s(o);
  auto made = shared_buffer::create(s, "gpu/twice", bytes);
  ASSERT_EQ(made.pool().id, pool_id_);  // the pool whose row the fixture reads
  ASSERT_EQ(cudaMemset(made.data(), 7, bytes), cudaSuccess);
  made.publish();
  auto first  = shared_buffer::open(s, "gpu/twice");
  auto second = shared_buffer::open(s, "gpu/twice");
  EXPECT_EQ(second.data(), first.data());  // one mapping per process and access
  if (GetParam().memory == buffer_memory::pool) {
    EXPECT_EQ(first.data(), made.data());  // a pool pointer: one import, read-write
  } else {
    // The creator's mapping is read-write, the readers' read-only.
    EXPECT_NE(first.data(), made.data());
  }
  made.close();
  first.close();
  unsigned char byte = 0;
  ASSERT_EQ(
      cudaMemcpy(&byte, second.span<unsigned char>().data() + bytes - 1, 1, cudaMemcpyDeviceToHost),
      cudaSuccess);
  EXPECT_EQ(byte, 7);
  EXPECT_EQ(pool().shared_holders(), 1u) << daemon_->stats().DebugString();
  second.close();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(back_to_baseline()) << pool().DebugString();
}

INSTANTIATE_TEST_SUITE_P(Imports,
                         DeviceSharedBuffers,
                         ::testing::Values(case_params{import_by::posix_fd, buffer_memory::pool},
                                           case_params{import_by::fabric, buffer_memory::pool},
                                           case_params{import_by::posix_fd, buffer_memory::own},
                                           case_params{import_by::fabric, buffer_memory::own}),
                         [](auto const& info) {
                           return std::string(info.param.import == import_by::fabric ? "Fabric"
                                                                                     : "PosixFd") +
                                  (info.param.memory == buffer_memory::own ? "OwnAllocation"
                                                                           : "PoolPointer");
                         });

}  // namespace
}  // namespace rmmd::test
