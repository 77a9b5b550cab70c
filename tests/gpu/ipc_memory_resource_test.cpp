// rmmd::ipc_memory_resource on a real GPU against the real daemon and real
// client processes. Every test skips, saying why, where CUDA sees no GPU.

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"

#include "tests/tools/pattern.hpp"

#include "client/detail/process_exit.hpp"

#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/pinned_host_memory_resource.hpp>

#include <rmm/device_buffer.hpp>
#include <rmm/device_uvector.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/per_device_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <cuda/memory_resource>

#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <numeric>
#include <stop_token>
#include <thread>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

/// One daemon allocation per allocate(): what the tests of the direct path use.
constexpr rmmd::ipc_resource_options direct{.mode = rmmd::allocation_mode::direct};

// What RMM's containers need, checked at compile time on every machine.
static_assert(cuda::mr::resource_with<rmmd::ipc_memory_resource, cuda::mr::device_accessible>);
static_assert(
    cuda::mr::synchronous_resource_with<rmmd::ipc_memory_resource, cuda::mr::device_accessible>);
static_assert(std::is_copy_constructible_v<rmmd::ipc_memory_resource>);
static_assert(std::is_constructible_v<cuda::mr::any_resource<cuda::mr::device_accessible>,
                                      rmmd::ipc_memory_resource>);

v1::PoolStats const& gpu_pool(v1::Stats const& stats, int device)
{
  for (auto const& p : stats.pools()) {
    if (p.pool().backend() == v1::BACKEND_CUDA && p.pool().device() == device) { return p; }
  }
  throw std::runtime_error("no pool for device " + std::to_string(device));
}

std::vector<int> to_host(int const* device_ptr, std::size_t n)
{
  std::vector<int> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), device_ptr, n * sizeof(int), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

class IpcMemoryResource : public ::testing::Test {
 protected:
  void SetUp() override
  {
    REQUIRE_GPUS(1);
    daemon_ =
        std::make_unique<daemon_process>(std::vector<std::string>{"--cuda-pool-bytes", "4GiB"});
    session_ = std::make_unique<rmmd::session>(daemon_->open_session("gpu-test"));
  }

  std::unique_ptr<daemon_process> daemon_;
  std::unique_ptr<rmmd::session> session_;
};

TEST_F(IpcMemoryResource, DeviceUvectorRoundTripsThroughTheDaemonsPool)
{
  rmmd::ipc_memory_resource mr(*session_, direct);
  cuda::stream_ref stream{cudaStream_t{}};
  constexpr std::size_t n = 1 << 20;
  std::vector<int> host(n);
  std::iota(host.begin(), host.end(), 7);
  {
    rmm::device_uvector<int> v(n, stream, mr);
    ASSERT_EQ(cudaMemcpyAsync(
                  v.data(), host.data(), n * sizeof(int), cudaMemcpyHostToDevice, stream.get()),
              cudaSuccess);
    EXPECT_EQ(v.element(n - 1, stream), static_cast<int>(n - 1 + 7));
    EXPECT_EQ(to_host(v.data(), n), host);
    auto stats       = daemon_->stats();
    auto const& pool = gpu_pool(stats, 0);
    EXPECT_EQ(pool.in_use_bytes(), n * sizeof(int));
    EXPECT_EQ(pool.allocation_count(), 1u);
    ASSERT_TRUE(pool.has_backend_used_bytes());
    EXPECT_GE(pool.backend_used_bytes(), n * sizeof(int));  // CUDA's own count agrees
    // cudaMemsetAsync in this process, read back through the same import.
    ASSERT_EQ(cudaMemsetAsync(v.data(), 0, n * sizeof(int), stream.get()), cudaSuccess);
    EXPECT_EQ(v.element(12345, stream), 0);
  }
  // The Free went out from a host function when the stream reached it, on the
  // session socket, which stats (gRPC) does not wait for.
  EXPECT_TRUE(eventually([&] {
    auto after = gpu_pool(daemon_->stats(), 0);
    return after.in_use_bytes() == 0u && after.backend_used_bytes() == 0u;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
}

// Above own_allocation_above an allocation is one of its own (a VMM
// allocation the daemon made, mapped here), not a pointer of the pool: the
// ledger counts it, the CUDA pool does not hold it, and it keeps its data
// beside the pool's allocations in both modes. (At the default, 4 GiB,
// large_lease_test.cpp runs it in client processes.)
TEST_F(IpcMemoryResource, AnAllocationAboveOwnAllocationAboveIsOneOfItsOwnInBothModes)
{
  for (auto mode : {rmmd::allocation_mode::direct, rmmd::allocation_mode::slab}) {
    SCOPED_TRACE(mode == rmmd::allocation_mode::direct ? "direct" : "slab");
    rmmd::ipc_memory_resource mr(
        *session_,
        rmmd::ipc_resource_options{
            .mode = mode, .slab_bytes = 16 * MiB, .own_allocation_above = 48 * MiB});
    cuda::stream_ref stream{cudaStream_t{}};
    {
      rmm::device_uvector<int> large(25 * MiB, stream, mr);  // 100 MiB
      rmm::device_uvector<int> small(256 * KiB, stream, mr);
      ASSERT_EQ(cudaMemsetAsync(large.data(), 0x11, large.size() * sizeof(int), stream.get()),
                cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(small.data(), 0x22, small.size() * sizeof(int), stream.get()),
                cudaSuccess);
      EXPECT_EQ(large.element(large.size() - 1, stream), 0x11111111);
      EXPECT_EQ(small.element(small.size() - 1, stream), 0x22222222);
      auto const pool = gpu_pool(daemon_->stats(), 0);
      EXPECT_GE(pool.in_use_bytes(), 100 * MiB + MiB);
      ASSERT_TRUE(pool.has_backend_used_bytes());
      EXPECT_LT(pool.backend_used_bytes(), 100 * MiB) << "the large one is not the pool's";
    }
  }  // the resource gives its slabs back as it goes
  EXPECT_TRUE(eventually([&] { return gpu_pool(daemon_->stats(), 0).in_use_bytes() == 0u; }));
}

TEST_F(IpcMemoryResource, ASlabLargerThanOwnAllocationAboveIsRefusedAtConstruction)
{
  try {
    rmmd::ipc_memory_resource mr(*session_,
                                 rmmd::ipc_resource_options{.mode = rmmd::allocation_mode::slab,
                                                            .slab_bytes           = 64 * MiB,
                                                            .own_allocation_above = 32 * MiB});
    FAIL() << "constructed";
  } catch (rmmd::logic_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("slab_bytes (67108864) is larger than own_allocation_above"));
  }
}

// A graph that allocates and frees an allocation of its own: the free waits
// for the graph's destruction (unmapping would wait for the capturing
// stream), and the next call frees it once.
// The library's exit handler (client/detail/process_exit.hpp) is an atexit
// entry: making resources, in either mode, must not add one each.
TEST_F(IpcMemoryResource, MakingManyResourcesRegistersNoMoreExitHandlers)
{
  {
    rmmd::ipc_memory_resource first(*session_, direct);
  }
  auto const before = rmmd::detail::process_exit_registrations();
  EXPECT_GE(before, 1u);
  EXPECT_LE(before, 2u);
  std::vector<rmmd::ipc_memory_resource> resources;
  resources.reserve(10000);
  for (int i = 0; i < 10000; ++i) {
    resources.emplace_back(*session_, i % 2 == 0 ? direct : rmmd::ipc_resource_options{});
  }
  cuda::stream_ref stream{cudaStream_t{}};
  {
    rmm::device_uvector<int> v(1024, stream, resources.back());
    ASSERT_EQ(cudaMemsetAsync(v.data(), 0, 1024 * sizeof(int), stream.get()), cudaSuccess);
    EXPECT_EQ(v.element(1023, stream), 0);
  }
  EXPECT_EQ(rmmd::detail::process_exit_registrations(), before);
}

TEST_F(IpcMemoryResource, SmallDirectAllocationsArePackedIntoOneBlockAndKeepTheirData)
{
  rmmd::ipc_memory_resource mr(*session_, direct);
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<std::pair<std::uint8_t*, std::size_t>> buffers;
  for (int i = 0; i < 200; ++i) {
    auto const bytes = std::size_t{256} << (i % 8);  // 256 B to 32 KiB: 1.6 MB in all
    auto* p          = static_cast<std::uint8_t*>(mr.allocate(stream, bytes, 256));
    ASSERT_EQ(cudaMemsetAsync(p, i & 0xff, bytes, stream), cudaSuccess);
    buffers.emplace_back(p, bytes);
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    std::vector<std::uint8_t> host(buffers[i].second);
    ASSERT_EQ(
        cudaMemcpyAsync(host.data(), buffers[i].first, host.size(), cudaMemcpyDeviceToHost, stream),
        cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_TRUE(std::all_of(host.begin(), host.end(), [i](auto b) { return b == (i & 0xff); }))
        << "buffer " << i << " was overwritten: packed leases overlap";
  }
  // Every allocation is a lease of the daemon's, carved out of one block of
  // this session's: one driver allocation, exported and imported once.
  auto const held = gpu_pool(daemon_->stats(), 0);
  EXPECT_EQ(held.allocation_count(), buffers.size());
  EXPECT_EQ(held.in_use_bytes(), 2 * MiB);
  EXPECT_GE(held.backend_used_bytes(), 2 * MiB);
  EXPECT_LT(held.backend_used_bytes(), 4 * MiB);
  for (auto [p, bytes] : buffers) { mr.deallocate(stream, p, bytes, 256); }
  // The Frees go out as the stream passes them; the empty block stays for a
  // second, then the daemon retires it and the client drops its import.
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.allocation_count() == 0 && p.in_use_bytes() == 0 && p.backend_used_bytes() == 0;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  // And a new block serves the next one.
  void* again = mr.allocate(stream, 256, 256);
  EXPECT_EQ(gpu_pool(daemon_->stats(), 0).in_use_bytes(), 2 * MiB);
  mr.deallocate(stream, again, 256, 256);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(PackedLeases, BlocksBeyondTheOneThatStaysGoBackAtOnceAndNoneWithPackingOff)
{
  REQUIRE_GPUS(1);
  for (bool packing : {true, false}) {
    SCOPED_TRACE(packing ? "packing" : "--cuda-pack-up-to 0");
    std::vector<std::string> flags{"--cuda-pool-bytes", "1GiB"};
    if (!packing) { flags.insert(flags.end(), {"--cuda-pack-up-to", "0"}); }
    daemon_process daemon(flags);
    auto s = daemon.open_session("packed");
    rmmd::ipc_memory_resource mr(s, direct);
    cuda::stream_ref stream{cudaStream_t{}};
    std::vector<void*> held;
    for (int i = 0; i < 64; ++i) { held.push_back(mr.allocate(stream, 64 * KiB, 256)); }
    auto const full = gpu_pool(daemon.stats(), 0);
    EXPECT_EQ(full.allocation_count(), 64u);
    EXPECT_EQ(full.in_use_bytes(), packing ? 4 * MiB : 64 * 64 * KiB);
    for (auto* p : held) { mr.deallocate(stream, p, 64 * KiB, 256); }
    if (packing) {
      // The first block to empty stays a while; the second is retired at once.
      EXPECT_TRUE(
          eventually([&] { return gpu_pool(daemon.stats(), 0).in_use_bytes() <= 2 * MiB; }, 900ms))
          << gpu_pool(daemon.stats(), 0).DebugString();
    }
    EXPECT_TRUE(eventually([&] {
      auto p = gpu_pool(daemon.stats(), 0);
      return p.in_use_bytes() == 0 && p.backend_used_bytes() == 0;
    })) << gpu_pool(daemon.stats(), 0).DebugString();
  }
}

TEST_F(IpcMemoryResource, WorksAsUpstreamOfRmmAdaptorsAndAsTheCurrentResource)
{
  rmmd::ipc_memory_resource mr(*session_, 0, direct);
  cuda::stream_ref stream{cudaStream_t{}};
  {
    rmm::mr::pool_memory_resource pool(mr, 1 << 20);  // one lease from the daemon, carved locally
    rmm::mr::statistics_resource_adaptor stats(pool);
    std::vector<rmm::device_buffer> buffers;
    for (int i = 0; i < 16; ++i) { buffers.emplace_back(4096, stream, stats); }
    EXPECT_EQ(stats.get_allocations_counter().value, 16);
    EXPECT_EQ(gpu_pool(daemon_->stats(), 0).allocation_count(), 1u);  // only the pool's block
  }
  cuda::mr::any_resource<cuda::mr::device_accessible> any{mr};
  auto old = rmm::mr::set_current_device_resource(any);
  {
    rmm::device_uvector<float> v(1000, stream);  // from the current device resource: rmmd
    // The pool's block goes when the stream passes its free (a host function
    // sends it); v's packed lease takes no longer than a round trip.
    EXPECT_TRUE(eventually([&] { return gpu_pool(daemon_->stats(), 0).allocation_count() == 1u; }))
        << gpu_pool(daemon_->stats(), 0).DebugString();
  }
  rmm::mr::set_current_device_resource(old);
  // The Free goes out when the stream reaches it (a host function).
  EXPECT_TRUE(eventually([&] { return gpu_pool(daemon_->stats(), 0).in_use_bytes() == 0u; }));
}

TEST_F(IpcMemoryResource, ErrorsAreTyped)
{
  rmmd::ipc_memory_resource mr(*session_, direct);
  cuda::stream_ref stream{cudaStream_t{}};
  EXPECT_EQ(mr.allocate(stream, 0, 256), nullptr);  // as RMM's resources: no request
  mr.deallocate(stream, nullptr, 0, 256);
  EXPECT_THROW((void)mr.allocate(stream, 1024, 4096), rmmd::logic_error);  // above 256
  try {
    (void)mr.allocate(stream, std::size_t{1} << 40, 256);
    ADD_FAILURE() << "1 TiB was granted";
  } catch (rmm::out_of_memory const& e) {
    EXPECT_THAT(e.what(), HasSubstr("out_of_memory"));
    EXPECT_THAT(e.what(), HasSubstr("larger than the pool's capacity"));
  }
  EXPECT_THROW(rmmd::ipc_memory_resource(*session_, 99), rmmd::logic_error);
  EXPECT_THROW(rmmd::ipc_memory_resource(*session_, "host"), rmmd::logic_error);
  EXPECT_EQ(gpu_pool(daemon_->stats(), 0).in_use_bytes(), 0u);
}

TEST_F(IpcMemoryResource, BufferSurvivesWhileOtherClientsChurn)
{
  child_process holder(
      {program_path("rmmd_test_client").string(), "device-hold", "67108864", "171"},
      {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()});
  ASSERT_EQ(holder.read_line(60s), "ready");
  {
    rmmd::ipc_memory_resource mr(*session_);
    cuda::stream_ref stream{cudaStream_t{}};
    for (int round = 0; round < 200; ++round) {
      rmm::device_buffer b(std::size_t{1} << (10 + round % 14), stream, mr);
      ASSERT_EQ(cudaMemsetAsync(b.data(), round & 0xff, b.size(), stream.get()), cudaSuccess);
    }
    stream.sync();
  }
  holder.close_stdin();
  EXPECT_EQ(holder.read_line(60s), "intact");
  EXPECT_EQ(holder.wait(60s), 0);
}

TEST_F(IpcMemoryResource, SigkilledClientsDeviceMemoryGoesBackToThePool)
{
  auto const before = gpu_pool(daemon_->stats(), 0);
  child_process holder({program_path("rmmd_test_client").string(), "device-hold", "268435456", "1"},
                       {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()});
  ASSERT_EQ(holder.read_line(60s), "ready");
  auto const held = gpu_pool(daemon_->stats(), 0);
  EXPECT_EQ(held.in_use_bytes(), before.in_use_bytes() + 268435456);
  EXPECT_GE(held.backend_used_bytes(), before.backend_used_bytes() + 268435456);
  holder.kill(SIGKILL);
  ASSERT_EQ(holder.wait(), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.in_use_bytes() == before.in_use_bytes() &&
           p.backend_used_bytes() == before.backend_used_bytes();
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
}

TEST_F(IpcMemoryResource, DaemonKilledClientKeepsItsMemoryAndGetsSessionError)
{
  // Without reconnecting (tests/gpu/reconnect_test.cpp has that).
  rmmd::session s(rmmd::session::options{.runtime_dir = daemon_->runtime_dir(),
                                         .reconnect   = std::chrono::milliseconds(0)});
  rmmd::ipc_memory_resource mr(s, direct);
  cuda::stream_ref stream{cudaStream_t{}};
  constexpr std::size_t n = 1 << 16;
  auto* p                 = static_cast<int*>(mr.allocate(stream, n * sizeof(int), 256));
  ASSERT_EQ(cudaMemsetAsync(p, 0x11, n * sizeof(int), stream.get()), cudaSuccess);
  stream.sync();

  daemon_->process().kill(SIGKILL);
  ASSERT_EQ(daemon_->process().wait(), 128 + SIGKILL);

  // What was imported stays valid and writable (DESIGN.md: measured).
  ASSERT_EQ(cudaMemsetAsync(p, 0x22, n * sizeof(int), stream.get()), cudaSuccess);
  auto host = to_host(p, n);
  EXPECT_EQ(host.front(), 0x22222222);
  EXPECT_EQ(host.back(), 0x22222222);
  // The next request says what happened, without a crash or a hang.
  try {
    (void)mr.allocate(stream, 4096, 256);
    FAIL() << "allocate succeeded without a daemon";
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("daemon is gone"));
  }
  mr.deallocate(stream, p, n * sizeof(int), 256);  // frees the import; the Free fails quietly
}

/// Stops a stream at a host function until open() (or the destructor) lets
/// it go: GPU work that takes as long as the test wants.
class stream_gate {
 public:
  explicit stream_gate(cudaStream_t stream)
  {
    EXPECT_EQ(cudaLaunchHostFunc(stream, &stream_gate::wait_open, this), cudaSuccess);
  }
  stream_gate(stream_gate const&)            = delete;
  stream_gate& operator=(stream_gate const&) = delete;
  ~stream_gate()
  {
    open();
  }
  void open()
  {
    std::lock_guard lock(mutex_);
    open_ = true;
    opened_.notify_all();
  }
  [[nodiscard]] bool is_open()
  {
    std::lock_guard lock(mutex_);
    return open_;
  }

 private:
  static void wait_open(void* self)
  {
    auto* gate = static_cast<stream_gate*>(self);
    std::unique_lock lock(gate->mutex_);
    gate->opened_.wait(lock, [gate] { return gate->open_; });
  }
  std::mutex mutex_;
  std::condition_variable opened_;
  bool open_{false};
};

TEST_F(IpcMemoryResource, DeallocateDoesNotWaitForTheStreamAndTheDaemonFreesOnlyAfterIt)
{
  rmmd::ipc_memory_resource mr(*session_, direct);
  cudaStream_t raw{};
  ASSERT_EQ(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking), cudaSuccess);
  cuda::stream_ref stream{raw};
  constexpr std::size_t bytes = 64 << 20;
  for (int round = 0; round < 3; ++round) {  // the release events are reused
    void* p = mr.allocate(stream, bytes, 256);
    stream_gate gate(raw);
    // Queued behind the gate: this write still needs the memory after deallocate returns.
    ASSERT_EQ(cudaMemsetAsync(p, 0x5a, bytes, raw), cudaSuccess);
    // If deallocate waited for the stream, it would wait until this watchdog
    // opens the gate, and the test would see the gate open.
    std::jthread watchdog([&gate](std::stop_token stop) {
      std::mutex m;
      std::condition_variable_any cv;
      std::unique_lock lock(m);
      if (!cv.wait_for(lock, stop, 20s, [] { return false; }) && !stop.stop_requested()) {
        gate.open();
      }
    });
    mr.deallocate(stream, p, bytes, 256);
    EXPECT_FALSE(gate.is_open()) << "deallocate waited for the stream";
    EXPECT_EQ(cudaStreamQuery(raw), cudaErrorNotReady);
    // The daemon has not freed it either: the memset has not run yet.
    auto const held = gpu_pool(daemon_->stats(), 0);
    EXPECT_EQ(held.in_use_bytes(), bytes);
    EXPECT_GE(held.backend_used_bytes(), bytes);
    watchdog.request_stop();
    gate.open();
    ASSERT_EQ(cudaStreamSynchronize(raw), cudaSuccess);
    EXPECT_TRUE(eventually([&] {
      auto p = gpu_pool(daemon_->stats(), 0);
      return p.in_use_bytes() == 0 && p.backend_used_bytes() == 0;
    })) << gpu_pool(daemon_->stats(), 0).DebugString();
  }
  ASSERT_EQ(cudaStreamDestroy(raw), cudaSuccess);
}

TEST_F(IpcMemoryResource, AClientKilledWithAFreeStillPendingGetsItsMemoryReclaimed)
{
  // The client's release event never completes (its stream is stalled, then
  // the process dies): the daemon must neither hang on it nor leak the memory.
  auto const before = gpu_pool(daemon_->stats(), 0);
  child_process client(
      {program_path("rmmd_test_client").string(), "device-free-pending", "134217728"},
      {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()});
  ASSERT_EQ(client.read_line(60s), "pending");
  EXPECT_EQ(gpu_pool(daemon_->stats(), 0).in_use_bytes(), before.in_use_bytes() + 134217728);
  client.kill(SIGKILL);
  ASSERT_EQ(client.wait(), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.in_use_bytes() == before.in_use_bytes() &&
           p.backend_used_bytes() == before.backend_used_bytes();
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  // And the daemon still serves allocations (nothing of it waits on the dead event).
  rmmd::ipc_memory_resource mr(*session_);
  cuda::stream_ref stream{cudaStream_t{}};
  rmm::device_uvector<int> v(1 << 20, stream, mr);
  ASSERT_EQ(cudaMemsetAsync(v.data(), 0, v.size() * sizeof(int), stream.get()), cudaSuccess);
  EXPECT_EQ(v.element(7, stream), 0);
}

// ---------------------------------------------------------------------------
// The fast path: allocation_mode::slab

rmmd::ipc_resource_options slabs(std::size_t slab_bytes, std::chrono::milliseconds idle_trim)
{
  return {.mode = rmmd::allocation_mode::slab, .slab_bytes = slab_bytes, .idle_trim = idle_trim};
}

TEST_F(IpcMemoryResource, SlabModeKeepsEveryBuffersDataAcrossManySlabs)
{
  rmmd::ipc_memory_resource mr(*session_, 0, slabs(MiB, 300ms));
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<std::pair<std::uint8_t*, std::size_t>> buffers;
  std::size_t carved = 0;
  for (int i = 0; i < 300; ++i) {
    auto const bytes = std::size_t{4096} << (i % 8);  // 4 KiB to 512 KiB
    auto* p          = static_cast<std::uint8_t*>(mr.allocate(stream, bytes, 256));
    ASSERT_EQ(cudaMemsetAsync(p, i & 0xff, bytes, stream), cudaSuccess);
    buffers.emplace_back(p, bytes);
    carved += bytes;
  }
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    std::vector<std::uint8_t> host(buffers[i].second);
    ASSERT_EQ(
        cudaMemcpyAsync(host.data(), buffers[i].first, host.size(), cudaMemcpyDeviceToHost, stream),
        cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ASSERT_TRUE(std::all_of(host.begin(), host.end(), [i](auto b) { return b == (i & 0xff); }))
        << "buffer " << i;
  }
  // The daemon counts slabs (far fewer than the buffers, and at least what
  // was carved); the resource reports what it carved.
  auto const held = gpu_pool(daemon_->stats(), 0);
  EXPECT_LT(held.allocation_count(), 40u);
  EXPECT_GE(held.in_use_bytes(), carved);
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.carved_bytes() == carved && p.carved_allocations() == buffers.size();
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  for (auto [p, bytes] : buffers) { mr.deallocate(stream, p, bytes, 256); }
  // Idle slabs go back on their own.
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.in_use_bytes() == 0 && p.carved_bytes() == 0 && p.backend_used_bytes() == 0;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// The slab keeper's idle trim must not disturb another thread that captures
// a graph in global mode meanwhile: no device-wide wait, no call held
// against the capture. The capture stays valid and the slabs still go back.
TEST_F(IpcMemoryResource, AnIdleTrimDuringAnotherThreadsGlobalCaptureLeavesTheGraphValid)
{
  rmmd::ipc_memory_resource mr(*session_, 0, slabs(8 * MiB, 50ms));
  void* scratch = nullptr;
  ASSERT_EQ(cudaMalloc(&scratch, MiB), cudaSuccess);
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* p = mr.allocate(stream, MiB, 256);
  ASSERT_EQ(cudaMemsetAsync(p, 1, MiB, stream), cudaSuccess);
  mr.deallocate(stream, p, MiB, 256);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  // The lane is idle from now: the keeper trims it within ~50-65 ms, while
  // this thread captures for 600 ms.
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  auto const until   = std::chrono::steady_clock::now() + 600ms;
  cudaError_t queued = cudaSuccess;
  int nodes          = 0;
  while (std::chrono::steady_clock::now() < until && queued == cudaSuccess) {
    queued = cudaMemsetAsync(scratch, nodes & 0xff, MiB, stream);
    ++nodes;
    std::this_thread::sleep_for(5ms);
  }
  auto const held_during = gpu_pool(daemon_->stats(), 0).in_use_bytes();
  cudaGraph_t graph{};
  auto const ended = cudaStreamEndCapture(stream, &graph);
  std::cout << "capture of " << nodes << " memsets: queue " << cudaGetErrorName(queued) << ", end "
            << cudaGetErrorName(ended) << "; the pool held " << held_during
            << " bytes at its end (0: the trim ran during the capture)\n";
  EXPECT_EQ(queued, cudaSuccess);
  ASSERT_EQ(ended, cudaSuccess);
  cudaGraphExec_t exec{};
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  // The slabs go back, during the capture or at a later tick.
  EXPECT_TRUE(eventually([&] { return gpu_pool(daemon_->stats(), 0).in_use_bytes() == 0; }))
      << gpu_pool(daemon_->stats(), 0).DebugString();
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  EXPECT_EQ(cudaFree(scratch), cudaSuccess);
}

TEST_F(IpcMemoryResource, TwoSlabResourcesOfOneSessionReportTheirSum)
{
  // The daemon keeps one carved figure per session and pool: the session adds
  // up what its resources of that pool carved, and drops a resource that goes.
  auto const before = gpu_pool(daemon_->stats(), 0).in_use_bytes();
  auto first        = std::make_unique<rmmd::ipc_memory_resource>(*session_, 0, slabs(8 * MiB, 1h));
  auto second       = std::make_unique<rmmd::ipc_memory_resource>(*session_, 0, slabs(8 * MiB, 1h));
  cuda::stream_ref stream{cudaStream_t{}};
  void* a = first->allocate(stream, 3 * MiB, 256);
  void* b = second->allocate(stream, 1 * MiB, 256);
  void* c = second->allocate(stream, 1 * MiB, 256);
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.carved_bytes() == 5 * MiB && p.carved_allocations() == 3;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  first->deallocate(stream, a, 3 * MiB, 256);
  first.reset();
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.carved_bytes() == 2 * MiB && p.carved_allocations() == 2;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  second->deallocate(stream, b, MiB, 256);
  second->deallocate(stream, c, MiB, 256);
  second.reset();
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.carved_bytes() == 0 && p.in_use_bytes() == before;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
}

rmmd::ipc_resource_options lanes(std::size_t count, std::chrono::milliseconds idle_trim)
{
  auto o          = slabs(8 * MiB, idle_trim);
  o.carving_lanes = count;
  return o;
}

/// `session`'s line of the daemon's stats.
v1::SessionInfo const& session_line(v1::Stats const& stats, rmmd::session const& session)
{
  for (auto const& s : stats.sessions()) {
    if (s.session_id() == session.id()) { return s; }
  }
  throw std::runtime_error("no session " + std::to_string(session.id()) + " in the stats");
}

/// Runs body(t) on `threads` threads alive together (so that each is a
/// thread of its own to the resource), each with cudaSetDevice(0) done;
/// returns how many failed to set the device.
template <typename Body>
int on_threads(int threads, Body body)
{
  std::atomic<int> bad{0};
  std::vector<std::thread> crew;
  for (int t = 0; t < threads; ++t) {
    crew.emplace_back([&, t] {
      if (cudaSetDevice(0) != cudaSuccess) { ++bad; }
      body(t);
    });
  }
  for (auto& th : crew) { th.join(); }
  return bad.load();
}

TEST_F(IpcMemoryResource, CarvingLanesKeepEveryBuffersDataAndFreeOnAnyThreadAndStream)
{
  auto const before = gpu_pool(daemon_->stats(), 0).in_use_bytes();
  rmmd::ipc_memory_resource mr(*session_, 0, lanes(4, 1h));
  constexpr int threads = 6;  // more threads than lanes: some share one
  std::vector<cudaStream_t> streams(threads);
  for (auto& s : streams) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  }
  struct buffer {
    std::uint8_t* p;
    std::size_t bytes;
    int value;
    std::size_t stream;
  };
  std::vector<std::vector<buffer>> made(threads);
  std::atomic<int> failed{0};
  EXPECT_EQ(on_threads(threads,
                       [&](int t) {
                         for (int i = 0; i < 40; ++i) {
                           // 4 KiB to 1 MiB: lanes grow past a slab
                           auto const bytes = std::size_t{4096} << (i % 9);
                           auto* p =
                               static_cast<std::uint8_t*>(mr.allocate(streams[t], bytes, 256));
                           int const value = (t * 40 + i) & 0xff;
                           if (cudaMemsetAsync(p, value, bytes, streams[t]) != cudaSuccess) {
                             ++failed;
                           }
                           made[t].push_back({p, bytes, value, static_cast<std::size_t>(t)});
                         }
                       }),
            0);
  ASSERT_EQ(failed.load(), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::size_t carved = 0;
  std::size_t count  = 0;
  for (auto const& list : made) {
    for (auto const& b : list) {
      std::vector<std::uint8_t> host(b.bytes);
      ASSERT_EQ(cudaMemcpy(host.data(), b.p, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_TRUE(std::all_of(host.begin(), host.end(), [&](auto x) { return x == b.value; }));
      carved += b.bytes;
      ++count;
    }
  }
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.carved_bytes() == carved && p.carved_allocations() == count;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  // Every lane leased slabs of its own: at least four lanes' first slabs.
  EXPECT_GE(gpu_pool(daemon_->stats(), 0).in_use_bytes(), before + 4 * 8 * MiB);
  // Freed by this thread (which has no lane) on another thread's stream:
  // each goes back to the lane whose slab holds it.
  for (auto const& list : made) {
    for (auto const& b : list) {
      mr.deallocate(streams[(b.stream + 1) % streams.size()], b.p, b.bytes, 256);
    }
  }
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.carved_bytes() == 0 && p.carved_allocations() == 0;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  // Every lane is idle: trim() gives back every slab.
  EXPECT_GE(mr.trim(), 4 * 8 * MiB);
  EXPECT_TRUE(eventually([&] { return gpu_pool(daemon_->stats(), 0).in_use_bytes() == before; }))
      << gpu_pool(daemon_->stats(), 0).DebugString();
  for (auto s : streams) { ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess); }
}

/// Eight threads carve on their streams and free on the next thread's, so
/// that lanes free each other's pointers while they carve; then, idle for
/// 200 ms, every lane gives its slabs back on its own.
void eight_threads_lose_nothing(daemon_process const& daemon,
                                rmmd::session const& session,
                                rmmd::ipc_resource_options const& options)
{
  auto const before = gpu_pool(daemon.stats(), 0).in_use_bytes();
  {
    rmmd::ipc_memory_resource mr(session, 0, options);
    constexpr int threads = 8;
    std::vector<cudaStream_t> streams(threads);
    for (auto& s : streams) {
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    }
    EXPECT_EQ(on_threads(threads,
                         [&](int t) {
                           std::vector<std::pair<void*, std::size_t>> held;
                           for (int i = 0; i < 3000; ++i) {
                             auto const bytes = std::size_t{256} << ((i * 7 + t) % 13);
                             held.emplace_back(mr.allocate(streams[t], bytes, 256), bytes);
                             if (held.size() > 16) {
                               auto [p, n] = held.front();
                               held.erase(held.begin());
                               mr.deallocate(streams[(t + 1) % threads], p, n, 256);
                             }
                           }
                           for (auto [p, n] : held) { mr.deallocate(streams[t], p, n, 256); }
                         }),
              0);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_TRUE(eventually([&] {
      auto p = gpu_pool(daemon.stats(), 0);
      return p.carved_bytes() == 0 && p.carved_allocations() == 0;
    })) << gpu_pool(daemon.stats(), 0).DebugString();
    EXPECT_TRUE(eventually([&] { return gpu_pool(daemon.stats(), 0).in_use_bytes() == before; }))
        << gpu_pool(daemon.stats(), 0).DebugString();
    for (auto s : streams) { ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess); }
  }
  EXPECT_EQ(gpu_pool(daemon.stats(), 0).in_use_bytes(), before);
}

TEST_F(IpcMemoryResource, CarvingLanesUnderEightThreadsLoseNothing)
{
  eight_threads_lose_nothing(*daemon_, *session_, lanes(8, 200ms));
}

TEST_F(IpcMemoryResource, AutomaticLanesUnderEightThreadsLoseNothing)
{
  eight_threads_lose_nothing(*daemon_, *session_, slabs(8 * MiB, 200ms));
}

TEST_F(IpcMemoryResource, AutomaticLanesStayOneForOneThreadAndGrowForASecond)
{
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  ASSERT_EQ(sched_getaffinity(0, sizeof(cpus), &cpus), 0);
  if (CPU_COUNT(&cpus) < 2) { GTEST_SKIP() << "automatic lanes are one lane on one CPU"; }
  auto const before = gpu_pool(daemon_->stats(), 0).in_use_bytes();
  rmmd::ipc_memory_resource mr(*session_, 0, slabs(8 * MiB, 1h));  // the default lanes
  std::vector<cudaStream_t> streams(4);
  for (auto& s : streams) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  }
  // One thread on four streams: one lane, one slab.
  std::vector<void*> mine;
  for (int i = 0; i < 16; ++i) { mine.push_back(mr.allocate(streams[i % 4], 64 * KiB, 256)); }
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.carved_allocations() == 16 && p.in_use_bytes() == before + 8 * MiB;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  // A second thread: a lane of its own, with a slab of its own; this
  // thread's next allocations stay in the first lane.
  void* theirs = nullptr;
  EXPECT_EQ(on_threads(1, [&](int) { theirs = mr.allocate(streams[1], MiB, 256); }), 0);
  mine.push_back(mr.allocate(streams[0], 64 * KiB, 256));
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.carved_allocations() == 18 && p.in_use_bytes() == before + 16 * MiB;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
  // Freed here, on any stream: the lanes hold 16 MiB of slabs with nothing
  // carved, which the session's stats show as idle and reclaimable (through
  // gRPC and through rmmctl stats).
  mr.deallocate(streams[2], theirs, MiB, 256);
  for (auto* p : mine) { mr.deallocate(streams[3], p, 64 * KiB, 256); }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(eventually([&] {
    auto const stats = daemon_->stats();
    auto const& s    = session_line(stats, *session_);
    return s.carved_allocations() == 0 && s.idle_bytes() == 16 * MiB &&
           s.reclaimable_bytes() == 16 * MiB;
  })) << session_line(daemon_->stats(), *session_).DebugString();
  auto const shown = daemon_->rmmctl_stats();
  EXPECT_EQ(session_line(shown, *session_).idle_bytes(), 16 * MiB);
  EXPECT_EQ(session_line(shown, *session_).reclaimable_bytes(), 16 * MiB);
  EXPECT_EQ(gpu_pool(shown, 0).idle_bytes(), 16 * MiB);
  EXPECT_EQ(mr.trim(), 16 * MiB);
  EXPECT_TRUE(eventually([&] {
    auto const stats = daemon_->stats();
    return gpu_pool(stats, 0).in_use_bytes() == before &&
           session_line(stats, *session_).idle_bytes() == 0;
  })) << daemon_->stats().DebugString();
  for (auto s : streams) { ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess); }
}

TEST_F(IpcMemoryResource, CarvingLanesAboveSixteenAreRefused)
{
  EXPECT_NO_THROW(rmmd::ipc_memory_resource(*session_, 0, lanes(rmmd::auto_carving_lanes, 1h)));
  EXPECT_NO_THROW(rmmd::ipc_memory_resource(*session_, 0, lanes(16, 1h)));
  EXPECT_THROW(rmmd::ipc_memory_resource(*session_, 0, lanes(17, 1h)), rmmd::logic_error);
  try {
    rmmd::ipc_memory_resource mr(*session_, 0, lanes(17, 1h));
  } catch (rmmd::logic_error const& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("carving_lanes is 17; it must be 1 to 16, or "
                          "rmmd::auto_carving_lanes"));
  }
}

TEST(SlabMode, QuotasCountSlabsWhole)
{
  REQUIRE_GPUS(1);
  daemon_process daemon({"--cuda-pool-bytes", "1GiB", "--session-quota-bytes", "96MiB"});
  auto s = daemon.open_session("slab-quota");
  rmmd::ipc_memory_resource mr(s, 0, slabs(64 * MiB, 1h));
  cuda::stream_ref stream{cudaStream_t{}};
  void* small = mr.allocate(stream, MiB, 256);
  EXPECT_EQ(gpu_pool(daemon.stats(), 0).in_use_bytes(), 64 * MiB);  // the slab, not the MiB
  void* more = mr.allocate(stream, 40 * MiB, 256);                  // carved from the same slab
  EXPECT_EQ(gpu_pool(daemon.stats(), 0).in_use_bytes(), 64 * MiB);
  // Another 40 MiB needs a second slab: 64 + 40 MiB is over the 96 MiB quota.
  EXPECT_THROW((void)mr.allocate(stream, 40 * MiB, 256), rmm::out_of_memory);
  EXPECT_EQ(gpu_pool(daemon.stats(), 0).in_use_bytes(), 64 * MiB);
  mr.deallocate(stream, more, 40 * MiB, 256);
  mr.deallocate(stream, small, MiB, 256);
  EXPECT_GT(mr.trim(), 0u);
  EXPECT_TRUE(eventually([&] { return gpu_pool(daemon.stats(), 0).in_use_bytes() == 0; }));
}

TEST_F(IpcMemoryResource, AKilledFastPathClientsSlabsGoBackToThePool)
{
  auto const before = gpu_pool(daemon_->stats(), 0);
  child_process holder({program_path("rmmd_test_client").string(), "slab-hold", "10485760", "3"},
                       {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()});
  ASSERT_EQ(holder.read_line(60s), "ready");
  EXPECT_GE(gpu_pool(daemon_->stats(), 0).in_use_bytes(), before.in_use_bytes() + 10485760);
  holder.kill(SIGKILL);
  ASSERT_EQ(holder.wait(), 128 + SIGKILL);
  EXPECT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon_->stats(), 0);
    return p.in_use_bytes() == before.in_use_bytes() &&
           p.backend_used_bytes() == before.backend_used_bytes() && p.carved_bytes() == 0;
  })) << gpu_pool(daemon_->stats(), 0).DebugString();
}

TEST(SlabMode, IdleSlabsOfAnotherSessionServeARequestAtOnce)
{
  // Memory that moves: the daemon asks the hoarder for its idle
  // slab and holds the request until it is back, instead of refusing it.
  REQUIRE_GPUS(1);
  daemon_process daemon({"--cuda-pool-bytes", "512MiB", "--reclaim-timeout-ms", "10000"});
  auto hoarder = daemon.open_session("hoarder");
  rmmd::ipc_memory_resource slab_mr(hoarder, 0, slabs(256 * MiB, 1h));  // never idle-trims
  cuda::stream_ref stream{cudaStream_t{}};
  slab_mr.deallocate(stream, slab_mr.allocate(stream, MiB, 256), MiB, 256);
  stream.sync();
  // Its keeper reports the idle slab within a tick.
  ASSERT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon.stats(), 0);
    return p.in_use_bytes() == 256 * MiB && p.reclaimable_bytes() == 256 * MiB &&
           p.idle_bytes() == 256 * MiB;
  })) << gpu_pool(daemon.stats(), 0).DebugString();

  auto needy = daemon.open_session("needy");
  rmmd::ipc_memory_resource direct_mr(needy, 0, direct);
  auto const start = std::chrono::steady_clock::now();
  void* big        = direct_mr.allocate(stream, 384 * MiB, 256);  // does not fit beside the slab
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);        // not the 10 s deadline
  auto after = gpu_pool(daemon.stats(), 0);
  EXPECT_EQ(after.reclaim_served(), 1u);
  EXPECT_EQ(after.idle_bytes(), 0u);
  direct_mr.deallocate(stream, big, 384 * MiB, 256);
  stream.sync();
  // The free travels on the needy's socket without a reply: the hoarder's
  // next lease (on its own socket) may come first unless we wait for it.
  ASSERT_TRUE(eventually([&] { return gpu_pool(daemon.stats(), 0).in_use_bytes() == 0; }));
  // The hoarder carves on: a new slab, leased as it needs one.
  slab_mr.deallocate(stream, slab_mr.allocate(stream, MiB, 256), MiB, 256);
  stream.sync();
}

TEST(SlabMode, IdleSlabsOfEveryLaneServeAnotherSessionsRequest)
{
  // A lane's slabs go back on the same terms as any slab: two threads of
  // the hoarder hold a lane each, and both lanes' idle slabs are needed.
  REQUIRE_GPUS(1);
  daemon_process daemon({"--cuda-pool-bytes", "512MiB", "--reclaim-timeout-ms", "10000"});
  auto hoarder          = daemon.open_session("hoarder");
  auto options          = slabs(192 * MiB, 1h);  // never idle-trims
  options.carving_lanes = 2;
  rmmd::ipc_memory_resource slab_mr(hoarder, 0, options);
  cuda::stream_ref stream{cudaStream_t{}};
  slab_mr.deallocate(stream, slab_mr.allocate(stream, MiB, 256), MiB, 256);
  EXPECT_EQ(on_threads(1,
                       [&](int) {
                         slab_mr.deallocate(stream, slab_mr.allocate(stream, MiB, 256), MiB, 256);
                       }),
            0);
  stream.sync();
  ASSERT_TRUE(eventually([&] {
    auto p = gpu_pool(daemon.stats(), 0);
    return p.in_use_bytes() == 384 * MiB && p.reclaimable_bytes() == 384 * MiB &&
           p.idle_bytes() == 384 * MiB;
  })) << gpu_pool(daemon.stats(), 0).DebugString();

  auto needy = daemon.open_session("needy");
  rmmd::ipc_memory_resource direct_mr(needy, 0, direct);
  void* big  = direct_mr.allocate(stream, 384 * MiB, 256);  // fits beside neither slab
  auto after = gpu_pool(daemon.stats(), 0);
  EXPECT_EQ(after.reclaim_served(), 1u);
  EXPECT_EQ(after.idle_bytes(), 0u);
  direct_mr.deallocate(stream, big, 384 * MiB, 256);
  stream.sync();
  ASSERT_TRUE(eventually([&] { return gpu_pool(daemon.stats(), 0).in_use_bytes() == 0; }));
}

TEST(SlabMode, IdleSlabsGoBackWhenThePoolIsUnderPressure)
{
  REQUIRE_GPUS(1);
  // Without reclaim requests (reclaim_timeout 0): the older, slower way.
  daemon_process daemon({"--cuda-pool-bytes", "512MiB", "--reclaim-timeout-ms", "0"});
  auto hoarder = daemon.open_session("hoarder");
  rmmd::ipc_memory_resource slab_mr(hoarder, 0, slabs(256 * MiB, 1h));  // never idle-trims
  cuda::stream_ref stream{cudaStream_t{}};
  slab_mr.deallocate(stream, slab_mr.allocate(stream, MiB, 256), MiB, 256);
  stream.sync();
  ASSERT_EQ(gpu_pool(daemon.stats(), 0).in_use_bytes(), 256 * MiB);  // an idle slab

  auto needy = daemon.open_session("needy");
  rmmd::ipc_memory_resource direct_mr(needy, 0, direct);
  // 384 MiB does not fit beside the idle slab: the failure puts the pool under
  // pressure, the hoarder hears of it at its next report and gives the slab back.
  EXPECT_THROW((void)direct_mr.allocate(stream, 384 * MiB, 256), rmm::out_of_memory);
  void* big = nullptr;
  EXPECT_TRUE(eventually([&] {
    try {
      big = direct_mr.allocate(stream, 384 * MiB, 256);
      return true;
    } catch (rmm::out_of_memory const&) {
      return false;
    }
  })) << gpu_pool(daemon.stats(), 0).DebugString();
  if (big != nullptr) { direct_mr.deallocate(stream, big, 384 * MiB, 256); }
}

TEST(PinnedHostMemory, TheGpuReadsWhatAnotherProcessWroteAndTheOtherWayRound)
{
  REQUIRE_GPUS(1);
  daemon_process daemon({"--cuda-pool-bytes", "1GiB", "--host-pool-bytes", "256MiB"});
  auto s = daemon.open_session("pinned");
  ASSERT_TRUE(s.host_pool().pinnable) << "on a GPU node the host pool is pinnable by default";
  rmmd::pinned_host_memory_resource mr(s);
  cuda::mr::any_resource<cuda::mr::host_accessible, cuda::mr::device_accessible> any{mr};
  cudaStream_t stream{};
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  constexpr std::size_t bytes = 8 << 20;
  std::vector<std::uint64_t> host(bytes / 8);
  auto const env    = std::vector<std::string>{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  auto const client = program_path("rmmd_test_client").string();
  // Several rounds through the same pool range: freed pages must stay the ones
  // every process (and the GPU) maps.
  for (std::uint64_t round = 0; round < 3; ++round) {
    void* p          = any.allocate(stream, bytes, 256);
    auto const range = [&](std::uint64_t seed) {
      return std::to_string(mr.offset_of(p)) + ":" + std::to_string(bytes) + ":" +
             std::to_string(seed);
    };
    child_process writer({client, "write", range(round)}, env);
    EXPECT_EQ(writer.read_line(60s), "written 1");
    ASSERT_EQ(writer.wait(60s), 0);

    // The GPU's copy engine reads the pinned pages: into device memory, and back.
    void* d = nullptr;
    ASSERT_EQ(cudaMallocAsync(&d, bytes, stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(d, p, bytes, cudaMemcpyDefault, stream), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(host.data(), d, bytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(first_mismatch(host.data(), bytes, round), -1) << "round " << round;

    // And writes them: another process sees what the GPU wrote.
    fill(host.data(), bytes, round + 100);
    ASSERT_EQ(cudaMemcpyAsync(d, host.data(), bytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(p, 0, bytes, stream), cudaSuccess);  // the device writes the pool
    ASSERT_EQ(cudaMemcpyAsync(p, d, bytes, cudaMemcpyDefault, stream), cudaSuccess);
    ASSERT_EQ(cudaFreeAsync(d, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    child_process verifier({client, "verify", range(round + 100)}, env);
    EXPECT_EQ(verifier.read_line(60s), "verified 1") << "round " << round;
    EXPECT_EQ(verifier.wait(60s), 0);

    any.deallocate(stream, p, bytes, 256);  // waits for the stream, then frees
  }
  EXPECT_EQ(daemon.stats().pools(0).in_use_bytes(), 0u);
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

TEST(IpcMemoryResourceMultiGpu, EachDeviceHasItsPool)
{
  REQUIRE_GPUS(2);
  daemon_process daemon({"--cuda-pool-bytes", "1GiB"});
  auto s = daemon.open_session("multi-gpu");
  cuda::stream_ref stream{cudaStream_t{}};
  for (int device = 0; device < gpu_count(); ++device) {
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    rmmd::ipc_memory_resource mr(s, direct);  // the current device's pool
    EXPECT_EQ(mr.pool().device, device);
    rmm::device_uvector<int> v(1000, stream, mr);
    ASSERT_EQ(cudaMemsetAsync(v.data(), 0, 4000, stream.get()), cudaSuccess);
    EXPECT_EQ(v.element(999, stream), 0);
    cudaPointerAttributes attrs{};
    ASSERT_EQ(cudaPointerGetAttributes(&attrs, v.data()), cudaSuccess);
    EXPECT_EQ(attrs.device, device);
    // 4000 bytes: a packed lease, in a block of the session's on that device.
    EXPECT_EQ(gpu_pool(daemon.stats(), device).in_use_bytes(), 2 * MiB);
    EXPECT_EQ(gpu_pool(daemon.stats(), device).allocation_count(), 1u);
  }
  cudaSetDevice(0);
}

}  // namespace
}  // namespace rmmd::test

namespace rmmd::test {
namespace {

bool imex_channel_exists()
{
  std::error_code ec;
  auto it = std::filesystem::directory_iterator("/dev/nvidia-caps-imex-channels", ec);
  return !ec && it != std::filesystem::directory_iterator{};
}

TEST(FabricPool, EndToEndThroughTheFabricHandleWhenAnImexChannelExists)
{
  REQUIRE_GPUS(1);
  if (!imex_channel_exists()) {
    GTEST_SKIP() << "no IMEX channel device in /dev/nvidia-caps-imex-channels (the no-channel "
                    "test covers this host)";
  }
  daemon_process daemon({"--cuda-pool-bytes", "1GiB", "--fabric", "on"});
  rmmd::session s(rmmd::session::options{
      .runtime_dir = daemon.runtime_dir(), .client_name = "fabric", .import_by_fabric = true});
  auto const& pool = s.device_pool(0);
  EXPECT_TRUE(pool.has_fabric_handle);
  rmmd::ipc_memory_resource mr(s, 0, direct);
  cuda::stream_ref stream{cudaStream_t{}};
  rmm::device_uvector<int> v(1 << 20, stream, mr);
  ASSERT_EQ(cudaMemsetAsync(v.data(), 0, v.size() * sizeof(int), stream.get()), cudaSuccess);
  v.set_element(4242, 17, stream);
  EXPECT_EQ(v.element(4242, stream), 17);
  auto const stats = gpu_pool(daemon.stats(), 0);  // a copy: stats() is a temporary
  EXPECT_THAT(stats.pool().handle_types(), ::testing::Contains(v1::HANDLE_TYPE_FABRIC));
  EXPECT_EQ(stats.in_use_bytes(), v.size() * sizeof(int));
}

TEST(FabricPool, WithoutAnImexChannelTheDaemonSaysWhyAndServesPosixFd)
{
  REQUIRE_GPUS(1);
  if (imex_channel_exists()) {
    GTEST_SKIP() << "an IMEX channel device exists (the fabric end-to-end test covers this host)";
  }
  char tmpl[] = "/tmp/rmmd-nofabric-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::filesystem::path dir = tmpl;
  child_process daemon(
      {program_path("rmmd").string(), "--runtime-dir", dir.string(), "--cuda-pool-bytes", "1GiB"},
      {},
      {.merge_stderr = true});
  std::string log;
  while (auto line = daemon.read_line(60s)) {
    log += *line + "\n";
    if (line->find("ready:") != std::string::npos) { break; }
  }
  EXPECT_THAT(log, HasSubstr("no fabric handles, posix-fd only: no usable IMEX channel"));
  EXPECT_THAT(log, HasSubstr("mknod"));
  ASSERT_THAT(log, HasSubstr("ready:"));
  {
    rmmd::session s(rmmd::session::options{.runtime_dir = dir, .client_name = "posix"});
    EXPECT_FALSE(s.device_pool(0).has_fabric_handle);
    rmmd::ipc_memory_resource mr(s, 0);
    cuda::stream_ref stream{cudaStream_t{}};
    rmm::device_uvector<int> v(1000, stream, mr);
    v.set_element(999, 5, stream);
    EXPECT_EQ(v.element(999, stream), 5);
    rmmd::session by_fabric(rmmd::session::options{.runtime_dir = dir, .import_by_fabric = true});
    try {
      rmmd::ipc_memory_resource refused(by_fabric, 0);
      FAIL() << "imported a pool that has no fabric handle";
    } catch (rmmd::logic_error const& e) {
      EXPECT_THAT(e.what(), HasSubstr("has no fabric handle"));
    }
  }
  // And --fabric=on refuses to serve that pool rather than serve it wrongly.
  daemon.kill(SIGTERM);
  EXPECT_EQ(daemon.wait(30s), 0);
  child_process strict(
      {program_path("rmmd").string(), "--runtime-dir", dir.string(), "--fabric", "on"},
      {},
      {.merge_stderr = true});
  std::string strict_log;
  while (auto line = strict.read_line(60s)) {
    strict_log += *line + "\n";
    if (line->find("ready:") != std::string::npos) { break; }
  }
  EXPECT_THAT(
      strict_log,
      HasSubstr(
          "pool 'gpu0' is not served: it requires fabric handles, but no usable IMEX channel"));
  EXPECT_THAT(strict_log, HasSubstr("ready: 1 pool(s)"));  // the host pool still serves
  strict.kill(SIGTERM);
  EXPECT_EQ(strict.wait(30s), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace rmmd::test
