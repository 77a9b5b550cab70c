// spare_memory's choice of spares, its uid rule and its expiry, with memfds
// standing in for the driver's allocations (no handle: nothing reaches the
// driver). Runs without a GPU.

#include "daemon/backends/cuda/spare_memory.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

namespace rmmd::backends::cuda {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t MiB = std::size_t{1} << 20;

core::shared_allocation piece(std::size_t bytes)
{
  return core::shared_allocation{.block = {.bytes = bytes},
                                 .fd    = ::memfd_create("spare-test", MFD_CLOEXEC)};
}

bool open_fd(int fd)
{
  return ::fcntl(fd, F_GETFD) != -1;
}

std::vector<std::size_t> sizes(std::vector<core::shared_allocation> const& pieces)
{
  std::vector<std::size_t> out;
  for (auto const& p : pieces) { out.push_back(p.block.bytes); }
  return out;
}

TEST(SpareMemory, KeepsNothingWhenAskedToKeepForNoTime)
{
  EXPECT_EQ(spare_memory::of_device(0, 0ms), nullptr);
}

TEST(SpareMemory, OneDeviceSharesOneWhileItLives)
{
  auto a = spare_memory::of_device(7, 60s);
  auto b = spare_memory::of_device(7, 60s);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, spare_memory::of_device(8, 60s));
}

TEST(SpareMemory, AnExactSizeIsTakenWholeBeforePieces)
{
  spare_memory spares(0, 60s);
  spares.keep(piece(2 * MiB), 1000);
  spares.keep(piece(4 * MiB), 1000);
  spares.keep(piece(2 * MiB), 1000);
  EXPECT_EQ(spares.bytes(), 8 * MiB);
  auto got = spares.take(4 * MiB, 1000, 64);
  EXPECT_EQ(sizes(got), std::vector<std::size_t>{4 * MiB});
  EXPECT_EQ(spares.bytes(), 4 * MiB);
  for (auto const& p : got) { ::close(p.fd); }
}

TEST(SpareMemory, ALargerAllocationIsServedInPiecesLargestFirst)
{
  spare_memory spares(0, 60s);
  for (auto bytes : {2 * MiB, 8 * MiB, 4 * MiB, 16 * MiB}) { spares.keep(piece(bytes), 1000); }
  auto got = spares.take(14 * MiB, 1000, 64);  // 16 does not fit: 8, 4, 2
  EXPECT_EQ(sizes(got), (std::vector<std::size_t>{8 * MiB, 4 * MiB, 2 * MiB}));
  EXPECT_EQ(spares.bytes(), 16 * MiB);
  for (auto const& p : got) { ::close(p.fd); }
}

TEST(SpareMemory, OneAllocationAtATimeGetsOnePieceAndPiecesLeaveRoomForANewOne)
{
  spare_memory spares(0, 60s);
  for (int i = 0; i < 3; ++i) { spares.keep(piece(2 * MiB), 1000); }
  // One piece allowed, none of the exact size: nothing.
  EXPECT_TRUE(spares.take(6 * MiB, 1000, 1).empty());
  // Two: one spare and room for the new piece of the rest.
  auto two = spares.take(6 * MiB, 1000, 2);
  EXPECT_EQ(sizes(two), std::vector<std::size_t>{2 * MiB});
  // Two spares fill 4 MiB exactly: both, no room needed.
  auto exact = spares.take(4 * MiB, 1000, 2);
  EXPECT_EQ(sizes(exact), (std::vector<std::size_t>{2 * MiB, 2 * MiB}));
  EXPECT_EQ(spares.bytes(), 0u);
  for (auto const& p : two) { ::close(p.fd); }
  for (auto const& p : exact) { ::close(p.fd); }
}

TEST(SpareMemory, AnotherUidGetsNone)
{
  spare_memory spares(0, 60s);
  spares.keep(piece(2 * MiB), 1000);
  EXPECT_TRUE(spares.take(2 * MiB, 1001, 64).empty());
  EXPECT_TRUE(spares.take(4 * MiB, 1001, 64).empty());
  EXPECT_EQ(spares.bytes(), 2 * MiB);
}

TEST(SpareMemory, GivingBackClosesEveryFdAndCountsTheBytes)
{
  spare_memory spares(0, 60s);
  auto a = piece(2 * MiB), b = piece(4 * MiB);
  int const fds[] = {a.fd, b.fd};
  spares.keep(std::move(a), 1000);
  spares.keep(std::move(b), 1001);
  EXPECT_EQ(spares.released(), 0u);
  EXPECT_EQ(spares.give_back(), 6 * MiB);
  EXPECT_EQ(spares.bytes(), 0u);
  EXPECT_EQ(spares.released(), 6 * MiB);
  for (int fd : fds) { EXPECT_FALSE(open_fd(fd)) << fd; }
}

TEST(SpareMemory, ASpareNotTakenGoesBackAfterItsTime)
{
  spare_memory spares(0, 100ms);
  auto a       = piece(2 * MiB);
  int const fd = a.fd;
  spares.keep(std::move(a), 1000);
  auto const until = std::chrono::steady_clock::now() + 10s;
  // What expiry gave back counts (last of all): an allocation that failed
  // meanwhile retries on it.
  while (spares.released() != 2 * MiB && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(spares.released(), 2 * MiB);
  EXPECT_EQ(spares.bytes(), 0u);
  EXPECT_FALSE(open_fd(fd));
}

TEST(SpareMemory, TheDestructorGivesEverySpareBack)
{
  auto a       = piece(2 * MiB);
  int const fd = a.fd;
  {
    spare_memory spares(0, 60s);
    spares.keep(std::move(a), 1000);
  }
  EXPECT_FALSE(open_fd(fd));
}

}  // namespace
}  // namespace rmmd::backends::cuda
