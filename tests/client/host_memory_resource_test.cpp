// rmmd::host_memory_resource against a real daemon: the CCCL concepts, use
// through any_resource, data seen by another session, errors.

#include "tests/tools/daemon_process.hpp"

#include "client/detail/process_exit.hpp"

#include <rmmd/host_memory_resource.hpp>
#include <rmmd/pinned_host_memory_resource.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <cuda/memory_resource>

#include <cstring>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

static_assert(
    cuda::mr::synchronous_resource_with<rmmd::host_memory_resource, cuda::mr::host_accessible>);
static_assert(cuda::mr::resource_with<rmmd::host_memory_resource, cuda::mr::host_accessible>);
static_assert(!cuda::mr::resource_with<rmmd::host_memory_resource, cuda::mr::device_accessible>);
static_assert(std::is_copy_constructible_v<rmmd::host_memory_resource>);

class HostMemoryResource : public ::testing::Test {
 protected:
  daemon_process daemon_;
  rmmd::host_memory_resource mr_{daemon_.open_session("resource-test")};
};

TEST_F(HostMemoryResource, AllocatesAlignedWritableMemoryAndFreesIt)
{
  std::vector<void*> ptrs;
  for (std::size_t alignment : {8, 64, 256, 4096, 1 << 16, 1 << 21}) {
    void* p = mr_.allocate_sync(1000, alignment);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignment, 0u) << alignment;
    std::memset(p, 0x5a, 1000);
    ptrs.push_back(p);
  }
  EXPECT_EQ(daemon_.stats().pools(0).allocation_count(), ptrs.size());
  for (void* p : ptrs) { mr_.deallocate_sync(p, 1000, 8); }
  EXPECT_EQ(in_use(daemon_.stats()), 0u);
}

// The library's exit handler (client/detail/process_exit.hpp) is an atexit
// entry: making resources must not add one each.
TEST_F(HostMemoryResource, MakingManyResourcesRegistersNoMoreExitHandlers)
{
  // mr_ has registered it, if nothing in this process had before.
  auto const before = rmmd::detail::process_exit_registrations();
  EXPECT_GE(before, 1u);
  EXPECT_LE(before, 2u);
  rmmd::session const s = daemon_.open_session("many-resources");
  std::vector<rmmd::host_memory_resource> resources;
  resources.reserve(10000);
  for (int i = 0; i < 10000; ++i) { resources.emplace_back(i % 2 == 0 ? s : mr_.get_session()); }
  void* p = resources.back().allocate_sync(4096, 64);
  std::memset(p, 0x5a, 4096);
  resources.back().deallocate_sync(p, 4096, 64);
  EXPECT_EQ(rmmd::detail::process_exit_registrations(), before);
}

TEST_F(HostMemoryResource, CopiesShareStateAndCompareEqual)
{
  rmmd::host_memory_resource copy = mr_;
  EXPECT_EQ(copy, mr_);
  void* p = copy.allocate_sync(256, 256);
  mr_.deallocate_sync(p, 256, 256);  // freed through the other handle
  EXPECT_EQ(in_use(daemon_.stats()), 0u);
  rmmd::host_memory_resource other(daemon_.open_session("other"));
  EXPECT_NE(other, mr_);
}

TEST_F(HostMemoryResource, WorksThroughAnyResourceAndStreamOrderedCalls)
{
  cuda::mr::any_resource<cuda::mr::host_accessible> any{mr_};
  void* p = any.allocate(cuda::stream_ref{cudaStream_t{}}, 4096, 256);
  std::memset(p, 1, 4096);
  EXPECT_EQ(in_use(daemon_.stats()), 4096u);
  any.deallocate(cuda::stream_ref{cudaStream_t{}}, p, 4096, 256);
  EXPECT_EQ(in_use(daemon_.stats()), 0u);

  cuda::mr::synchronous_resource_ref<cuda::mr::host_accessible> ref{mr_};
  void* q = ref.allocate_sync(64, 64);
  ref.deallocate_sync(q, 64, 64);
  EXPECT_EQ(in_use(daemon_.stats()), 0u);
}

TEST_F(HostMemoryResource, AnotherSessionSeesTheDataAtTheSameOffset)
{
  auto* p = static_cast<unsigned char*>(mr_.allocate_sync(1 << 16, 256));
  for (std::size_t i = 0; i < (1 << 16); ++i) { p[i] = static_cast<unsigned char>(i * 13); }
  auto reader = daemon_.open_session("reader");
  auto* base  = reader.host_pool_base(reader.host_pool().id);
  EXPECT_NE(static_cast<void*>(base + mr_.offset_of(p)), static_cast<void*>(p));  // own mapping
  EXPECT_EQ(std::memcmp(base + mr_.offset_of(p), p, 1 << 16), 0);
  mr_.deallocate_sync(p, 1 << 16, 256);
}

TEST_F(HostMemoryResource, ErrorsAreTyped)
{
  // Zero bytes and requests larger than the pool: resource_conformance.hpp.
  EXPECT_THROW((void)mr_.allocate_sync(1000, 3), rmmd::logic_error);
  EXPECT_THROW((void)mr_.allocate_sync(1000, std::size_t{1} << 22), rmmd::logic_error);
  EXPECT_THROW(rmmd::host_memory_resource(mr_.get_session(), "no-such-pool"), rmmd::logic_error);
  int not_ours = 0;
  mr_.deallocate_sync(&not_ours, 4, 4);  // ignored, and says so on stderr
  EXPECT_EQ(in_use(daemon_.stats()), 0u);
}

TEST(PinnedHostMemoryResource, MeetsTheConceptsOfAHostAndDeviceAccessibleResource)
{
  static_assert(cuda::mr::resource_with<rmmd::pinned_host_memory_resource,
                                        cuda::mr::host_accessible,
                                        cuda::mr::device_accessible>);
  static_assert(std::is_constructible_v<
                cuda::mr::any_resource<cuda::mr::host_accessible, cuda::mr::device_accessible>,
                rmmd::pinned_host_memory_resource>);
  SUCCEED();
}

TEST(PinnedHostMemoryResource, APoolThatPunchesHolesIsRefusedSayingHowToFixIt)
{
  daemon_process daemon({"--host-pool-pinned", "off"});
  auto s = daemon.open_session("pinned");
  EXPECT_FALSE(s.host_pool().pinnable);
  try {
    rmmd::pinned_host_memory_resource mr(s);
    FAIL() << "a pool that punches holes was pinned";
  } catch (rmmd::logic_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("--host-pool-pinned=on"));
  }
  EXPECT_EQ(in_use(daemon.stats()), 0u);
}

TEST(PinnedHostMemoryResource, WithoutAGpuPageLockingFailsAsBadAlloc)
{
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0) {
    GTEST_SKIP() << "a GPU is present (the gpu tests cover pinning)";
  }
  daemon_process daemon({"--host-pool-pinned", "on", "--host-pool-bytes", "16MiB"});
  auto s = daemon.open_session("pinned");
  EXPECT_TRUE(s.host_pool().pinnable);
  try {
    rmmd::pinned_host_memory_resource mr(s);
    FAIL() << "page-locked without a GPU";
  } catch (rmm::bad_alloc const& e) {
    EXPECT_THAT(e.what(), HasSubstr("cudaHostRegister"));
  }
}

TEST_F(HostMemoryResource, DestroyingTheLastHandleFreesWhatIsLeft)
{
  {
    rmmd::host_memory_resource scoped(daemon_.open_session("scoped"));
    (void)scoped.allocate_sync(4096, 256);
    EXPECT_EQ(in_use(daemon_.stats()), 4096u);
  }
  EXPECT_TRUE(eventually([&] { return in_use(daemon_.stats()) == 0; }));
}

}  // namespace
}  // namespace rmmd::test
