// A session that reconnects (session::options::reconnect) keeps its
// ipc_memory_resources working while rmmd is SIGKILLed and started again on
// the same runtime directory, three times: device memory from an earlier
// daemon stays readable and writable and is freed locally (the new daemon's
// ledger never shows it), slabs from before carve on, new allocations (a
// direct one, a packed one, a new slab) come from the new daemon.
// tests/integration/reconnect_test.cpp does the same for host pools
// everywhere. Skips, saying why, where CUDA sees no GPU.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/text.hpp"

#include <rmmd/ipc_memory_resource.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr std::size_t MiB = std::size_t{1} << 20;

std::unique_ptr<harness::daemon_process> start_rmmd(std::filesystem::path const& dir = {})
{
  return std::make_unique<harness::daemon_process>(harness::daemon_process::options{
      .program = program_path("rmmd"),
      .args =
          {"--cuda-pool-bytes", "2GiB", "--host-pool-bytes", "64MiB", "--drain-timeout-ms", "0"},
      .dir_prefix  = "rmmd-reconnect-gpu-",
      .runtime_dir = dir,
      .log_to_file = true});
}

bool holds(void const* p, std::size_t bytes, unsigned char value)
{
  std::vector<unsigned char> host(bytes);
  if (cudaMemcpy(host.data(), p, bytes, cudaMemcpyDefault) != cudaSuccess) { return false; }
  return std::all_of(host.begin(), host.end(), [value](unsigned char c) { return c == value; });
}

/// The daemon's stats through `s`'s own gRPC channel.
v1::Stats stats_of(rmmd::session const& s)
{
  v1::Stats stats;
  auto ctx    = rmmd::detail::impl_of(s).context();
  auto status = rmmd::detail::impl_of(s).stub().GetStats(ctx.get(), v1::GetStatsRequest{}, &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return stats;
}

v1::SessionInfo const* session_in(v1::Stats const& stats, std::uint64_t id)
{
  for (auto const& s : stats.sessions()) {
    if (s.session_id() == id) { return &s; }
  }
  return nullptr;
}

struct held_memory {
  char const* what;
  rmmd::ipc_memory_resource* mr;
  std::size_t bytes;
  void* ptr{};
  unsigned char value{};
};

TEST(Reconnect, DeviceResourcesRideThroughThreeRestarts)
{
  if (gpu_count() < 1) { GTEST_SKIP() << "needs a CUDA GPU; CUDA sees none"; }
  auto first     = start_rmmd();
  auto const dir = first->runtime_dir();
  std::atomic<int> told{0};
  rmmd::session s(rmmd::session::options{.runtime_dir  = dir,
                                         .client_name  = "gpu-rider",
                                         .reconnect    = 30s,
                                         .on_reconnect = [&](reconnect_info const&) { ++told; }});
  rmmd::ipc_memory_resource direct(s, 0, {.mode = rmmd::allocation_mode::direct});
  rmmd::ipc_memory_resource slabs(s,
                                  0,
                                  {.mode       = rmmd::allocation_mode::slab,
                                   .slab_bytes = 8 * MiB,
                                   .idle_trim  = std::chrono::hours(1)});
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  unsigned char next_value = 0x10;
  auto make = [&](char const* what, rmmd::ipc_memory_resource& mr, std::size_t bytes) {
    held_memory h{what, &mr, bytes, mr.allocate(stream, bytes, 256), next_value++};
    EXPECT_EQ(cudaMemsetAsync(h.ptr, h.value, bytes, stream), cudaSuccess) << what;
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return h;
  };
  // Direct (a lease of its own), packed (a place in a packed block), carved.
  std::vector<held_memory> held{
      make("direct", direct, 16 * MiB), make("packed", direct, 4096), make("carved", slabs, MiB)};

  std::unique_ptr<harness::daemon_process> current;
  testing::internal::CaptureStderr();
  for (int restart = 1; restart <= 3; ++restart) {
    (current ? current : first)->process().kill(SIGKILL);
    ASSERT_EQ((current ? current : first)->process().wait(), 128 + SIGKILL);
    current.reset();
    current = start_rmmd(dir);

    // Memory from earlier daemons: still there, still writable.
    for (auto& h : held) {
      EXPECT_TRUE(holds(h.ptr, h.bytes, h.value)) << h.what << " after restart " << restart;
      h.value = static_cast<unsigned char>(h.value + 0x40);
      ASSERT_EQ(cudaMemsetAsync(h.ptr, h.value, h.bytes, stream), cudaSuccess) << h.what;
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    // Slabs from before carve on: a small allocation fits the old slab.
    auto small = make("carved from an old slab", slabs, MiB);
    EXPECT_TRUE(holds(small.ptr, small.bytes, small.value));
    slabs.deallocate(stream, small.ptr, small.bytes, 256);
    // New ones come from the new daemon (the first reconnects). The one
    // carved must not fit any slab held: RMM's pool carves from a free slab
    // of any daemon (the previous round's 16 MiB slab is free by the third
    // round), and grows by max(asked, its size). 16, 32, 64 MiB: each more
    // than every free block, so each leases a slab from the new daemon.
    auto const new_slab_bytes = (16 * MiB) << (restart - 1);
    std::vector<held_memory> fresh{make("direct", direct, 16 * MiB),
                                   make("packed", direct, 4096),
                                   make("new slab", slabs, new_slab_bytes)};
    for (auto const& h : fresh) { EXPECT_TRUE(holds(h.ptr, h.bytes, h.value)) << h.what; }
    EXPECT_EQ(told.load(), restart);
    EXPECT_EQ(s.reconnects(), static_cast<std::uint32_t>(restart));
    auto stats = stats_of(s);
    ASSERT_EQ(stats.sessions_size(), 1) << stats.DebugString();
    auto const* mine = session_in(stats, s.id());
    ASSERT_NE(mine, nullptr) << stats.DebugString();
    // The daemon counts leases: the direct allocation, the packed one (its
    // block is no lease), the new slab; nothing older (that would be 3 more).
    EXPECT_EQ(mine->allocation_count(), 3u) << stats.DebugString();
    auto const count_now = mine->allocation_count();
    auto const bytes_now = mine->bytes();

    // What earlier daemons lent is freed here, without a request.
    for (auto& h : held) { h.mr->deallocate(stream, h.ptr, h.bytes, 256); }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    held  = fresh;
    stats = stats_of(s);
    ASSERT_NE(session_in(stats, s.id()), nullptr);
    EXPECT_EQ(session_in(stats, s.id())->bytes(), bytes_now) << stats.DebugString();
    EXPECT_EQ(session_in(stats, s.id())->allocation_count(), count_now);
  }
  for (auto& h : held) { h.mr->deallocate(stream, h.ptr, h.bytes, 256); }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  slabs.trim();
  EXPECT_TRUE(eventually([&] {
    auto const* mine = session_in(stats_of(s), s.id());
    return mine != nullptr && mine->allocation_count() <= 1;  // the packed block may stay
  })) << stats_of(s).DebugString();
  auto const said = lines_of(testing::internal::GetCapturedStderr());
  ASSERT_EQ(said.size(), 3u) << ::testing::PrintToString(said);
  for (auto const& line : said) { EXPECT_THAT(line, HasSubstr("reconnected to the daemon")); }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

}  // namespace
}  // namespace rmmd::test
