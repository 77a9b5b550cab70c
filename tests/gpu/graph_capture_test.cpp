// rmmd::ipc_memory_resource under CUDA stream capture against the real
// daemon: in direct mode and in graph-safe slab mode (capture_checks::
// every_call), a graph that allocates, copies, sets and frees is captured,
// replayed 1,000 times, and the daemon hears each Free once (its ledger back
// to zero, no call refused); in default slab mode (no check on the fast
// path), an allocation during capture that needs a slab is a lease of its
// own, and a free during capture does what it does under RMM's pool.
// Every test skips, saying why, without a GPU.

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"

#include <rmmd/error.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/shared_buffer.hpp>

#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

/// The pool `session` allocates from by default: its current device's, as
/// this process numbers devices (the daemon's ordinals may differ).
std::uint32_t current_device_pool(rmmd::session const& session)
{
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) { throw std::runtime_error("no current device"); }
  return session.device_pool(device).id;
}

/// Pool `id`'s row of the daemon's stats.
v1::PoolStats pool_row(v1::Stats const& stats, std::uint32_t id)
{
  for (auto const& p : stats.pools()) {
    if (p.pool().id() == id) { return p; }
  }
  throw std::runtime_error("no pool " + std::to_string(id) + " in:\n" + stats.DebugString());
}

class GraphCapture : public ::testing::TestWithParam<rmmd::allocation_mode> {
 protected:
  void SetUp() override
  {
    REQUIRE_GPUS(1);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // whatever an earlier test left current
    daemon_ =
        std::make_unique<daemon_process>(std::vector<std::string>{"--cuda-pool-bytes", "1GiB"});
    session_ = std::make_unique<rmmd::session>(daemon_->open_session("graph-test"));
    pool_id_ = current_device_pool(*session_);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override
  {
    if (stream_ != nullptr) { cudaStreamDestroy(stream_); }
  }

  [[nodiscard]] rmmd::ipc_resource_options options() const
  {
    // Slab mode's graph-safe setting; direct mode checks every call anyway.
    return {.mode       = GetParam(),
            .slab_bytes = std::size_t{8} << 20,
            .capture    = rmmd::capture_checks::every_call};
  }

  /// The daemon's count of this pool's leases (direct allocations, packed
  /// ones and slabs alike).
  [[nodiscard]] std::uint64_t leases() const
  {
    return pool_row(daemon_->stats(), pool_id_).allocation_count();
  }

  std::unique_ptr<daemon_process> daemon_;
  std::unique_ptr<rmmd::session> session_;
  std::uint32_t pool_id_{};  // the pool the tests' resources allocate from
  cudaStream_t stream_{};
};

TEST_P(GraphCapture, AGraphThatAllocatesAndFreesReplaysAThousandTimesAndFreesOnce)
{
  testing::internal::CaptureStderr();      // where the client prints a refused Free
  constexpr std::size_t n     = 64 * KiB;  // ints: 256 KiB, a lease of its own in direct mode
  constexpr std::size_t bytes = n * sizeof(int);
  constexpr std::size_t small = 4 * KiB;  // packed into a block in direct mode
  std::vector<int> host(n);
  std::iota(host.begin(), host.end(), 11);
  {
    rmmd::ipc_memory_resource mr(*session_, options());
    ASSERT_EQ(mr.pool().id, pool_id_);  // the row read below is this resource's pool's
    cuda::stream_ref stream{stream_};
    auto* in      = static_cast<int*>(mr.allocate(stream, bytes, 256));
    auto* out     = static_cast<int*>(mr.allocate(stream, bytes, 256));
    auto* scratch = static_cast<int*>(mr.allocate(stream, small, 256));  // freed during capture
    ASSERT_EQ(cudaMemcpyAsync(in, host.data(), bytes, cudaMemcpyHostToDevice, stream_),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    auto const before_capture = leases();

    // Captured in the global mode, PyTorch's default: the allocations'
    // imports are calls that mode forbids, unless the resource relaxes it.
    ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
    void* tmp        = nullptr;
    void* tmp_small  = nullptr;
    bool captured_ok = true;
    try {
      tmp       = mr.allocate(stream, bytes, 256);
      tmp_small = mr.allocate(stream, small, 256);
    } catch (std::exception const& e) {
      ADD_FAILURE() << "allocate during capture: " << e.what();
      captured_ok = false;
    }
    if (captured_ok) {
      // out = in, with its first 64 bytes set to 0x01 by way of tmp_small.
      EXPECT_EQ(cudaMemcpyAsync(tmp, in, bytes, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
      EXPECT_EQ(cudaMemsetAsync(tmp_small, 0x01, 64, stream_), cudaSuccess);
      EXPECT_EQ(cudaMemcpyAsync(tmp, tmp_small, 64, cudaMemcpyDeviceToDevice, stream_),
                cudaSuccess);
      EXPECT_EQ(cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
      EXPECT_EQ(cudaMemcpyAsync(scratch, tmp, small, cudaMemcpyDeviceToDevice, stream_),
                cudaSuccess);
      mr.deallocate(stream, tmp_small, small, 256);
      mr.deallocate(stream, tmp, bytes, 256);
      mr.deallocate(stream, scratch, small, 256);  // allocated before the capture
    }
    cudaGraph_t graph{};
    ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
    ASSERT_TRUE(captured_ok);
    cudaGraphExec_t exec{};
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

    // The graph keeps what it allocated and what it freed: in direct mode
    // the captured allocations are leases of their own (the small one may
    // share a packed block), in slab mode too (never carved).
    auto const while_held = leases();
    EXPECT_GT(while_held, before_capture) << daemon_->stats().DebugString();

    std::vector<int> expected = host;
    std::memset(expected.data(), 0x01, 64);
    std::vector<int> seen(n);
    for (int replay = 0; replay < 1000; ++replay) {
      ASSERT_EQ(cudaMemsetAsync(out, 0xff, bytes, stream_), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
      if (replay % 100 == 99) {
        ASSERT_EQ(cudaMemcpyAsync(seen.data(), out, bytes, cudaMemcpyDeviceToHost, stream_),
                  cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        ASSERT_EQ(seen, expected) << "replay " << replay;
      }
    }
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    // Nothing was freed per replay: the daemon still lends what the graph holds.
    EXPECT_EQ(leases(), while_held);

    ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    // CUDA lets go of the graph's user objects on a thread of its own; the
    // resource frees what they held at its next call.
    EXPECT_TRUE(eventually([&] {
      static_cast<void>(mr.trim());
      return leases() < while_held;
    })) << pool_row(daemon_->stats(), pool_id_).DebugString();
    mr.deallocate(stream, in, bytes, 256);
    mr.deallocate(stream, out, bytes, 256);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  // The ledger back to zero: each lease freed once.
  EXPECT_TRUE(eventually([&] {
    auto const pool = pool_row(daemon_->stats(), pool_id_);
    return pool.allocation_count() == 0u && pool.in_use_bytes() == 0u;
  })) << pool_row(daemon_->stats(), pool_id_).DebugString();
  auto const printed = testing::internal::GetCapturedStderr();
  EXPECT_THAT(printed, Not(HasSubstr("failed")));
  EXPECT_THAT(printed, Not(HasSubstr("not found")));
  EXPECT_THAT(printed, Not(HasSubstr("did not allocate")));
}

TEST_P(GraphCapture, AnAbandonedCaptureGivesItsMemoryBack)
{
  {
    rmmd::ipc_memory_resource mr(*session_, options());
    cuda::stream_ref stream{stream_};
    ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    void* p = mr.allocate(stream, 256 * KiB, 256);
    EXPECT_EQ(cudaMemsetAsync(p, 0, 256 * KiB, stream_), cudaSuccess);
    mr.deallocate(stream, p, 256 * KiB, 256);
    cudaGraph_t graph{};
    ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);  // never instantiated
    EXPECT_TRUE(eventually([&] {
      static_cast<void>(mr.trim());
      return leases() == 0u;
    })) << pool_row(daemon_->stats(), pool_id_).DebugString();
  }
  EXPECT_TRUE(eventually([&] { return leases() == 0u; }));
}

TEST_P(GraphCapture, AllocationsOutsideTheCaptureStillWorkWhileAGraphHoldsMemory)
{
  rmmd::ipc_memory_resource mr(*session_, options());
  cuda::stream_ref stream{stream_};
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  void* held = mr.allocate(stream, 64 * KiB, 256);
  EXPECT_EQ(cudaMemsetAsync(held, 3, 64 * KiB, stream_), cudaSuccess);
  mr.deallocate(stream, held, 64 * KiB, 256);
  cudaGraph_t graph{};
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  cudaGraphExec_t exec{};
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // Not captured: carved (slab) or leased (direct) as usual, never the
  // memory the graph holds.
  for (int i = 0; i < 100; ++i) {
    void* p = mr.allocate(stream, 64 * KiB, 256);
    EXPECT_NE(p, held);
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    mr.deallocate(stream, p, 64 * KiB, 256);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

TEST_P(GraphCapture, AnAllocationOfItsOwnFreedDuringCaptureIsTheGraphsUntilItIsDestroyed)
{
  auto o                 = options();
  o.own_allocation_above = 48 * MiB;  // 64 MiB: address-stable memory of its own
  rmmd::ipc_memory_resource mr(*session_, o);
  cuda::stream_ref stream{stream_};
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  void* p = mr.allocate(stream, 64 * MiB, 256);
  ASSERT_EQ(cudaMemsetAsync(p, 1, 64 * MiB, stream_), cudaSuccess);
  mr.deallocate(stream, p, 64 * MiB, 256);
  cudaGraph_t graph{};
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  cudaGraphExec_t exec{};
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int i = 0; i < 3; ++i) { ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess); }
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_GE(pool_row(daemon_->stats(), pool_id_).in_use_bytes(), 64 * MiB) << "the graph holds it";
  ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(eventually([&] {
    mr.trim();  // frees what destroyed graphs let go of
    return pool_row(daemon_->stats(), pool_id_).in_use_bytes() == 0u;
  }));
}

TEST_P(GraphCapture, PublishOnACapturingStreamIsRefusedNamingTheCapture)
{
  auto buffer = rmmd::shared_buffer::create(*session_, "graphs/refused", 64 * KiB);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
  try {
    buffer.publish(cuda::stream_ref{stream_});
    ADD_FAILURE() << "publish during capture was not refused";
  } catch (rmmd::precondition_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("capturing a CUDA graph"));
  }
  cudaGraph_t graph{};
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  buffer.publish(cuda::stream_ref{stream_});  // outside the capture it goes
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
}

INSTANTIATE_TEST_SUITE_P(Modes,
                         GraphCapture,
                         ::testing::Values(rmmd::allocation_mode::slab,
                                           rmmd::allocation_mode::direct),
                         [](auto const& info) {
                           return info.param == rmmd::allocation_mode::slab ? "slab_every_call"
                                                                            : "direct";
                         });

/// Slab mode with the default capture_checks: nothing asked on the fast path.
class SlabCaptureDefault : public ::testing::Test {
 protected:
  static constexpr std::size_t slab = std::size_t{8} << 20;

  void SetUp() override
  {
    REQUIRE_GPUS(1);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // whatever an earlier test left current
    daemon_ =
        std::make_unique<daemon_process>(std::vector<std::string>{"--cuda-pool-bytes", "1GiB"});
    session_ = std::make_unique<rmmd::session>(daemon_->open_session("graph-default-test"));
    pool_id_ = current_device_pool(*session_);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override
  {
    if (stream_ != nullptr) { cudaStreamDestroy(stream_); }
  }
  [[nodiscard]] std::uint64_t leases() const
  {
    return pool_row(daemon_->stats(), pool_id_).allocation_count();
  }

  std::unique_ptr<daemon_process> daemon_;
  std::unique_ptr<rmmd::session> session_;
  std::uint32_t pool_id_{};  // the pool the tests' resources allocate from
  cudaStream_t stream_{};
};

TEST_F(SlabCaptureDefault, AnAllocationThatNeedsASlabDuringAGlobalCaptureIsALeaseOfItsOwn)
{
  testing::internal::CaptureStderr();
  constexpr std::size_t n     = 4 * (std::size_t{1} << 20);  // ints: 16 MiB, more than a slab
  constexpr std::size_t bytes = n * sizeof(int);
  std::vector<int> host(n);
  std::iota(host.begin(), host.end(), 7);
  {
    rmmd::ipc_memory_resource mr(*session_, {.slab_bytes = slab});
    cuda::stream_ref stream{stream_};
    auto* in  = static_cast<int*>(mr.allocate(stream, bytes, 256));  // the pool grows
    auto* out = static_cast<int*>(mr.allocate(stream, bytes, 256));
    ASSERT_EQ(cudaMemcpyAsync(in, host.data(), bytes, cudaMemcpyHostToDevice, stream_),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    auto const before_capture = leases();

    ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
    void* tmp = nullptr;
    try {
      // More than the slabs have left: the carver asks, finds the capture,
      // and leases it on its own in the relaxed mode.
      tmp = mr.allocate(stream, 2 * bytes, 256);
    } catch (std::exception const& e) {
      ADD_FAILURE() << "allocate during capture: " << e.what();
    }
    if (tmp != nullptr) {
      EXPECT_EQ(cudaMemcpyAsync(tmp, in, bytes, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
      EXPECT_EQ(cudaMemcpyAsync(out, tmp, bytes, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
      mr.deallocate(stream, tmp, 2 * bytes, 256);  // a lease of its own: the graph holds it
    }
    cudaGraph_t graph{};
    ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
    ASSERT_NE(tmp, nullptr);
    cudaGraphExec_t exec{};
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    auto const while_held = leases();
    EXPECT_EQ(while_held, before_capture + 1);

    std::vector<int> seen(n);
    for (int replay = 0; replay < 1000; ++replay) {
      ASSERT_EQ(cudaMemsetAsync(out, 0xff, bytes, stream_), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
      if (replay % 250 == 249) {
        ASSERT_EQ(cudaMemcpyAsync(seen.data(), out, bytes, cudaMemcpyDeviceToHost, stream_),
                  cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        ASSERT_EQ(seen, host) << "replay " << replay;
      }
    }
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(leases(), while_held);  // nothing sent per replay

    ASSERT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    ASSERT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    EXPECT_TRUE(eventually([&] {
      static_cast<void>(mr.trim());
      return leases() == before_capture;
    })) << pool_row(daemon_->stats(), pool_id_).DebugString();
    mr.deallocate(stream, in, bytes, 256);
    mr.deallocate(stream, out, bytes, 256);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  }
  EXPECT_TRUE(eventually([&] {
    auto const pool = pool_row(daemon_->stats(), pool_id_);
    return pool.allocation_count() == 0u && pool.in_use_bytes() == 0u;
  })) << pool_row(daemon_->stats(), pool_id_).DebugString();
  auto const printed = testing::internal::GetCapturedStderr();
  EXPECT_THAT(printed, Not(HasSubstr("failed")));
  EXPECT_THAT(printed, Not(HasSubstr("not found")));
}

TEST_F(SlabCaptureDefault, AFreeDuringCaptureDoesWhatRmmsPoolDoes)
{
  // The same steps on RMM's own pool and on the resource: allocate outside
  // a capture, free inside a global-mode one. Without a check per call the
  // resource's free is its RMM pool's, so the capture ends as under RMM's
  // pool (which records the free's event on the capturing stream), and no
  // lease comes or goes. A graph that frees what it did not allocate wants
  // capture_checks::every_call (the graph then keeps the memory).
  cuda::stream_ref stream{stream_};
  auto capture_a_free = [&](auto& mr) {
    void* p = mr.allocate(stream, 64 * KiB, 256);
    EXPECT_EQ(cudaMemsetAsync(p, 0, 64 * KiB, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), cudaSuccess);
    mr.deallocate(stream, p, 64 * KiB, 256);
    cudaGraph_t graph{};
    auto const ended = cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) { cudaGraphDestroy(graph); }
    cudaGetLastError();
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return ended;
  };
  rmm::mr::pool_memory_resource rmm_pool(rmm::mr::cuda_memory_resource{}, slab);
  auto const rmm_says = capture_a_free(rmm_pool);

  rmmd::ipc_memory_resource mr(*session_, {.slab_bytes = slab});
  void* first = mr.allocate(stream, 64 * KiB, 256);  // the slab, leased outside the capture
  mr.deallocate(stream, first, 64 * KiB, 256);
  auto const before_capture = leases();
  auto const we_say         = capture_a_free(mr);
  EXPECT_EQ(we_say, rmm_says) << "RMM's pool: " << cudaGetErrorName(rmm_says)
                              << ", the resource: " << cudaGetErrorName(we_say);
  EXPECT_EQ(leases(), before_capture);  // no lease came or went
  // The memory is the slab's again, as it would be RMM's pool's.
  void* q = mr.allocate(stream, 64 * KiB, 256);
  mr.deallocate(stream, q, 64 * KiB, 256);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(leases(), before_capture);
}

}  // namespace
}  // namespace rmmd::test
