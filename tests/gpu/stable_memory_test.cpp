// Address-stable memory, sleep and wake on a real GPU (docs/sleep.md), with
// the real daemon: addresses that stay across 100 sleep/wake cycles with the
// backed-up bytes restored bitwise; a CUDA graph captured before a sleep
// replaying after the wake with the same output; a backup restored into a
// new process after its engine was SIGKILLed asleep; another uid served
// from the memory a sleeper gave back; a wake that cannot fit failing at its
// deadline with nothing mapped; the C ABI's process-wide stable resource
// that PyTorch's pluggable allocator loads (rmmd.memory_saver), its thread
// tags and its backups read while asleep; memory a sleep gave back kept by
// the daemon (--keep-released-memory) for its uid's next allocation, in
// pieces, never another uid's, and given back to a pool allocation that
// finds the GPU full; named backups that survive a
// SIGKILL of rmmd under a stand-in for systemd's fd store
// (tools/managed_rmmd.hpp), for an engine killed asleep and for one alive
// across the restart; and the pools back at 0 after each. Skips without a
// GPU (and the other-uid test without root).

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/device_pattern.hpp"
#include "tests/tools/kept_buffer_clients.hpp"
#include "tests/tools/managed_rmmd.hpp"
#include "tests/tools/pattern.hpp"
#include "tests/tools/test_users.hpp"

#include <rmmd/rmmd.h>
#include <rmmd/admin.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/stable_memory_resource.hpp>

#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t MiB = std::size_t{1} << 20;

class StableMemory : public ::testing::Test {
 protected:
  void SetUp() override
  {
    REQUIRE_GPUS(1);
    ::signal(SIGPIPE, SIG_IGN);  // child_process::write_line's requirement
  }

  /// rmmd (as `user`, root if empty) with a CUDA pool of `gpu_pool` on each
  /// GPU and a host pool for the backups; `extra` flags.
  void start(std::string const& gpu_pool    = "4GiB",
             std::vector<std::string> extra = {},
             std::string const& user        = {})
  {
    std::vector<std::string> args{
        "--cuda-pool-bytes", gpu_pool, "--fabric", "off", "--host-pool-bytes", "2GiB"};
    args.insert(args.end(), extra.begin(), extra.end());
    daemon_  = std::make_unique<daemon_process>(std::move(args), user);
    session_ = std::make_unique<rmmd::session>(daemon_->open_session("stable-test"));
    env_     = {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()};
  }

  /// start() as deployed: rmmd as `rmmd`, root's session, and client_user_b
  /// a member of rmmd's group (the sockets'), allowed too. Why it cannot
  /// (no root, a program those users cannot reach), or empty.
  std::string start_as_deployed(std::string const& gpu_pool, std::vector<std::string> extra = {})
  {
    auto daemon_account = ensure_user(daemon_user, daemon_group);
    auto b              = ensure_user(client_user_b, daemon_group);
    if (!daemon_account || !b) { return users_need_root(); }
    for (auto const& [user, program] :
         {std::pair{*daemon_account, "rmmd"}, std::pair{*b, "rmmd_stable_client"}}) {
      if (auto why = unreachable_for(user, program_path(program)); !why.empty()) { return why; }
    }
    extra.insert(extra.begin(), {"--allow-uid", "0", "--allow-gid", std::to_string(b->gid)});
    start(gpu_pool, extra, daemon_user);
    return {};
  }

  std::size_t in_use(std::string const& pool) const
  {
    auto const stats = daemon_->stats();
    for (auto const& p : stats.pools()) {
      if (p.pool().name() == pool) { return p.in_use_bytes(); }
    }
    ADD_FAILURE() << "no pool " << pool;
    return 0;
  }
  std::string gpu_pool() const
  {
    return session_->device_pool(0).name;
  }
  /// Address-stable memory the daemon keeps given back on GPU 0.
  std::size_t spare() const
  {
    auto const stats = daemon_->stats();
    return stats.gpu_memory().empty() ? 0 : stats.gpu_memory(0).spare_bytes();
  }

  std::unique_ptr<child_process> client(std::vector<std::string> args, std::string user = {}) const
  {
    args.insert(args.begin(), program_path("rmmd_stable_client").string());
    return std::make_unique<child_process>(std::move(args), env_, spawn_options{.user = user});
  }

  static std::vector<std::byte> read_back(void const* p, std::size_t bytes)
  {
    std::vector<std::byte> out(bytes);
    EXPECT_EQ(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

  std::unique_ptr<daemon_process> daemon_;
  std::unique_ptr<rmmd::session> session_;
  std::vector<std::string> env_;
};

TEST_F(StableMemory, AddressesStayAndBackupsComeBackBitwiseAcross100Cycles)
{
  start();
  rmmd::stable_memory_resource mr(*session_, 0, "weights");
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  constexpr std::size_t weights_bytes = 64 * MiB;
  constexpr std::size_t kv_bytes      = 128 * MiB;
  void* weights                       = mr.allocate_sync(weights_bytes, 256);
  void* kv                            = nullptr;
  {
    rmmd::scoped_stable_tag tag("kv");
    kv = mr.allocate_sync(kv_bytes, 256);
  }
  EXPECT_EQ(mr.tag_of(weights), "weights");
  EXPECT_EQ(mr.tag_of(kv), "kv");
  device_fill(weights, weights_bytes, 36, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  auto const pool = gpu_pool();
  EXPECT_EQ(in_use(pool), weights_bytes + kv_bytes);
  EXPECT_TRUE(mr.keeps_backups());
  for (int cycle = 0; cycle < 100; ++cycle) {
    device_fill(kv, kv_bytes, 1000 + cycle, stream);
    // New weights every cycle: the backup's room kept from the last wake
    // must take this sleep's bytes, not give back the last ones.
    if (cycle > 0) { device_fill(weights, weights_bytes, 36 + cycle, stream); }
    EXPECT_EQ(mr.sleep({"weights"}, rmmd::sleep_backup::host, {}, stream), weights_bytes);
    EXPECT_EQ(mr.sleep({"kv"}), kv_bytes);
    EXPECT_FALSE(mr.is_awake(weights));
    if (cycle == 0) { EXPECT_EQ(in_use(pool), 0u) << "the ledger shows the memory free"; }
    EXPECT_EQ(mr.wake({}, std::chrono::seconds(10), stream), weights_bytes + kv_bytes);
    ASSERT_TRUE(mr.is_awake(weights) && mr.is_awake(kv));
    ASSERT_EQ(device_first_mismatch(weights, weights_bytes, 36 + cycle, stream), -1)
        << "cycle " << cycle;
    if (cycle == 0) { EXPECT_EQ(in_use("host"), weights_bytes) << "the backup's room is kept"; }
    // kv had no backup: writable again at the same address.
    device_fill(kv, kv_bytes, 2000 + cycle, stream);
    ASSERT_EQ(device_first_mismatch(kv, kv_bytes, 2000 + cycle, stream), -1);
  }
  mr.deallocate_sync(weights, weights_bytes, 256);
  mr.deallocate_sync(kv, kv_bytes, 256);
  cudaStreamDestroy(stream);
  EXPECT_EQ(in_use(pool), 0u);
  EXPECT_EQ(in_use("host"), 0u);
}

// An engine's weights are hundreds of tensors: a sleep and a wake of 600
// allocations (their fds come in answers of up to 250; the client once had
// room for 4 and failed "4 fds for 60 allocations").
TEST_F(StableMemory, SixHundredAllocationsSleepAndWakeWithTheirBackups)
{
  start();
  rmmd::stable_memory_resource mr(*session_, 0, "weights");
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  constexpr std::size_t count = 600;
  constexpr std::size_t bytes = 2 * MiB;
  std::vector<void*> weights;
  for (std::size_t i = 0; i < count; ++i) {
    weights.push_back(mr.allocate_sync(bytes, 256));
    device_fill(weights.back(), bytes, static_cast<int>(i), stream);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // Cycles 0 and 1 keep the backups' room (the default), 2 gives it back,
  // 3 makes new backups and keeps them again.
  for (int cycle = 0; cycle < 4; ++cycle) {
    mr.keep_backups(cycle != 2);
    EXPECT_EQ(mr.sleep({"weights"}, rmmd::sleep_backup::host, {}, stream), count * bytes);
    EXPECT_EQ(in_use(gpu_pool()), 0u);
    EXPECT_EQ(in_use("host"), count * bytes);
    EXPECT_EQ(mr.wake({}, std::chrono::seconds(30), stream), count * bytes);
    EXPECT_EQ(in_use("host"), cycle == 2 ? 0u : count * bytes) << "cycle " << cycle;
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_EQ(device_first_mismatch(weights[i], bytes, static_cast<int>(i), stream), -1)
          << "allocation " << i << ", cycle " << cycle;
    }
  }
  for (auto* p : weights) { mr.deallocate_sync(p, bytes, 256); }
  cudaStreamDestroy(stream);
  EXPECT_EQ(in_use(gpu_pool()), 0u);
  EXPECT_EQ(in_use("host"), 0u);
}

TEST_F(StableMemory, AGraphCapturedBeforeSleepReplaysBitwiseAfterWake)
{
  start();
  rmmd::stable_memory_resource mr(*session_, 0, "weights");
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  constexpr std::size_t bytes = 32 * MiB;
  void* in                    = mr.allocate_tagged("weights", bytes);
  void* out                   = mr.allocate_tagged("activations", 2 * bytes);
  device_fill(in, bytes, 99, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // The graph holds both addresses: a copy out of `in`, and a pattern of its own.
  cudaGraph_t graph{};
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(static_cast<char*>(out) + bytes, 0x5a, bytes, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec{};
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  auto const before = read_back(out, 2 * bytes);

  mr.sleep({"weights"}, rmmd::sleep_backup::host, {}, stream);
  mr.sleep({"activations"});
  EXPECT_EQ(in_use(gpu_pool()), 0u);
  mr.wake({}, std::chrono::seconds(10), stream);
  ASSERT_EQ(cudaMemsetAsync(out, 0, 2 * bytes, stream), cudaSuccess);  // no stale luck
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  auto const after = read_back(out, 2 * bytes);
  EXPECT_EQ(std::memcmp(before.data(), after.data(), before.size()), 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  mr.deallocate_sync(in, bytes, 256);
  mr.deallocate_sync(out, 2 * bytes, 256);
  cudaStreamDestroy(stream);
  EXPECT_EQ(in_use(gpu_pool()), 0u);
}

TEST_F(StableMemory, ABackupIsRestoredIntoANewProcessAfterItsEngineWasKilledAsleep)
{
  start();
  constexpr std::size_t bytes = 256 * MiB;
  auto engine                 = client({"sleep", "engine-0", std::to_string(bytes), "4242"});
  ASSERT_EQ(engine->read_line(60s).value_or("(nothing: it exited)"), "asleep");
  engine->kill(SIGKILL);
  (void)engine->wait(20s);
  // The daemon keeps the backup under its name once the session is gone.
  EXPECT_TRUE(eventually([&] {
    return rmmd::admin(*session_).sleepers_json().find("\"session_id\":\"0\"") != std::string::npos;
  })) << rmmd::admin(*session_).sleepers_json();
  EXPECT_EQ(in_use(gpu_pool()), 0u);
  EXPECT_EQ(in_use("host"), bytes);

  auto restorer = client({"restore", "engine-0", std::to_string(bytes), "4242"});
  EXPECT_EQ(restorer->read_line(60s).value_or("(nothing: it exited)"), "intact");
  EXPECT_EQ(restorer->wait(20s), 0);
  EXPECT_TRUE(eventually([&] { return in_use(gpu_pool()) == 0 && in_use("host") == 0; }));
}

TEST_F(StableMemory, NamedBackupsSurviveASigkillOfRmmdAndAreRestoredBitwise)
{
  managed_rmmd daemon(
      {"--cuda-pool-bytes", "4GiB", "--fabric", "off", "--host-pool-bytes", "2GiB"});
  ASSERT_TRUE(daemon.start());
  env_        = {"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  auto in_use = [&](bool host) {
    std::size_t bytes = 0;
    auto const stats  = stats_of(daemon);
    for (auto const& p : stats.pools()) {
      if ((p.pool().backend() == v1::BACKEND_HOST) == host) { bytes += p.in_use_bytes(); }
    }
    return bytes;
  };
  constexpr std::size_t bytes       = 256 * MiB;
  constexpr std::size_t small_bytes = 64 * MiB;
  // engine-0 is killed asleep before the restart; engine-1 lives across it
  // (its session the old daemon's); engine-2 ends asleep, to be dropped.
  auto killed = client({"sleep", "engine-0", std::to_string(bytes), "4242"});
  ASSERT_EQ(killed->read_line(60s).value_or("(nothing: it exited)"), "asleep");
  killed->kill(SIGKILL);
  (void)killed->wait(20s);
  auto survivor = client({"sleep-across-restart", "engine-1", std::to_string(bytes), "4343"});
  ASSERT_EQ(survivor->read_line(60s).value_or("(nothing: it exited)"), "asleep");
  auto ended = client({"sleep", "engine-2", std::to_string(small_bytes), "7"});
  ASSERT_EQ(ended->read_line(60s).value_or("(nothing: it exited)"), "asleep");
  ended->close_stdin();
  EXPECT_EQ(ended->wait(20s), 0);
  // A sleep answers once its backups are stored: nothing to wait for.
  EXPECT_EQ(daemon.stored_backups().size(), 3u) << daemon.log();

  auto crashed = daemon.manager().kill_service(SIGKILL);
  ASSERT_TRUE(crashed && WIFSIGNALED(*crashed));
  ASSERT_TRUE(daemon.start());
  EXPECT_THAT(daemon.log(), HasSubstr("3 sleep backup(s) of")) << daemon.log();
  auto const sleepers = rmmctl_json<v1::ListSleepersResponse>(daemon, {"sleepers"});
  std::vector<std::string> names;
  for (auto const& sl : sleepers.sleepers()) {
    EXPECT_EQ(sl.session_id(), 0u) << sl.backup_name();
    names.push_back(sl.backup_name());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"engine-0", "engine-1", "engine-2"}));
  EXPECT_EQ(in_use(true), 2 * bytes + small_bytes);  // charged to the host pool again
  EXPECT_EQ(in_use(false), 0u);  // engine-1's awake kv is the old daemon's: not in this ledger

  auto restorer = client({"restore", "engine-0", std::to_string(bytes), "4242"});
  EXPECT_EQ(restorer->read_line(60s).value_or("(nothing: it exited)"), "intact");
  EXPECT_EQ(restorer->wait(20s), 0);
  survivor->write_line("go");
  EXPECT_EQ(survivor->read_line(60s).value_or("(nothing: it exited)"), "intact");
  survivor->close_stdin();
  EXPECT_EQ(survivor->wait(20s), 0);
  auto drop = run({program_path("rmmctl").string(),
                   "--runtime-dir",
                   daemon.runtime_dir().string(),
                   "sleepers",
                   "drop",
                   "engine-2"});
  EXPECT_EQ(drop.status, 0) << drop.out;
  // Restored and woken, or dropped: out of the store, and the memory free.
  EXPECT_TRUE(daemon.wait_for_stored_backups(0)) << daemon.log();
  EXPECT_TRUE(eventually([&] { return in_use(true) == 0 && in_use(false) == 0; }));
  EXPECT_EQ(rmmctl_json<v1::ListSleepersResponse>(daemon, {"sleepers"}).sleepers_size(), 0);
}

TEST_F(StableMemory, AWakeThatCannotFitFailsAtItsDeadlineWithNothingMapped)
{
  start("1GiB");
  rmmd::stable_memory_resource mr(*session_, 0, "kv");
  constexpr std::size_t bytes = 768 * MiB;
  void* kv                    = mr.allocate_sync(bytes, 256);
  mr.sleep();
  // Another session takes the room while the first sleeps.
  auto other_session = daemon_->open_session("trainer");
  rmmd::stable_memory_resource other(other_session, 0, "trainer");
  void* taken = other.allocate_sync(bytes, 256);

  auto const start_at = std::chrono::steady_clock::now();
  try {
    mr.wake({}, std::chrono::milliseconds(300));
    ADD_FAILURE() << "the wake fitted";
  } catch (rmm::out_of_memory const& e) {
    EXPECT_THAT(e.what(), HasSubstr("holds"));
    EXPECT_THAT(e.what(), HasSubstr("mapped nothing"));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start_at, std::chrono::milliseconds(300));
  EXPECT_FALSE(mr.is_awake(kv));
  EXPECT_EQ(in_use(gpu_pool()), bytes);  // the other's, nothing of the failed wake
  EXPECT_THAT(rmmd::admin(*session_).sleepers_json(), HasSubstr("\"wake_failures\":\"1\""));

  other.deallocate_sync(taken, bytes, 256);
  EXPECT_EQ(mr.wake({}, std::chrono::seconds(10)), bytes);
  EXPECT_TRUE(mr.is_awake(kv));
  mr.deallocate_sync(kv, bytes, 256);
  EXPECT_EQ(in_use(gpu_pool()), 0u);
}

TEST_F(StableMemory, AnotherUidIsServedFromTheMemoryASleeperGaveBack)
{
  // As deployed: rmmd as `rmmd`, the other tenant a member of its group
  // (the sockets' group), root the sleeper.
  if (auto why = start_as_deployed("1GiB"); !why.empty()) { GTEST_SKIP() << why; }
  rmmd::stable_memory_resource mr(*session_, 0, "kv");
  constexpr std::size_t bytes = 768 * MiB;
  void* kv                    = mr.allocate_sync(bytes, 256);
  mr.sleep();
  auto const slept_at = std::chrono::steady_clock::now();
  auto lender         = client({"lease", std::to_string(bytes)}, client_user_b);
  EXPECT_EQ(lender->read_line(60s).value_or("(nothing: it exited)"), "served");
  std::cout << "another uid served " << bytes << " bytes "
            << std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - slept_at)
                   .count()
            << " ms after the sleep returned (its process start included)\n";
  EXPECT_THROW(mr.wake({}, std::chrono::milliseconds(200)), rmm::out_of_memory);
  lender->close_stdin();
  EXPECT_EQ(lender->wait(20s), 0);
  // Its CUDA pool may keep the memory (release threshold): the wake trims it.
  EXPECT_EQ(mr.wake({}, std::chrono::seconds(10)), bytes);
  mr.deallocate_sync(kv, bytes, 256);
  EXPECT_EQ(in_use(gpu_pool()), 0u);
}

TEST_F(StableMemory, MemoryASleepGaveBackServesTheNextAllocationOfItsUidInPieces)
{
  start("4GiB", {"--keep-released-memory", "60"});
  rmmd::stable_memory_resource mr(*session_, 0, "kv");
  constexpr std::size_t piece = 256 * MiB;
  std::vector<void*> kv;
  for (int i = 0; i < 4; ++i) { kv.push_back(mr.allocate_sync(piece, 256)); }
  EXPECT_EQ(spare(), 0u);
  mr.sleep();
  EXPECT_EQ(spare(), 4 * piece);  // the daemon's, nobody's charge
  EXPECT_EQ(in_use(gpu_pool()), 0u);
  // Another process of this uid: its one allocation is the four pieces.
  auto taker = client({"stable", std::to_string(4 * piece)});
  EXPECT_EQ(taker->read_line(60s).value_or("(nothing: it exited)"), "served");
  EXPECT_EQ(spare(), 0u);
  EXPECT_EQ(in_use(gpu_pool()), 4 * piece);
  taker->close_stdin();
  EXPECT_EQ(taker->wait(20s), 0);
  EXPECT_EQ(spare(), 4 * piece);
  // The wake takes them back at the same addresses, and they work.
  EXPECT_EQ(mr.wake(), 4 * piece);
  EXPECT_EQ(spare(), 0u);
  for (std::size_t i = 0; i < kv.size(); ++i) {
    device_fill(kv[i], piece, static_cast<int>(i), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(device_first_mismatch(kv[i], piece, i, nullptr), -1) << i;
  }
  for (auto* p : kv) { mr.deallocate_sync(p, piece, 256); }
  EXPECT_EQ(in_use(gpu_pool()), 0u);
  EXPECT_EQ(spare(), 4 * piece);
  // No spare of its size: one allocation of the four pieces, and its wake
  // maps four pieces again at its address.
  void* big = mr.allocate_tagged("big", 4 * piece);
  EXPECT_EQ(spare(), 0u);
  device_fill(big, 4 * piece, 9, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(device_first_mismatch(big, 4 * piece, 9, nullptr), -1);
  mr.sleep({"big"});
  EXPECT_EQ(spare(), 4 * piece);
  EXPECT_EQ(mr.wake({"big"}), 4 * piece);
  EXPECT_EQ(spare(), 0u);
  device_fill(big, 4 * piece, 10, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(device_first_mismatch(big, 4 * piece, 10, nullptr), -1);
  mr.deallocate_sync(big, 4 * piece, 256);
  EXPECT_EQ(in_use(gpu_pool()), 0u);
}

TEST_F(StableMemory, MemoryASleepGaveBackNeverServesAnotherUid)
{
  if (auto why = start_as_deployed("4GiB", {"--keep-released-memory", "60"}); !why.empty()) {
    GTEST_SKIP() << why;
  }
  rmmd::stable_memory_resource mr(*session_, 0, "kv");
  constexpr std::size_t bytes = 512 * MiB;
  void* kv                    = mr.allocate_sync(bytes, 256);
  mr.sleep();
  EXPECT_EQ(spare(), bytes);
  // The other uid could read what a client that kept the fds of its slept
  // memory writes: it gets memory of its own from the driver.
  auto other = client({"stable", std::to_string(bytes)}, client_user_b);
  EXPECT_EQ(other->read_line(60s).value_or("(nothing: it exited)"), "served");
  EXPECT_EQ(spare(), bytes);
  other->close_stdin();
  EXPECT_EQ(other->wait(20s), 0);
  EXPECT_EQ(spare(), 2 * bytes);  // its own, kept for its uid
  EXPECT_EQ(mr.wake(), bytes);
  EXPECT_EQ(spare(), bytes);
  mr.deallocate_sync(kv, bytes, 256);
  EXPECT_EQ(in_use(gpu_pool()), 0u);
}

// It fills the device: a test suite named *Alone runs by itself
// (scripts/gpu-check.sh's gpu-exclusive), never beside other GPU processes,
// which it would starve and which would free what it counts on.
using StableMemoryAlone = StableMemory;

TEST_F(StableMemoryAlone, ADeviceFullOfSparesGivesThemBackToAPoolAllocation)
{
  start("8GiB", {"--keep-released-memory", "60"});
  rmmd::stable_memory_resource mr(*session_, 0, "kv");
  constexpr std::size_t bytes = 2048 * MiB;
  void* kv                    = mr.allocate_sync(bytes, 256);
  mr.sleep();
  ASSERT_EQ(spare(), bytes);
  // The rest of the GPU taken by this process, but for 512 MiB.
  std::size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  void* ballast = nullptr;
  ASSERT_EQ(cudaMalloc(&ballast, free - 512 * MiB), cudaSuccess);
  {
    rmmd::ipc_resource_options options;
    options.mode = rmmd::allocation_mode::direct;
    rmmd::ipc_memory_resource leases(*session_, 0, options);
    void* lease = leases.allocate_sync(1024 * MiB, 256);  // only the spares' room fits it
    EXPECT_EQ(spare(), 0u);
    leases.deallocate_sync(lease, 1024 * MiB, 256);
  }
  ASSERT_EQ(cudaFree(ballast), cudaSuccess);
  EXPECT_EQ(mr.wake(), bytes);
  mr.deallocate_sync(kv, bytes, 256);
}

TEST_F(StableMemory, TheTorchEntryPointsLendFromOneProcessWideStableResourcePerDevice)
{
  start();
  // The process-wide session is made once per process, from its first call.
  auto const dir = daemon_->runtime_dir().string();
  if (rmmd_torch_configure(dir.c_str(), RMMD_MODE_SLAB) != RMMD_SUCCESS) {
    GTEST_SKIP() << "an earlier test of this process started the process-wide session ("
                 << rmmd_last_error_message() << "); run this test alone";
  }
  constexpr std::size_t bytes = 64 * MiB;
  ASSERT_EQ(rmmd_stable_set_thread_tag("kv"), RMMD_SUCCESS);
  void* kv = rmmd_torch_stable_malloc(bytes, 0, nullptr);
  ASSERT_NE(kv, nullptr) << rmmd_last_error_message();
  ASSERT_EQ(rmmd_stable_set_thread_tag(nullptr), RMMD_SUCCESS);
  void* plain = rmmd_torch_stable_malloc(bytes, 0, nullptr);  // the "default" tag
  ASSERT_NE(plain, nullptr) << rmmd_last_error_message();
  std::uint64_t devices = 0;
  ASSERT_EQ(rmmd_torch_stable_devices(&devices), RMMD_SUCCESS);
  EXPECT_EQ(devices, 1u);
  EXPECT_EQ(in_use(gpu_pool()), 2 * bytes);

  rmmd_stable_resource_t mr = nullptr;
  ASSERT_EQ(rmmd_torch_stable_resource(0, &mr), RMMD_SUCCESS) << rmmd_last_error_message();
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  device_fill(kv, bytes, 77, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  char const* tags[]     = {"kv"};
  std::uint64_t released = 0;
  ASSERT_EQ(rmmd_stable_sleep(mr, tags, 1, RMMD_SLEEP_BACKUP_HOST, nullptr, stream, &released),
            RMMD_SUCCESS)
      << rmmd_last_error_message();
  EXPECT_EQ(released, bytes);
  EXPECT_EQ(in_use(gpu_pool()), bytes);  // "default" stays awake

  // The backup, read while asleep: 4 KiB from 1 MiB into the allocation.
  std::vector<std::uint64_t> words(512);
  std::size_t copied = 0;
  ASSERT_EQ(rmmd_stable_read_backup(mr, static_cast<char*>(kv) + MiB, 4096, words.data(), &copied),
            RMMD_SUCCESS)
      << rmmd_last_error_message();
  EXPECT_EQ(copied, 4096u);
  for (std::size_t i = 0; i < words.size(); ++i) {
    ASSERT_EQ(words[i], pattern(77, MiB / 8 + i)) << "word " << i;
  }
  EXPECT_EQ(
      rmmd_stable_read_backup(mr, static_cast<char*>(kv) + bytes - 8, 16, words.data(), &copied),
      RMMD_ERROR_NOT_FOUND);
  ASSERT_EQ(rmmd_stable_read_backup(mr, plain, 4096, words.data(), &copied), RMMD_SUCCESS);
  EXPECT_EQ(copied, 0u) << "awake: no backup to read";

  std::uint64_t woken = 0;
  ASSERT_EQ(rmmd_stable_wake(mr, nullptr, 0, 10000, stream, &woken), RMMD_SUCCESS)
      << rmmd_last_error_message();
  EXPECT_EQ(woken, bytes);
  EXPECT_EQ(device_first_mismatch(kv, bytes, 77, stream), -1);
  // The handle is a copy: destroying it frees nothing.
  ASSERT_EQ(rmmd_stable_resource_destroy(mr), RMMD_SUCCESS);
  EXPECT_EQ(device_first_mismatch(kv, bytes, 77, stream), -1);
  rmmd_torch_stable_free(kv, bytes, 0, stream);
  rmmd_torch_stable_free(plain, bytes, 0, stream);
  cudaStreamDestroy(stream);
  EXPECT_EQ(in_use(gpu_pool()), 0u);
  EXPECT_EQ(in_use("host"), 0u);
}

}  // namespace
}  // namespace rmmd::test
