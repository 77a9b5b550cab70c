// The daemon killed with SIGKILL while clients hold CUDA-pool memory (direct
// and slab) and pinned host memory, this process's sessions not reconnecting
// (reconnect_test.cpp has the default, which does): what they imported stays valid and
// writable (DESIGN.md: measured), their next call that needs the daemon fails
// with session_error saying it is gone, their processes exit cleanly, and a
// new session to a daemon started again on the same runtime directory
// allocates again. tests/integration/daemon_restart_test.cpp does the same for
// the host pool everywhere. Skips, saying why, where CUDA sees no GPU.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/text.hpp"

#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/pinned_host_memory_resource.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t MiB = std::size_t{1} << 20;

/// rmmd with a CUDA pool on GPU 0 and a pinnable host pool; in `dir` if one
/// is given (left in place).
std::unique_ptr<harness::daemon_process> start_rmmd(std::filesystem::path const& dir = {})
{
  return std::make_unique<harness::daemon_process>(harness::daemon_process::options{
      .program     = program_path("rmmd"),
      .args        = {"--cuda-pool-bytes", "2GiB", "--host-pool-bytes", "64MiB"},
      .dir_prefix  = "rmmd-restart-gpu-",
      .runtime_dir = dir,
      .log_to_file = true});
}

/// True if all `bytes` at `p` (device or host memory) hold `value`.
bool holds(void const* p, std::size_t bytes, unsigned char value)
{
  std::vector<unsigned char> host(bytes);
  if (cudaMemcpy(host.data(), p, bytes, cudaMemcpyDefault) != cudaSuccess) { return false; }
  return std::all_of(host.begin(), host.end(), [value](unsigned char c) { return c == value; });
}

constexpr rmmd::ipc_resource_options direct{.mode = rmmd::allocation_mode::direct};
constexpr rmmd::ipc_resource_options slabs{
    .mode = rmmd::allocation_mode::slab, .slab_bytes = 8 * MiB, .idle_trim = std::chrono::hours(1)};

/// One of this process's resources and the buffer it holds.
struct held_memory {
  char const* what;
  cuda::mr::any_resource<cuda::mr::device_accessible> mr;
  std::size_t bytes;
  void* ptr{};
};

TEST(DaemonRestart, DeviceClientsKeepTheirDataAndGoOnWithANewSession)
{
  if (gpu_count() < 1) { GTEST_SKIP() << "needs a CUDA GPU; CUDA sees none"; }
  // The first daemon owns the directory (removed when `first` goes, last);
  // the second starts in it after the first was killed.
  auto first        = start_rmmd();
  auto const dir    = first->runtime_dir();
  auto const env    = std::vector<std::string>{"RMMD_RUNTIME_DIR=" + dir.string()};
  auto const client = program_path("rmmd_test_client").string();

  // Client processes holding device memory, direct and through slabs.
  child_process direct_holder(
      {client, "device-hold", "67108864", "77"}, env, spawn_options{.merge_stderr = true});
  child_process slab_holder(
      {client, "slab-hold", "8388608", "78"}, env, spawn_options{.merge_stderr = true});
  ASSERT_EQ(direct_holder.read_line(60s), "ready");
  ASSERT_EQ(slab_holder.read_line(60s), "ready");

  // This process: one buffer from each kind of resource.
  auto session = std::make_unique<rmmd::session>(
      rmmd::session::options{.runtime_dir = dir,
                             .client_name = "gpu-survivor",
                             .reconnect   = std::chrono::milliseconds(0)});
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<held_memory> held;
  held.push_back({"direct", rmmd::ipc_memory_resource(*session, 0, direct), 16 * MiB});
  held.push_back({"slab", rmmd::ipc_memory_resource(*session, 0, slabs), MiB});
  held.push_back({"pinned", rmmd::pinned_host_memory_resource(*session), MiB});
  unsigned char value = 0x11;
  for (auto& h : held) {
    h.ptr = h.mr.allocate(stream, h.bytes, 256);
    ASSERT_EQ(cudaMemsetAsync(h.ptr, value++, h.bytes, stream), cudaSuccess) << h.what;
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  first->process().kill(SIGKILL);
  ASSERT_EQ(first->process().wait(), 128 + SIGKILL);

  // What was imported stays valid and writable.
  value = 0x11;
  for (auto& h : held) {
    EXPECT_TRUE(holds(h.ptr, h.bytes, value)) << h.what;
    ASSERT_EQ(cudaMemsetAsync(h.ptr, value + 0x10, h.bytes, stream), cudaSuccess) << h.what;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_TRUE(holds(h.ptr, h.bytes, value + 0x10)) << h.what;
    ++value;
  }
  // A call that needs the daemon says it is gone (a slab resource still
  // carves from the slabs it has: it needs the daemon for a new slab only).
  for (auto& h : held) {
    try {
      void* more = h.mr.allocate(stream, 32 * MiB, 256);
      h.mr.deallocate(stream, more, 32 * MiB, 256);
      ADD_FAILURE() << h.what << ": allocate succeeded with the daemon killed";
    } catch (rmmd::session_error const& e) {
      EXPECT_THAT(e.what(), HasSubstr("daemon is gone")) << h.what;
    } catch (std::exception const& e) {
      ADD_FAILURE() << h.what << ": not a session_error: " << e.what();
    }
  }
  // Frees neither throw (they are noexcept) nor crash.
  for (auto& h : held) { h.mr.deallocate(stream, h.ptr, h.bytes, 256); }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  // The client processes find their memory intact and exit 0, within a deadline.
  for (auto* holder : {&direct_holder, &slab_holder}) {
    holder->close_stdin();
    auto const out = holder->read_all(60s);
    EXPECT_THAT(out, HasSubstr("intact"));
    EXPECT_EQ(holder->wait(60s), 0) << out;
  }

  // Started again on the same directory, the daemon serves new sessions.
  auto second = start_rmmd(dir);
  {
    rmmd::session fresh(rmmd::session::options{.runtime_dir = dir, .client_name = "starts-over"});
    rmmd::ipc_memory_resource fresh_direct(fresh, 0, direct);
    rmmd::ipc_memory_resource fresh_slabs(fresh, 0, slabs);
    rmmd::pinned_host_memory_resource fresh_pinned(fresh);
    std::vector<held_memory> again;
    again.push_back({"direct", fresh_direct, 16 * MiB});
    again.push_back({"slab", fresh_slabs, MiB});
    again.push_back({"pinned", fresh_pinned, MiB});
    for (auto& h : again) {
      h.ptr = h.mr.allocate(stream, h.bytes, 256);
      ASSERT_EQ(cudaMemsetAsync(h.ptr, 0x5a, h.bytes, stream), cudaSuccess) << h.what;
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      EXPECT_TRUE(holds(h.ptr, h.bytes, 0x5a)) << h.what;
    }
    v1::Stats stats;
    auto ctx = rmmd::detail::impl_of(fresh).context();
    ASSERT_TRUE(rmmd::detail::impl_of(fresh)
                    .stub()
                    .GetStats(ctx.get(), v1::GetStatsRequest{}, &stats)
                    .ok());
    EXPECT_EQ(stats.sessions_size(), 1) << "the new daemon knows only the new session";
    for (auto& h : again) { h.mr.deallocate(stream, h.ptr, h.bytes, 256); }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  // The old session stays over: the new daemon does not take it up.
  EXPECT_THROW((void)held[0].mr.allocate(stream, MiB, 256), rmmd::session_error);
  held.clear();
  session.reset();
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// After the daemon is gone, each resource says so once at most, not once per
// allocation (host pools: tests/integration/daemon_restart_test.cpp). The
// device resource's frees go out from host functions, which drop a Free the
// daemon cannot take (UNAVAILABLE) silently: its lease went with the daemon.
TEST(DaemonRestart, DeviceResourcesSayOnceThatTheDaemonIsGone)
{
  if (gpu_count() < 1) { GTEST_SKIP() << "needs a CUDA GPU; CUDA sees none"; }
  auto daemon = start_rmmd();
  std::vector<std::string> said;
  {
    rmmd::session s(rmmd::session::options{.runtime_dir = daemon->runtime_dir(),
                                           .reconnect   = std::chrono::milliseconds(0)});
    rmmd::ipc_memory_resource mr(s, 0, direct);
    cudaStream_t stream{};
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    std::vector<void*> buffers;
    for (int i = 0; i < 8; ++i) { buffers.push_back(mr.allocate(stream, MiB, 256)); }
    daemon->process().kill(SIGKILL);
    ASSERT_EQ(daemon->process().wait(), 128 + SIGKILL);
    testing::internal::CaptureStderr();
    for (int i = 0; i < 4; ++i) { mr.deallocate(stream, buffers[i], MiB, 256); }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    said = lines_of(testing::internal::GetCapturedStderr());
    // The other 4 go with the resource's destructor.
    testing::internal::CaptureStderr();
  }
  auto const at_destruction = lines_of(testing::internal::GetCapturedStderr());
  said.insert(said.end(), at_destruction.begin(), at_destruction.end());
  EXPECT_LE(said.size(), 1u) << ::testing::PrintToString(said);
}

}  // namespace
}  // namespace rmmd::test
