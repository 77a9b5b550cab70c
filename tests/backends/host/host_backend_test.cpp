#include "daemon/backends/host/host_backend.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rmmd::backends::host {
namespace {

constexpr std::size_t pool_bytes = 8 << 20;

struct mapping {
  explicit mapping(int fd)
      : base(static_cast<unsigned char*>(
            ::mmap(nullptr, pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)))
  {
  }
  ~mapping()
  {
    ::munmap(base, pool_bytes);
  }
  unsigned char* base;
};

TEST(HostBackend, IsASealedMemfd)
{
  host_backend b("t", pool_bytes);
  int seals = ::fcntl(b.shareable_fd(), F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  EXPECT_NE(::ftruncate(b.shareable_fd(), 4096), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(b.capacity(), pool_bytes);
  EXPECT_EQ(b.kind(), core::backend_kind::host);
}

TEST(HostBackend, TwoMappingsSeeTheSameBytes)
{
  host_backend b("t", pool_bytes);
  auto block = b.allocate(1 << 16, 4096);
  ASSERT_TRUE(block.ok());
  mapping writer(b.shareable_fd()), reader(b.shareable_fd());
  std::memset(writer.base + block->offset, 0xab, 1 << 16);
  EXPECT_EQ(reader.base[block->offset], 0xab);
  EXPECT_EQ(reader.base[block->offset + (1 << 16) - 1], 0xab);
  b.deallocate(*block);
}

TEST(HostBackend, FreedWholePagesReadZerosAfterwards)
{
  host_backend b("t", pool_bytes);
  mapping m(b.shareable_fd());
  auto first = b.allocate(1 << 20, 4096);
  ASSERT_TRUE(first.ok());
  std::memset(m.base + first->offset, 0x5a, 1 << 20);
  b.deallocate(*first);
  auto second = b.allocate(1 << 20, 4096);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->offset, first->offset);
  for (std::size_t i = 0; i < (1 << 20); i += 4096) {
    ASSERT_EQ(m.base[second->offset + i], 0) << i;
  }
}

TEST(HostBackend, FullPoolIsResourceExhausted)
{
  host_backend b("t", pool_bytes);
  auto all = b.allocate(pool_bytes, 256);
  ASSERT_TRUE(all.ok());
  auto more = b.allocate(256, 256);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(more.status().message().find("256 bytes"), std::string_view::npos);
}

}  // namespace
}  // namespace rmmd::backends::host
