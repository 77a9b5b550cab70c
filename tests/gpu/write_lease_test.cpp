// The write lease of device buffers (docs/failover.md). A standby's mapping
// of a buffer's own VMM allocation: read-only (cuMemGetAccess says
// PROT_READ) until its grant, then read-write at the same address with the
// bytes intact; on pool pointers (--cuda-shared-buffer-memory=pool) it is
// read-write from the start. And the lease between processes, 100 rounds
// (RMMD_LEASE_ROUNDS; scripts/gpu-check.sh runs fewer beside the other
// suites) each with two and with four standby processes in line: the holder ends
// by close, by exit (SIGTERM) or by SIGKILL, at a random moment; exactly
// one standby, the first in line, is granted, with the next generation,
// at the address it mapped before, reading the dead holder's stamp and KV
// bytes intact; no holder ever sees its stamp overwritten (no two writers);
// the pool's ledger is back to 0 at the end.

#include "common/driver_entry.hpp"
#include "common/vmm.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/pattern.hpp"
#include "tests/tools/text.hpp"

#include <rmmd/shared_buffer.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::StartsWith;

constexpr std::size_t kv_bytes = std::size_t{16} << 20;

/// The access `address` has on device 0, as the driver says (cuMemGetAccess).
std::optional<unsigned long long> access_of(void* address)
{
  CUresult (*get_access)(unsigned long long*, CUmemLocation const*, CUdeviceptr) = nullptr;
  if (!gpu::driver_entry_point("cuMemGetAccess", get_access)) { return std::nullopt; }
  unsigned long long flags = 0;
  CUmemLocation location{};
  location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  location.id   = 0;
  if (get_access(
          &flags, &location, static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(address))) !=
      CUDA_SUCCESS) {
    return std::nullopt;
  }
  return flags;
}

v1::PoolStats device_pool_row(v1::Stats const& stats)
{
  for (auto const& p : stats.pools()) {
    if (p.pool().backend() == v1::BACKEND_CUDA) { return p; }
  }
  return {};
}

class DeviceStandby : public ::testing::Test {
 protected:
  void start(char const* memory)
  {
    daemon_ = std::make_unique<daemon_process>(std::vector<std::string>{
        "--cuda-pool-bytes", "4GiB", "--cuda-shared-buffer-memory", memory});
    creator_.emplace(daemon_->open_session("creator"));
    auto kv = rmmd::shared_buffer::create(
        *creator_, "kv/gpu", kv_bytes, {.device = 0, .persistent = true, .allow_writers = true});
    std::vector<std::uint64_t> words(kv_bytes / 8);
    fill(words.data(), kv_bytes, 7);
    ASSERT_EQ(cudaMemcpy(kv.data(), words.data(), kv_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    kv.publish();
  }

  /// An exclusive open that waits in line: the creator's close of a pool
  /// pointer reaches the daemon in its stream's order, after start() returns.
  static rmmd::open_options exclusive(bool standby)
  {
    return {.wait      = std::chrono::seconds(60),
            .access    = rmmd::buffer_access::read_write,
            .exclusive = true,
            .standby   = standby};
  }

  static long first_mismatch_on_device(void const* data, std::uint64_t seed)
  {
    std::vector<std::uint64_t> words(kv_bytes / 8);
    EXPECT_EQ(cudaMemcpy(words.data(), data, kv_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return first_mismatch(words.data(), kv_bytes, seed);
  }

  std::unique_ptr<daemon_process> daemon_;
  std::optional<rmmd::session> creator_;
};

TEST_F(DeviceStandby, AStandbysMappingIsReadOnlyUntilItsGrantThenReadWriteAtTheSameAddress)
{
  REQUIRE_GPUS(1);
  start("own");
  auto standby_session = daemon_->open_session("standby");
  std::optional<rmmd::shared_buffer> standby;
  void* before = nullptr;
  {
    auto holder_session = daemon_->open_session("holder");
    auto holder         = rmmd::shared_buffer::open(holder_session, "kv/gpu", exclusive(false));
    ASSERT_EQ(holder.lease_generation(), 1u);
    standby = rmmd::shared_buffer::open(standby_session, "kv/gpu", exclusive(true));
    EXPECT_FALSE(standby->holds_lease());
    EXPECT_EQ(standby->lease_generation(), 0u);
    before = standby->data();
    EXPECT_EQ(access_of(before), CU_MEM_ACCESS_FLAGS_PROT_READ);
    EXPECT_EQ(first_mismatch_on_device(before, 7), -1);  // it reads before its grant
    EXPECT_THROW(static_cast<void>(standby->wait_lease(std::chrono::milliseconds(50))),
                 rmmd::deadline_error);
    EXPECT_EQ(access_of(before), CU_MEM_ACCESS_FLAGS_PROT_READ);  // nothing changed
  }  // the holder closes its exclusive open, and its session ends
  EXPECT_EQ(standby->wait_lease(std::chrono::seconds(60)), 2u);
  EXPECT_TRUE(standby->holds_lease());
  EXPECT_EQ(standby->data(), before);
  EXPECT_EQ(access_of(before), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  EXPECT_EQ(first_mismatch_on_device(before, 7), -1);
  // Writable now, in place: a kernel-side write (cudaMemset) and a copy.
  ASSERT_EQ(cudaMemset(before, 0, 8), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<std::uint64_t> words(kv_bytes / 8);
  fill(words.data(), kv_bytes, 8);
  ASSERT_EQ(cudaMemcpy(before, words.data(), kv_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(first_mismatch_on_device(before, 8), -1);
  standby->close();
  EXPECT_EQ(rmmd::shared_buffer::remove(*creator_, "kv/gpu"), 0u);
  EXPECT_TRUE(eventually([&] { return device_pool_row(daemon_->stats()).in_use_bytes() == 0u; }));
}

TEST_F(DeviceStandby, APoolPointerStandbyIsReadWriteFromTheStart)
{
  REQUIRE_GPUS(1);
  start("pool");
  auto holder_session  = daemon_->open_session("holder");
  auto standby_session = daemon_->open_session("standby");
  auto holder          = rmmd::shared_buffer::open(holder_session, "kv/gpu", exclusive(false));
  auto standby         = rmmd::shared_buffer::open(standby_session, "kv/gpu", exclusive(true));
  EXPECT_FALSE(standby.holds_lease());
  // The import of a pool pointer cannot be read-only (docs/failover.md):
  // the lease is the clients' agreement there.
  EXPECT_EQ(cudaMemset(standby.data(), 0, 8), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  void* const before = standby.data();
  holder.close();
  EXPECT_EQ(standby.wait_lease(std::chrono::seconds(60)), 2u);
  EXPECT_EQ(standby.data(), before);
}

/// How a round's holder lets go.
enum class ending { close, exit, sigkill };

class LeaseRounds : public ::testing::TestWithParam<int> {};

TEST_P(LeaseRounds, TheLeasePassesToExactlyTheFirstStandbyInLineWithTheKvIntact)
{
  REQUIRE_GPUS(1);
  int const waiters = GetParam();
  daemon_process daemon({"--cuda-pool-bytes", "4GiB"});
  auto observer = daemon.open_session("observer");
  {
    auto kv = rmmd::shared_buffer::create(
        observer, "kv/rounds", kv_bytes, {.device = 0, .persistent = true, .allow_writers = true});
    ASSERT_EQ(cudaMemset(kv.data(), 0, kv_bytes), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    kv.publish();
  }
  std::vector<std::string> const env{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  auto line_of = [&] {
    auto r = run({program_path("rmmctl").string(),
                  "--runtime-dir",
                  daemon.runtime_dir().string(),
                  "buffers",
                  "show",
                  "kv/rounds",
                  "--json"});
    return parse_json<v1::DescribeBufferResponse>(r.out).info().lease();
  };
  std::deque<std::unique_ptr<child_process>> line;  // in the order the daemon has them
  auto add_standby = [&] {
    line.push_back(std::make_unique<child_process>(
        std::vector<std::string>{program_path("rmmd_share_client").string(),
                                 "standby",
                                 "kv/rounds",
                                 "--lease-wait-ms",
                                 "600000"},
        env));
    auto said = line.back()->read_line(60s);
    ASSERT_TRUE(said) << "a standby said nothing";
    ASSERT_THAT(*said, StartsWith("standby "));
  };
  // The first holds it at once; the others stand in line behind it.
  add_standby();
  ASSERT_EQ(line.front()->read_line(60s), "leased 1 0 same kv-intact");
  auto holder = std::move(line.front());
  line.pop_front();
  for (int i = 0; i < waiters; ++i) {
    add_standby();
    ASSERT_TRUE(eventually([&] { return line_of().waiters_size() == i + 1; }, 60s));
  }
  std::mt19937 random(20261128);
  std::uint64_t generation = 1;
  char const* rounds_text  = std::getenv("RMMD_LEASE_ROUNDS");
  int const rounds = rounds_text != nullptr && *rounds_text != '\0' ? std::stoi(rounds_text) : 100;
  for (int round = 0; round < rounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto l = line_of();
    ASSERT_EQ(l.holder_pid(), holder->pid());
    ASSERT_EQ(l.generation(), generation);
    ASSERT_EQ(l.waiters_size(), waiters);
    // A random moment of the holder's life: it checks its stamp every ms.
    std::this_thread::sleep_for(std::chrono::microseconds(random() % 20000));
    switch (static_cast<ending>(round % 3)) {
      case ending::close:
        holder->close_stdin();
        EXPECT_EQ(holder->read_line(60s), "closed");  // not "overwritten"
        EXPECT_EQ(holder->wait(60s), 0);
        break;
      case ending::exit:
        holder->kill(SIGTERM);
        EXPECT_EQ(holder->wait(60s), 128 + SIGTERM);
        break;
      case ending::sigkill:
        holder->kill(SIGKILL);
        EXPECT_EQ(holder->wait(60s), 128 + SIGKILL);
        break;
    }
    // Exactly the first in line is granted: the next generation, at the
    // address it mapped before, with the last holder's stamp and KV bytes.
    ++generation;
    EXPECT_EQ(line.front()->read_line(60s),
              "leased " + std::to_string(generation) + " " + std::to_string(generation - 1) +
                  " same kv-intact");
    holder = std::move(line.front());
    line.pop_front();
    add_standby();
    ASSERT_TRUE(eventually([&] { return line_of().waiters_size() == waiters; }, 60s));
  }
  // Nobody else was granted meanwhile: every standby still in line says nothing.
  for (auto& p : line) { EXPECT_EQ(p->read_line(100ms), std::nullopt); }
  holder->close_stdin();
  EXPECT_EQ(holder->read_line(60s), "closed");
  for (auto& p : line) { p->kill(SIGKILL); }
  for (auto& p : line) { p->wait(60s); }
  EXPECT_EQ(holder->wait(60s), 0);
  EXPECT_EQ(rmmd::shared_buffer::remove(observer, "kv/rounds"), 0u);
  EXPECT_TRUE(eventually([&] { return device_pool_row(daemon.stats()).in_use_bytes() == 0u; }));
}

INSTANTIATE_TEST_SUITE_P(Standbys, LeaseRounds, ::testing::Values(2, 4), [](auto const& info) {
  return std::to_string(info.param) + "Waiters";
});

}  // namespace
}  // namespace rmmd::test
