#pragma once

// RMM's resource contract, kept by every client resource in every mode
// (DESIGN.md, Errors). One typed test suite: every body
// runs against every kind of resource_kinds.hpp, each against its own real
// daemon and a real session. The kinds are instantiated where they can run:
// the host kind in rmmd_integration_tests (client/resource_conformance_test.cpp),
// the GPU kinds in rmmd_gpu_tests (gpu/resource_conformance_test.cpp), where
// they skip, saying why, when CUDA sees no GPU.
//
// Every body ends with the daemon's ledger for the pool back at zero, and
// nothing printed on stderr (the fixture checks both).

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/client/resource_kinds.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/pattern.hpp"

#include <rmm/device_buffer.hpp>
#include <rmm/device_uvector.hpp>
#include <rmm/error.hpp>
#include <rmm/mr/limiting_resource_adaptor.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/mr/statistics_resource_adaptor.hpp>

#include <httplib.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <cuda/memory_resource>

#include <cuda_runtime_api.h>

#include <cxxabi.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <typeinfo>
#include <vector>

namespace rmmd::test {

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t PiB = std::size_t{1} << 50;

inline int gpu_count()
{
  static int const count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return count;
}

/// The dynamic type of `e`, for messages about the wrong exception.
inline std::string type_of(std::exception const& e)
{
  int status  = 0;
  char* name  = abi::__cxa_demangle(typeid(e).name(), nullptr, nullptr, &status);
  auto result = std::string(status == 0 && name != nullptr ? name : typeid(e).name());
  std::free(name);
  return result;
}

/// A stream for the bodies: a new non-blocking CUDA stream where CUDA sees a
/// GPU. Without one (the host kind on a machine without a GPU) it is
/// `fallback`, one of CUDA's special handles, on which no work can be queued;
/// cudaStreamPerThread is a different stream in every thread.
class test_stream {
 public:
  explicit test_stream(cudaStream_t fallback = cudaStreamLegacy) : stream_(fallback)
  {
    if (gpu_count() > 0) {
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
      owned_ = true;
    }
  }
  test_stream(test_stream const&)            = delete;
  test_stream& operator=(test_stream const&) = delete;
  ~test_stream()
  {
    if (owned_) { EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess); }
  }
  [[nodiscard]] cudaStream_t get() const noexcept
  {
    return stream_;
  }
  [[nodiscard]] cuda::stream_ref ref() const noexcept
  {
    return cuda::stream_ref{stream_};
  }
  /// Work queued on `later` from now on waits for what is queued on `this`.
  void before(test_stream const& later) const
  {
    if (gpu_count() == 0) { return; }  // nothing can be queued
    cudaEvent_t done{};
    ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(done, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamWaitEvent(later.stream_, done, 0), cudaSuccess);
    EXPECT_EQ(cudaEventDestroy(done), cudaSuccess);
  }

 private:
  cudaStream_t stream_{};
  bool owned_{false};
};

/// The bytes that a buffer of `bytes` written for `seed` holds.
inline std::vector<std::byte> pattern_bytes(std::uint64_t seed, std::size_t bytes)
{
  std::vector<std::uint64_t> words((bytes + 7) / 8);
  for (std::size_t i = 0; i < words.size(); ++i) { words[i] = pattern(seed, i); }
  std::vector<std::byte> out(bytes);
  std::memcpy(out.data(), words.data(), bytes);
  return out;
}

/// Writes `seed`'s pattern into `bytes` at `p` (allocated from a `Kind`
/// resource): directly where the host can reach it, else by a copy on `stream`.
template <typename Kind>
void write_pattern(void* p, std::size_t bytes, std::uint64_t seed, cudaStream_t stream)
{
  auto const data = pattern_bytes(seed, bytes);
  if constexpr (Kind::host_accessible) {
    std::memcpy(p, data.data(), bytes);
  } else {
    ASSERT_EQ(cudaMemcpyAsync(p, data.data(), bytes, cudaMemcpyDefault, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
}

/// The offset of the first byte at `p` that does not hold `seed`'s pattern;
/// -1 when all do.
template <typename Kind>
long first_difference(void const* p, std::size_t bytes, std::uint64_t seed, cudaStream_t stream)
{
  auto const expected = pattern_bytes(seed, bytes);
  std::vector<std::byte> seen(bytes);
  if constexpr (Kind::host_accessible) {
    // Pinned memory: what the GPU queued on `stream` comes first.
    if constexpr (Kind::device_accessible) {
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    }
    std::memcpy(seen.data(), p, bytes);
  } else {
    EXPECT_EQ(cudaMemcpyAsync(seen.data(), p, bytes, cudaMemcpyDefault, stream), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  }
  auto const at = std::mismatch(expected.begin(), expected.end(), seen.begin());
  return at.first == expected.end() ? -1 : static_cast<long>(at.first - expected.begin());
}

inline bool is_aligned(void const* p, std::size_t alignment)
{
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

/// What the daemon's ledger shows for one pool.
struct ledger_entry {
  std::uint64_t in_use_bytes{};
  std::uint64_t allocations{};
  bool operator==(ledger_entry const&) const = default;
};

inline void PrintTo(ledger_entry const& e, std::ostream* out)
{
  *out << e.in_use_bytes << " bytes in " << e.allocations << " allocation(s)";
}

template <typename Kind>
class ResourceConformance : public ::testing::Test {
 protected:
  using resource = typename Kind::resource;

  void SetUp() override
  {
    if (Kind::needs_gpu && gpu_count() == 0) {
      GTEST_SKIP() << Kind::name << " needs a CUDA GPU; CUDA sees none";
    }
    auto args = Kind::daemon_args();
    args.insert(args.end(), {"--metrics-address", "127.0.0.1:0"});
    daemon_.emplace(std::move(args));
    session_.emplace(daemon_->open_session(std::string("conformance-") + Kind::name));
    mr_.emplace(Kind::make(*session_));
    pool_id_       = Kind::pool(*session_).id;
    max_alignment_ = Kind::pool(*session_).max_alignment;
    // gtest's own capture (internal, but stable for years): the daemon's
    // stderr was inherited before it, so only this process's lines land here.
    ::testing::internal::CaptureStderr();
    capturing_stderr_ = true;
  }

  void TearDown() override
  {
    if (mr_) {
      EXPECT_TRUE(settles()) << Kind::name << " did not give everything back: the daemon holds "
                             << ::testing::PrintToString(held());
    }
    if (capturing_stderr_) {
      auto const printed = ::testing::internal::GetCapturedStderr();
      EXPECT_EQ(printed, "") << Kind::name << " printed on stderr";
    }
  }

  /// The daemon's ledger for the resource's pool.
  ledger_entry held() const
  {
    auto const stats = daemon_->stats();
    for (auto const& p : stats.pools()) {
      if (p.pool().id() == pool_id_) { return {p.in_use_bytes(), p.allocation_count()}; }
    }
    ADD_FAILURE() << "the daemon's stats have no pool " << pool_id_;
    return {};
  }

  /// Whether the pool's ledger gets back to zero, once the resource gives
  /// back what it keeps while idle (slabs) and the daemon has seen the frees
  /// that wait on a stream.
  bool settles()
  {
    return eventually([&] {
      Kind::give_back_idle(*mr_);
      return held() == ledger_entry{};
    });
  }

  /// Allocate or Free requests the daemon has answered so far, on the session
  /// sockets and over gRPC (its metrics).
  std::uint64_t requests(std::string_view method)
  {
    if (metrics_port_ == 0) {
      v1::HealthResponse health;
      auto ctx    = rmmd::detail::impl_of(*session_).context();
      auto status = rmmd::detail::impl_of(*session_).stub().Health(ctx.get(), {}, &health);
      EXPECT_TRUE(status.ok()) << status.error_message();
      auto const& address = health.metrics_address();
      metrics_host_       = address.substr(0, address.rfind(':'));
      metrics_port_       = std::stoi(address.substr(address.rfind(':') + 1));
    }
    httplib::Client client(metrics_host_, metrics_port_);
    client.set_connection_timeout(std::chrono::seconds(10));
    client.set_read_timeout(std::chrono::seconds(10));
    auto response = client.Get("/metrics");
    EXPECT_TRUE(response && response->status == 200) << "scraping the daemon's metrics failed";
    if (!response) { return 0; }
    std::uint64_t total = 0;
    int series          = 0;
    std::istringstream lines(response->body);
    auto const label = "{method=\"" + std::string(method) + "\",";
    for (std::string line; std::getline(lines, line);) {
      for (std::string_view name : {"rmmd_session_calls_total", "rmmd_grpc_requests_total"}) {
        if (line.starts_with(std::string(name) + label)) {
          total += std::stoull(line.substr(line.rfind(' ') + 1));
          ++series;
        }
      }
    }
    EXPECT_GT(series, 0) << "the daemon's metrics count no " << method << " calls";
    return total;
  }

  /// Power-of-two alignments from 1 to the pool's largest (at most `cap`).
  std::vector<std::size_t> alignments(std::size_t cap = std::size_t{1} << 21) const
  {
    std::vector<std::size_t> out;
    for (std::size_t a = 1; a <= std::min(max_alignment_, cap); a *= 2) { out.push_back(a); }
    return out;
  }

  test_stream stream_{cudaStreamLegacy};  // outlives the resource that used it
  std::optional<daemon_process> daemon_;
  std::optional<rmmd::session> session_;
  std::optional<resource> mr_;
  std::uint32_t pool_id_{};
  std::size_t max_alignment_{};

 private:
  bool capturing_stderr_{false};
  std::string metrics_host_;
  int metrics_port_{0};
};

TYPED_TEST_SUITE_P(ResourceConformance);

// --- zero bytes and null pointers -----------------------------------------

/// Expects `allocate` (an allocation of 0 bytes, `form` in messages) to
/// return nullptr without throwing.
template <typename Allocate>
void expect_null(std::string_view form, Allocate&& allocate)
{
  try {
    void* p = allocate();
    EXPECT_EQ(p, nullptr) << form << " of 0 bytes";
  } catch (std::exception const& e) {
    ADD_FAILURE() << form << " of 0 bytes threw " << type_of(e) << ": " << e.what();
  }
}

TYPED_TEST_P(ResourceConformance, AllocatingZeroBytesReturnsNullWithoutARequest)
{
  auto& mr          = *this->mr_;
  auto stream       = this->stream_.ref();
  auto const calls  = this->requests("Allocate");
  auto const ledger = this->held();
  expect_null("allocate", [&] { return mr.allocate(stream, 0, 256); });
  expect_null("allocate_sync", [&] { return mr.allocate_sync(0, 256); });
  expect_null("allocate, alignment 1,", [&] { return mr.allocate(stream, 0, 1); });
  // From a worker thread, where an exception that escaped would end the process.
  std::thread worker([&] {
    expect_null("allocate on a worker thread",
                [&] { return mr.allocate(cuda::stream_ref{cudaStreamPerThread}, 0, 256); });
  });
  worker.join();
  EXPECT_EQ(this->requests("Allocate"), calls) << "allocate(0) sent the daemon a request";
  EXPECT_EQ(this->held(), ledger);

  // Once the resource holds memory (slab mode: a slab), zero bytes is still
  // nothing, and needs no deallocate: the real buffer alone goes back.
  void* p = mr.allocate(stream, 4 * KiB, 256);
  ASSERT_NE(p, nullptr);
  auto const calls_after = this->requests("Allocate");
  expect_null("allocate", [&] { return mr.allocate(stream, 0, 256); });
  expect_null("allocate_sync", [&] { return mr.allocate_sync(0, 256); });
  EXPECT_EQ(this->requests("Allocate"), calls_after) << "allocate(0) sent the daemon a request";
  mr.deallocate(stream, p, 4 * KiB, 256);
}

TYPED_TEST_P(ResourceConformance, DeallocatingNullDoesNothing)
{
  auto& mr          = *this->mr_;
  auto const frees  = this->requests("Free");
  auto const ledger = this->held();
  mr.deallocate(this->stream_.ref(), nullptr, 0, 256);
  mr.deallocate(this->stream_.ref(), nullptr, 4 * KiB, 256);
  mr.deallocate_sync(nullptr, 0, 256);
  mr.deallocate_sync(nullptr, 4 * KiB, 256);
  // What allocate(0) returned goes back as RMM's containers give it back.
  mr.deallocate(this->stream_.ref(), mr.allocate(this->stream_.ref(), 0, 256), 0, 256);
  mr.deallocate_sync(mr.allocate_sync(0, 256), 0, 256);
  EXPECT_EQ(this->requests("Free"), frees) << "deallocate(nullptr) sent the daemon a request";
  EXPECT_EQ(this->held(), ledger);

  // With memory held, a null deallocate leaves the real allocation's
  // bookkeeping alone: it still goes back, and the ledger gets to zero.
  void* p = mr.allocate(this->stream_.ref(), 64 * KiB, 256);
  write_pattern<TypeParam>(p, 64 * KiB, 1, this->stream_.get());
  mr.deallocate(this->stream_.ref(), nullptr, 64 * KiB, 256);
  mr.deallocate_sync(nullptr, 64 * KiB, 256);
  EXPECT_EQ(first_difference<TypeParam>(p, 64 * KiB, 1, this->stream_.get()), -1);
  mr.deallocate(this->stream_.ref(), p, 64 * KiB, 256);
}

// --- running out of memory -------------------------------------------------

TYPED_TEST_P(ResourceConformance, ARequestNoPoolCanHoldIsOutOfMemory)
{
  auto& mr    = *this->mr_;
  auto expect = [](char const* form, auto&& allocate) {
    try {
      void* p = allocate();
      ADD_FAILURE() << form << " of 1 PiB returned " << p;
    } catch (rmm::out_of_memory const& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("out_of_memory")) << form;
    } catch (std::exception const& e) {
      ADD_FAILURE() << form << " of 1 PiB threw " << type_of(e)
                    << ", not rmm::out_of_memory: " << e.what();
    }
  };
  expect("allocate", [&] { return mr.allocate(this->stream_.ref(), PiB, 256); });
  expect("allocate_sync", [&] { return mr.allocate_sync(PiB, 256); });
  // Through the type-erased wrappers RMM's containers use.
  if constexpr (TypeParam::device_accessible) {
    cuda::mr::any_resource<cuda::mr::device_accessible> any{mr};
    expect("any_resource::allocate", [&] { return any.allocate(this->stream_.ref(), PiB, 256); });
  } else {
    cuda::mr::any_resource<cuda::mr::host_accessible> any{mr};
    expect("any_resource::allocate", [&] { return any.allocate(this->stream_.ref(), PiB, 256); });
  }
  // And the resource goes on serving.
  void* p = mr.allocate(this->stream_.ref(), 4 * KiB, 256);
  write_pattern<TypeParam>(p, 4 * KiB, 2, this->stream_.get());
  EXPECT_EQ(first_difference<TypeParam>(p, 4 * KiB, 2, this->stream_.get()), -1);
  mr.deallocate(this->stream_.ref(), p, 4 * KiB, 256);
}

// --- allocate_sync / deallocate_sync, alignment ---------------------------

TYPED_TEST_P(ResourceConformance, SyncAllocationsAreDistinctAndKeepTheirData)
{
  auto& mr = *this->mr_;
  struct buffer {
    void* p;
    std::size_t bytes;
  };
  std::vector<buffer> buffers;
  std::uint64_t seed = 0;
  for (std::size_t bytes :
       {std::size_t{1}, std::size_t{8}, std::size_t{100}, 4 * KiB, MiB, 16 * MiB}) {
    void* p = mr.allocate_sync(bytes, 256);
    ASSERT_NE(p, nullptr) << bytes << " bytes";
    EXPECT_TRUE(is_aligned(p, 256)) << p;
    write_pattern<TypeParam>(p, bytes, seed++, this->stream_.get());
    buffers.push_back({p, bytes});
  }
  EXPECT_GT(this->held().in_use_bytes, 0u) << "the daemon lends nothing";
  seed = 0;
  for (auto [p, bytes] : buffers) {
    EXPECT_EQ(first_difference<TypeParam>(p, bytes, seed++, this->stream_.get()), -1)
        << bytes << "-byte buffer at " << p << " was overwritten";
  }
  for (auto [p, bytes] : buffers) { mr.deallocate_sync(p, bytes, 256); }
}

TYPED_TEST_P(ResourceConformance, EveryAlignmentUpToThePoolsLargestIsHonoured)
{
  auto& mr = *this->mr_;
  ASSERT_GE(this->max_alignment_, 256u) << "the pool accepts less than RMM's 256-byte alignment";
  std::uint64_t seed = 0;
  for (std::size_t alignment : this->alignments()) {
    for (std::size_t bytes : {std::size_t{24}, std::size_t{1000}}) {
      void* a = mr.allocate(this->stream_.ref(), bytes, alignment);
      void* b = mr.allocate_sync(bytes, alignment);
      EXPECT_TRUE(is_aligned(a, alignment)) << a << " for alignment " << alignment;
      EXPECT_TRUE(is_aligned(b, alignment)) << b << " for alignment " << alignment;
      write_pattern<TypeParam>(a, bytes, ++seed, this->stream_.get());
      write_pattern<TypeParam>(b, bytes, seed + 1000, this->stream_.get());
      EXPECT_EQ(first_difference<TypeParam>(a, bytes, seed, this->stream_.get()), -1);
      mr.deallocate(this->stream_.ref(), a, bytes, alignment);
      mr.deallocate_sync(b, bytes, alignment);
    }
  }
}

// --- streams -----------------------------------------------------------------

TYPED_TEST_P(ResourceConformance, MemoryAllocatedOnOneStreamIsFreedOnAnother)
{
  auto& mr = *this->mr_;
  test_stream first(cudaStreamLegacy);
  test_stream second(cudaStreamPerThread);
  for (std::uint64_t round = 0; round < 4; ++round) {
    void* p = mr.allocate(first.ref(), MiB, 256);
    write_pattern<TypeParam>(p, MiB, round, first.get());
    EXPECT_EQ(first_difference<TypeParam>(p, MiB, round, first.get()), -1);
    first.before(second);  // the caller orders the free after the use (RMM's rule)
    mr.deallocate(second.ref(), p, MiB, 256);
    // The memory freed on `second` serves the next request on it.
    void* q = mr.allocate(second.ref(), MiB, 256);
    write_pattern<TypeParam>(q, MiB, round + 100, second.get());
    EXPECT_EQ(first_difference<TypeParam>(q, MiB, round + 100, second.get()), -1);
    second.before(first);
    mr.deallocate(first.ref(), q, MiB, 256);
  }
  // Mixed with the synchronous forms.
  void* p = mr.allocate(first.ref(), 64 * KiB, 256);
  write_pattern<TypeParam>(p, 64 * KiB, 7, first.get());
  // deallocate_sync orders nothing: the caller makes sure the use is over.
  if (gpu_count() > 0) { ASSERT_EQ(cudaStreamSynchronize(first.get()), cudaSuccess); }
  mr.deallocate_sync(p, 64 * KiB, 256);
  void* q = mr.allocate_sync(64 * KiB, 256);
  write_pattern<TypeParam>(q, 64 * KiB, 8, second.get());
  mr.deallocate(second.ref(), q, 64 * KiB, 256);
}

/// One thread of the concurrency bodies: `rounds` allocations of random size
/// on `stream`, up to four live at once, each written with its own pattern and
/// checked just before it is freed. `mr` is a copy: copies share the state.
template <typename Kind>
void churn(typename Kind::resource mr, test_stream const& stream, unsigned thread, int rounds)
{
  struct buffer {
    void* p;
    std::size_t bytes;
    std::uint64_t seed;
  };
  try {
    std::mt19937_64 random(thread);
    std::vector<buffer> live;
    auto release = [&](std::size_t i) {
      auto const b = live[i];
      EXPECT_EQ(first_difference<Kind>(b.p, b.bytes, b.seed, stream.get()), -1)
          << "thread " << thread << ": a buffer of " << b.bytes << " bytes was overwritten";
      mr.deallocate(stream.ref(), b.p, b.bytes, 256);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    };
    for (int round = 0; round < rounds; ++round) {
      std::size_t const bytes  = std::size_t{1} << (random() % 18);  // 1 B to 128 KiB
      std::uint64_t const seed = (std::uint64_t{thread} << 32) | static_cast<unsigned>(round);
      void* p                  = mr.allocate(stream.ref(), bytes, 256);
      EXPECT_NE(p, nullptr);
      if (p == nullptr) { return; }
      write_pattern<Kind>(p, bytes, seed, stream.get());
      live.push_back({p, bytes, seed});
      if (live.size() > 4) { release(random() % live.size()); }
    }
    while (!live.empty()) { release(live.size() - 1); }
  } catch (std::exception const& e) {
    ADD_FAILURE() << "thread " << thread << ": " << type_of(e) << ": " << e.what();
  }
}

constexpr unsigned churn_threads = 8;
constexpr int churn_rounds       = 40;

TYPED_TEST_P(ResourceConformance, ManyThreadsAllocateAndFreeOnOneSharedStream)
{
  std::vector<std::jthread> threads;
  for (unsigned t = 0; t < churn_threads; ++t) {
    threads.emplace_back(churn<TypeParam>, *this->mr_, std::cref(this->stream_), t, churn_rounds);
  }
}

TYPED_TEST_P(ResourceConformance, ManyThreadsAllocateAndFreeOnTheirOwnStreams)
{
  std::vector<std::jthread> threads;
  for (unsigned t = 0; t < churn_threads; ++t) {
    threads.emplace_back([mr = *this->mr_, t] {
      test_stream own(cudaStreamPerThread);  // without a GPU: this thread's default stream
      churn<TypeParam>(mr, own, t, churn_rounds);
    });
  }
}

TYPED_TEST_P(ResourceConformance, RandomInterleavingsKeepEveryBuffersData)
{
  auto& mr                     = *this->mr_;
  constexpr std::uint64_t seed = 20261123;
  SCOPED_TRACE("random seed " + std::to_string(seed));
  std::mt19937_64 random(seed);
  struct buffer {
    void* p;
    std::size_t bytes;
    std::size_t alignment;
    std::uint64_t seed;
  };
  std::vector<buffer> live;
  auto const alignments = this->alignments(4096);
  auto check            = [&](buffer const& b) {
    EXPECT_EQ(first_difference<TypeParam>(b.p, b.bytes, b.seed, this->stream_.get()), -1)
        << "the buffer of " << b.bytes << " bytes at " << b.p << " (pattern " << b.seed
        << ") was overwritten";
  };
  auto release = [&](std::size_t i) {
    check(live[i]);
    if (random() % 2 == 0) {
      mr.deallocate(this->stream_.ref(), live[i].p, live[i].bytes, live[i].alignment);
    } else {
      mr.deallocate_sync(live[i].p, live[i].bytes, live[i].alignment);
    }
    live[i] = live.back();
    live.pop_back();
  };
  for (std::uint64_t op = 0; op < 400; ++op) {
    if (live.empty() || (live.size() < 48 && random() % 100 < 55)) {
      auto const scale     = random() % 21;  // sizes from 1 B to 2 MiB, most of them small
      auto const bytes     = std::max<std::size_t>(1, (std::size_t{1} << scale) + random() % 97);
      auto const alignment = alignments[random() % alignments.size()];
      void* p              = random() % 2 == 0 ? mr.allocate(this->stream_.ref(), bytes, alignment)
                                               : mr.allocate_sync(bytes, alignment);
      ASSERT_NE(p, nullptr);
      EXPECT_TRUE(is_aligned(p, alignment)) << p << " for alignment " << alignment;
      write_pattern<TypeParam>(p, bytes, op, this->stream_.get());
      live.push_back({p, bytes, alignment, op});
    } else {
      release(random() % live.size());
    }
    if (op % 100 == 99) {
      for (auto const& b : live) { check(b); }
    }
  }
  while (!live.empty()) { release(live.size() - 1); }
}

// --- RMM's adaptors and containers ---------------------------------------------

TYPED_TEST_P(ResourceConformance, ServesAsTheUpstreamOfRmmsAdaptors)
{
  if constexpr (!TypeParam::device_accessible) {
    GTEST_SKIP() << TypeParam::name
                 << " is host-only; RMM's adaptors take device-accessible upstreams only";
  } else {
    auto& mr    = *this->mr_;
    auto stream = this->stream_.ref();
    {
      rmm::mr::statistics_resource_adaptor stats(mr);
      std::vector<void*> ptrs;
      for (int i = 0; i < 3; ++i) { ptrs.push_back(stats.allocate(stream, 4 * KiB, 256)); }
      EXPECT_EQ(stats.get_allocations_counter().value, 3);
      EXPECT_EQ(stats.get_bytes_counter().value, static_cast<std::int64_t>(12 * KiB));
      EXPECT_THROW((void)stats.allocate(stream, PiB, 256), rmm::out_of_memory);
      for (void* p : ptrs) { stats.deallocate(stream, p, 4 * KiB, 256); }
      EXPECT_EQ(stats.get_bytes_counter().value, 0);
    }
    {
      rmm::mr::limiting_resource_adaptor limited(mr, MiB);
      void* p = limited.allocate(stream, 768 * KiB, 256);
      write_pattern<TypeParam>(p, 768 * KiB, 3, this->stream_.get());
      EXPECT_THROW((void)limited.allocate(stream, 512 * KiB, 256), rmm::out_of_memory);
      EXPECT_EQ(first_difference<TypeParam>(p, 768 * KiB, 3, this->stream_.get()), -1);
      limited.deallocate(stream, p, 768 * KiB, 256);
      EXPECT_EQ(limited.get_allocated_bytes(), 0u);
    }
    {
      rmm::mr::pool_memory_resource pool(mr, 4 * MiB);  // grows past it through `mr`
      std::vector<std::pair<void*, std::size_t>> buffers;
      for (std::uint64_t i = 0; i < 24; ++i) {
        auto const bytes = (i + 1) * 64 * KiB;
        void* p          = pool.allocate(stream, bytes, 256);
        write_pattern<TypeParam>(p, bytes, i, this->stream_.get());
        buffers.emplace_back(p, bytes);
      }
      for (std::uint64_t i = 0; i < buffers.size(); ++i) {
        auto [p, bytes] = buffers[i];
        EXPECT_EQ(first_difference<TypeParam>(p, bytes, i, this->stream_.get()), -1) << i;
        pool.deallocate(stream, p, bytes, 256);
      }
      EXPECT_GT(this->held().in_use_bytes, 0u) << "the pool's blocks come from the daemon";
    }  // the pool gives its blocks back through `mr`
  }
}

TYPED_TEST_P(ResourceConformance, BacksRmmDeviceBuffersAndDeviceUvectors)
{
  if constexpr (!TypeParam::device_accessible) {
    GTEST_SKIP() << TypeParam::name << " is host-only; RMM's containers need device memory";
  } else {
    auto& mr         = *this->mr_;
    auto stream      = this->stream_.ref();
    auto const calls = this->requests("Allocate");
    {
      rmm::device_buffer empty(0, stream, mr);
      EXPECT_EQ(empty.data(), nullptr);
      EXPECT_EQ(this->requests("Allocate"), calls) << "an empty device_buffer made a request";

      auto const data = pattern_bytes(5, MiB + 3);
      rmm::device_buffer buffer(data.data(), data.size(), stream, mr);
      rmm::device_buffer copy(buffer, stream, mr);
      EXPECT_EQ(first_difference<TypeParam>(copy.data(), copy.size(), 5, this->stream_.get()), -1);
      buffer.resize(4 * MiB, stream);
      EXPECT_EQ(first_difference<TypeParam>(buffer.data(), MiB + 3, 5, this->stream_.get()), -1);
      buffer.shrink_to_fit(stream);

      rmm::device_uvector<std::int32_t> v(1 << 16, stream, mr);
      ASSERT_EQ(cudaMemsetAsync(v.data(), 0, v.size() * sizeof(std::int32_t), stream.get()),
                cudaSuccess);
      v.set_element(4242, 17, stream);
      EXPECT_EQ(v.element(4242, stream), 17);
      v.resize(1 << 18, stream);
      EXPECT_EQ(v.element(4242, stream), 17);
      EXPECT_EQ(v.element(0, stream), 0);
      stream.sync();
    }
  }
}

// --- the handle ----------------------------------------------------------------

TYPED_TEST_P(ResourceConformance, CopiesShareStateAndCompareEqual)
{
  using resource = typename TypeParam::resource;
  auto& mr       = *this->mr_;
  resource copy  = mr;
  EXPECT_TRUE(copy == mr);
  EXPECT_FALSE(copy != mr);
  // Memory from one copy goes back through another.
  void* p = copy.allocate(this->stream_.ref(), 4 * KiB, 256);
  write_pattern<TypeParam>(p, 4 * KiB, 9, this->stream_.get());
  mr.deallocate(this->stream_.ref(), p, 4 * KiB, 256);
  // A resource of its own (same session, same pool) is another resource: what
  // one lent, the other cannot take back.
  auto other = TypeParam::make(*this->session_);
  EXPECT_FALSE(other == mr);
  EXPECT_TRUE(other != mr);
  // A copy keeps the state alive after the resource it was copied from is gone.
  auto first    = std::make_unique<resource>(TypeParam::make(*this->session_));
  resource kept = *first;
  void* q       = first->allocate_sync(64 * KiB, 256);
  write_pattern<TypeParam>(q, 64 * KiB, 10, this->stream_.get());
  first.reset();
  EXPECT_EQ(first_difference<TypeParam>(q, 64 * KiB, 10, this->stream_.get()), -1);
  kept.deallocate_sync(q, 64 * KiB, 256);
  // Assignment shares too.
  kept = mr;
  EXPECT_TRUE(kept == mr);
}

// --- process exit ----------------------------------------------------------------

TYPED_TEST_P(ResourceConformance, AtExitAResourceKeptInStaticsPrintsNothingAndExitsCleanly)
{
  // The helper keeps the resource in statics with live allocations (see
  // rmmd_test_client exit-with-static) and returns from main; its stderr goes
  // to a file of ours.
  char path[]      = "/tmp/rmmd-exit-stderr-XXXXXX";
  int const err_fd = ::mkstemp(path);
  ASSERT_GE(err_fd, 0);
  ::unlink(path);
  std::optional<int> status;
  {
    child_process helper(
        {program_path("rmmd_test_client").string(), "exit-with-static", TypeParam::client_mode},
        {"RMMD_RUNTIME_DIR=" + this->daemon_->runtime_dir().string()},
        {.fds = {{2, err_fd}}});
    auto const line = helper.read_line(60s);
    EXPECT_EQ(line, "holding") << "the helper did not get its memory";
    if (line == "holding") {
      EXPECT_GT(this->held().allocations, 0u) << "the helper holds nothing at exit";
    }
    helper.close_stdin();  // it returns from main now
    status = helper.wait(60s);
  }
  std::string printed;
  char chunk[4096];
  ssize_t n = 0;
  while ((n = ::pread(err_fd, chunk, sizeof(chunk), static_cast<off_t>(printed.size()))) > 0) {
    printed.append(chunk, static_cast<std::size_t>(n));
  }
  ::close(err_fd);
  EXPECT_EQ(status, 0) << "the helper did not exit cleanly";
  EXPECT_EQ(printed, "") << "the helper printed on stderr while it exited";
  // The daemon reclaims what the session held when the process is gone.
}

REGISTER_TYPED_TEST_SUITE_P(ResourceConformance,
                            AllocatingZeroBytesReturnsNullWithoutARequest,
                            DeallocatingNullDoesNothing,
                            ARequestNoPoolCanHoldIsOutOfMemory,
                            SyncAllocationsAreDistinctAndKeepTheirData,
                            EveryAlignmentUpToThePoolsLargestIsHonoured,
                            MemoryAllocatedOnOneStreamIsFreedOnAnother,
                            ManyThreadsAllocateAndFreeOnOneSharedStream,
                            ManyThreadsAllocateAndFreeOnTheirOwnStreams,
                            RandomInterleavingsKeepEveryBuffersData,
                            ServesAsTheUpstreamOfRmmsAdaptors,
                            BacksRmmDeviceBuffersAndDeviceUvectors,
                            CopiesShareStateAndCompareEqual,
                            AtExitAResourceKeptInStaticsPrintsNothingAndExitsCleanly);

}  // namespace rmmd::test
