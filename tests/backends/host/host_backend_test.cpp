#include "daemon/backends/host/host_backend.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <system_error>
#include <vector>

namespace rmmd::backends::host {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr std::size_t KiB       = 1024;
constexpr std::size_t MiB       = 1024 * KiB;
constexpr std::size_t pool_size = 8 * MiB;

std::size_t page_size()
{
  return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

/// A client's view of the pool: the whole fd mapped shared.
class mapping {
 public:
  explicit mapping(int fd, std::size_t bytes = pool_size)
      : bytes_(bytes),
        base_(static_cast<unsigned char*>(
            ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)))
  {
    if (base_ == MAP_FAILED) { throw std::system_error(errno, std::generic_category(), "mmap"); }
  }
  mapping(mapping const&)            = delete;
  mapping& operator=(mapping const&) = delete;
  ~mapping()
  {
    ::munmap(base_, bytes_);
  }

  unsigned char* at(std::uint64_t offset) const
  {
    return base_ + offset;
  }

  [[nodiscard]] bool all_equal(std::uint64_t offset, std::size_t bytes, unsigned char v) const
  {
    return std::all_of(at(offset), at(offset) + bytes, [v](unsigned char c) { return c == v; });
  }

 private:
  std::size_t bytes_;
  unsigned char* base_;
};

std::uint64_t allocated_bytes(int fd)
{
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return static_cast<std::uint64_t>(st.st_blocks) * 512;
}

/// Whether shmem may back the memfd with huge pages, which a partial punch
/// zeroes rather than frees.
bool shmem_uses_huge_pages()
{
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return !all.empty() && all.find("[never]") == std::string::npos &&
         all.find("[deny]") == std::string::npos;
}

TEST(HostBackend, IsASealedMemfdOfTheCapacity)
{
  host_backend b("sealed", pool_size);
  int const fd = b.shareable_fd();
  ASSERT_GE(fd, 0);
  EXPECT_EQ(b.traits().space, core::memory_space::host);
  EXPECT_EQ(b.traits().name, "host");
  EXPECT_EQ(b.capacity(), pool_size);

  std::string link(256, '\0');
  auto n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link.data(), link.size());
  ASSERT_GT(n, 0);
  link.resize(static_cast<std::size_t>(n));
  EXPECT_THAT(link, StartsWith("/memfd:rmmd:sealed"));

  int const seals = ::fcntl(fd, F_GET_SEALS);
  ASSERT_GE(seals, 0) << std::strerror(errno);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  EXPECT_FALSE(seals & F_SEAL_WRITE);  // clients must be able to write through their mapping
  EXPECT_TRUE(::fcntl(fd, F_GETFD) & FD_CLOEXEC);

  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(static_cast<std::size_t>(st.st_size), pool_size);
}

TEST(HostBackend, NobodyCanShrinkItOrChangeTheSeals)
{
  host_backend b("sealed", pool_size);
  errno = 0;
  EXPECT_NE(::ftruncate(b.shareable_fd(), 4096), 0);
  EXPECT_EQ(errno, EPERM);
  errno = 0;
  EXPECT_NE(::fcntl(b.shareable_fd(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  EXPECT_EQ(errno, EPERM);
}

TEST(HostBackend, ClosesItsFdWhenDestroyed)
{
  int fd = -1;
  {
    host_backend b("closing", 64 * KiB);
    fd = b.shareable_fd();
    ASSERT_GE(::fcntl(fd, F_GETFD), 0);
  }
  errno = 0;
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
}

TEST(HostBackend, ATooSmallCapacityThrowsNamingThePool)
{
  try {
    host_backend b("tiny", 100);
    FAIL() << "a 100-byte pool was created";
  } catch (std::system_error const& e) {
    EXPECT_EQ(e.code(), std::errc::invalid_argument);
    EXPECT_THAT(e.what(), HasSubstr("'tiny'"));
    EXPECT_THAT(e.what(), HasSubstr("100 bytes"));
  }
}

TEST(HostBackend, ALongNameIsShortenedNotRefused)
{
  host_backend b(std::string(400, 'n'), 64 * KiB);
  EXPECT_GE(b.shareable_fd(), 0);
}

TEST(HostBackend, AllocationsAreAlignedAndRounded)
{
  host_backend b("aligned", pool_size);
  auto first = b.allocate(1, 1);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->bytes, 256u);
  for (std::size_t alignment = 1; alignment <= 2 * MiB; alignment <<= 1) {
    auto block = b.allocate(1000, alignment);
    ASSERT_TRUE(block.ok()) << alignment << ": " << block.status();
    EXPECT_EQ(block->offset % alignment, 0u) << alignment;
    EXPECT_EQ(block->bytes, 1024u);
    EXPECT_LE(block->offset + block->bytes, pool_size);
  }
}

TEST(HostBackend, TwoMappingsShareTheBytesAtTheAllocationsOffset)
{
  host_backend b("shared", pool_size);
  ASSERT_TRUE(b.allocate(3000, 1).ok());  // so that the next block is not at offset 0
  auto block = b.allocate(64 * KiB, 4096);
  ASSERT_TRUE(block.ok());
  ASSERT_NE(block->offset, 0u);
  mapping writer(b.shareable_fd()), reader(b.shareable_fd());
  for (std::size_t i = 0; i < block->bytes; ++i) {
    *writer.at(block->offset + i) = static_cast<unsigned char>(i * 7 + 1);
  }
  for (std::size_t i = 0; i < block->bytes; ++i) {
    ASSERT_EQ(*reader.at(block->offset + i), static_cast<unsigned char>(i * 7 + 1)) << i;
  }
  b.deallocate(*block);
}

TEST(HostBackend, AFreedAndReallocatedPageReadsZeros)
{
  host_backend b("zeros", pool_size);
  mapping m(b.shareable_fd());
  auto first = b.allocate(MiB, 4096);
  ASSERT_TRUE(first.ok());
  std::memset(m.at(first->offset), 0x5a, MiB);
  b.deallocate(*first);
  auto second = b.allocate(MiB, 4096);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->offset, first->offset);
  EXPECT_TRUE(m.all_equal(second->offset, MiB, 0));
}

TEST(HostBackend, APinnablePoolNeverDropsOrRewritesAFreedPage)
{
  // A client's pinned mapping keeps the pages it had: the pool must keep them
  // too, or the process and the GPU would silently stop sharing them.
  host_backend b("pinnable", pool_size, true);
  mapping m(b.shareable_fd());
  auto first = b.allocate(MiB, 4096);
  ASSERT_TRUE(first.ok());
  std::memset(m.at(first->offset), 0x5a, MiB);
  b.deallocate(*first);
  EXPECT_TRUE(m.all_equal(first->offset, MiB, 0x5a));  // not punched, not zeroed
  auto second = b.allocate(MiB, 4096);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->offset, first->offset);
  EXPECT_TRUE(m.all_equal(second->offset, MiB, 0x5a));
}

TEST(HostBackend, AFreedPartOfASharedPageReadsZerosAndItsNeighboursKeepTheirBytes)
{
  host_backend b("partial", pool_size);
  mapping m(b.shareable_fd());
  // Sixteen 256-byte blocks in the first page (and a bit more), all dirty.
  std::vector<core::backend_allocation> blocks;
  for (int i = 0; i < 20; ++i) {
    auto block = b.allocate(256, 256);
    ASSERT_TRUE(block.ok());
    std::memset(m.at(block->offset), 0xff, block->bytes);
    blocks.push_back(*block);
  }
  b.deallocate(blocks[5]);
  auto again = b.allocate(200, 256);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->offset, blocks[5].offset);  // first fit hands back the same bytes
  EXPECT_TRUE(m.all_equal(again->offset, again->bytes, 0));
  EXPECT_TRUE(m.all_equal(blocks[4].offset, 256, 0xff));
  EXPECT_TRUE(m.all_equal(blocks[6].offset, 256, 0xff));

  // A block that straddles a page boundary: its whole page-sized middle is
  // punched, and its ends on the shared pages are zeroed.
  auto big = b.allocate(3 * page_size(), 256);
  ASSERT_TRUE(big.ok());
  ASSERT_NE(big->offset % page_size(), 0u);
  auto after = b.allocate(256, 256);
  ASSERT_TRUE(after.ok());
  std::memset(m.at(big->offset), 0xee, big->bytes);
  std::memset(m.at(after->offset), 0xdd, after->bytes);
  b.deallocate(*big);
  auto big_again = b.allocate(3 * page_size(), 256);
  ASSERT_TRUE(big_again.ok());
  ASSERT_EQ(big_again->offset, big->offset);
  EXPECT_TRUE(m.all_equal(big_again->offset, big_again->bytes, 0));
  EXPECT_TRUE(m.all_equal(blocks.back().offset, 256, 0xff));
  EXPECT_TRUE(m.all_equal(after->offset, after->bytes, 0xdd));
}

TEST(HostBackend, AnIdlePoolHoldsNoMemoryAndReadsZeros)
{
  if (shmem_uses_huge_pages()) {
    GTEST_SKIP() << "shmem uses transparent huge pages here, and a partial punch of a huge page "
                    "zeroes it rather than freeing it";
  }
  host_backend b("idle", pool_size);
  mapping m(b.shareable_fd());
  // Odd sizes, so that most pages are shared by two blocks.
  std::vector<core::backend_allocation> blocks;
  std::mt19937 rng(3);
  while (true) {
    auto block = b.allocate(1 + rng() % (20 * KiB), 256);
    if (!block.ok()) { break; }
    std::memset(m.at(block->offset), 0x77, block->bytes);
    blocks.push_back(*block);
  }
  ASSERT_GT(blocks.size(), 100u);
  EXPECT_GE(allocated_bytes(b.shareable_fd()), pool_size - 20 * KiB);

  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (auto const& block : blocks) { b.deallocate(block); }
  EXPECT_EQ(allocated_bytes(b.shareable_fd()), 0u);

  auto all = b.allocate(pool_size, 1);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(m.all_equal(0, pool_size, 0));
}

TEST(HostBackend, ManyBlocksFreedAtOnceReadZerosAndSpareTheirNeighbours)
{
  // A closing session's leases: every other block of a run (so the batch has
  // many runs, some sharing pages with live neighbours), then a whole run.
  host_backend b("batch", pool_size);
  mapping m(b.shareable_fd());
  std::vector<core::backend_allocation> blocks;
  std::mt19937 rng(5);
  for (int i = 0; i < 2000; ++i) {
    auto block = b.allocate(1 + rng() % (3 * KiB), 256);
    ASSERT_TRUE(block.ok());
    std::memset(m.at(block->offset), 0x6b, block->bytes);
    blocks.push_back(*block);
  }
  std::vector<core::backend_allocation> freed, kept;
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    ((i % 2 == 0 || (i > 1000 && i < 1500)) ? freed : kept).push_back(blocks[i]);
  }
  std::shuffle(freed.begin(), freed.end(), rng);  // in no particular order
  b.deallocate_many(freed);
  for (auto const& block : kept) {
    EXPECT_TRUE(m.all_equal(block.offset, block.bytes, 0x6b)) << block.offset;
  }
  for (auto const& block : freed) {
    EXPECT_TRUE(m.all_equal(block.offset, block.bytes, 0)) << block.offset;
  }
  // Every freed byte is free again: the pool takes them back in one piece
  // once the rest goes too.
  b.deallocate_many(kept);
  auto all = b.allocate(pool_size, 1);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_TRUE(m.all_equal(0, pool_size, 0));
  b.deallocate_many({});  // nothing to do
}

TEST(HostBackend, ManyBlocksFreedAtOnceGiveTheirPagesBack)
{
  if (shmem_uses_huge_pages()) {
    GTEST_SKIP() << "shmem uses transparent huge pages here, and a partial punch of a huge page "
                    "zeroes it rather than freeing it";
  }
  host_backend b("batch-pages", pool_size);
  mapping m(b.shareable_fd());
  std::vector<core::backend_allocation> blocks;
  for (int i = 0; i < 10000; ++i) {
    auto block = b.allocate(256, 256);
    ASSERT_TRUE(block.ok());
    std::memset(m.at(block->offset), 0x11, block->bytes);
    blocks.push_back(*block);
  }
  EXPECT_GE(allocated_bytes(b.shareable_fd()), 10000 * 256u);
  b.deallocate_many(blocks);
  EXPECT_EQ(allocated_bytes(b.shareable_fd()), 0u);
}

TEST(HostBackend, APinnablePoolFreesManyBlocksWithoutTouchingThem)
{
  host_backend b("batch-pinnable", pool_size, true);
  mapping m(b.shareable_fd());
  std::vector<core::backend_allocation> blocks;
  for (int i = 0; i < 100; ++i) {
    auto block = b.allocate(1000, 256);
    ASSERT_TRUE(block.ok());
    std::memset(m.at(block->offset), 0x5a, block->bytes);
    blocks.push_back(*block);
  }
  b.deallocate_many(blocks);
  for (auto const& block : blocks) { EXPECT_TRUE(m.all_equal(block.offset, block.bytes, 0x5a)); }
  EXPECT_TRUE(b.allocate(pool_size, 1).ok());
}

TEST(HostBackend, AfterStopLendingFreedBlocksKeepTheirBytes)
{
  // The daemon is stopping: the sessions it closes belong to clients that
  // reconnect to the next daemon with this memory still mapped.
  host_backend b("stopping", pool_size);
  mapping m(b.shareable_fd());
  auto one   = b.allocate(MiB, 4096);
  auto small = b.allocate(1000, 256);  // shares its page with nothing lent: punched if cleared
  std::vector<core::backend_allocation> many;
  for (int i = 0; i < 10; ++i) {
    auto block = b.allocate(3000, 256);
    ASSERT_TRUE(block.ok());
    many.push_back(*block);
  }
  ASSERT_TRUE(one.ok() && small.ok());
  std::memset(m.at(0), 0x5a, 2 * MiB);
  b.stop_lending();
  b.deallocate(*one);
  b.deallocate(*small);
  b.deallocate_many(many);
  EXPECT_TRUE(m.all_equal(one->offset, MiB, 0x5a));
  EXPECT_TRUE(m.all_equal(small->offset, small->bytes, 0x5a));
  for (auto const& block : many) { EXPECT_TRUE(m.all_equal(block.offset, block.bytes, 0x5a)); }
}

TEST(HostBackend, AFullPoolIsResourceExhausted)
{
  host_backend b("full", pool_size);
  auto all = b.allocate(pool_size, 256);
  ASSERT_TRUE(all.ok());
  auto more = b.allocate(300, 256);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(more.status().message(), HasSubstr("300 bytes"));
  EXPECT_THAT(more.status().message(), HasSubstr("0 of 8388608 bytes are free"));
  EXPECT_THAT(more.status().message(), HasSubstr("full or too fragmented"));
  b.deallocate(*all);
  EXPECT_TRUE(b.allocate(pool_size, 256).ok());
}

TEST(HostBackend, AFragmentedPoolIsResourceExhaustedWithTheFreeBytes)
{
  host_backend b("fragmented", 4096);
  std::vector<core::backend_allocation> blocks;
  for (int i = 0; i < 16; ++i) { blocks.push_back(*b.allocate(256, 256)); }
  for (int i = 0; i < 16; i += 2) { b.deallocate(blocks[static_cast<std::size_t>(i)]); }
  auto st = b.allocate(512, 256).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("512 bytes"));
  EXPECT_THAT(st.message(), HasSubstr("2048 of 4096 bytes are free"));
}

}  // namespace
}  // namespace rmmd::backends::host
