#include "daemon/restart/fd_store.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>

namespace rmmd::restart {
namespace {

using ::testing::HasSubstr;

TEST(BufferFdName, CarriesTheIdAndTheBufferNameWithinSystemdsRules)
{
  EXPECT_EQ(buffer_fd_name(7, "team/model/layer0"), "rmmd-buffer-7.team/model/layer0");
  EXPECT_EQ(buffer_fd_id("rmmd-buffer-7.team/model/layer0"), 7u);
  auto const long_name = buffer_fd_name(18446744073709551615ull, std::string(300, 'x'));
  EXPECT_EQ(long_name.size(), max_fd_name_bytes);
  EXPECT_TRUE(is_valid_fd_name(long_name));
  EXPECT_EQ(buffer_fd_id(long_name), 18446744073709551615ull);
  EXPECT_EQ(buffer_fd_name(1, "a:b\n"), "rmmd-buffer-1.a_b_");
  EXPECT_TRUE(is_valid_fd_name(buffer_fd_name(1, "a:b\n")));
}

TEST(BufferFdName, OtherNamesAreNotBuffers)
{
  for (char const* name : {"stored",
                           "unknown",
                           "rmmd.socket",
                           "rmmd-buffer-",
                           "rmmd-buffer-x",
                           "rmmd-buffer-12x",
                           "rmmd-buffer-99999999999999999999.a"}) {
    EXPECT_FALSE(buffer_fd_id(name).has_value()) << name;
  }
  EXPECT_EQ(buffer_fd_id("rmmd-buffer-12"), 12u);
}

TEST(BackupFdName, HasItsOwnPrefixAndBothAreStoredFds)
{
  EXPECT_EQ(backup_fd_name(9, "engine-0"), "rmmd-backup-9.engine-0");
  EXPECT_EQ(backup_fd_id("rmmd-backup-9.engine-0"), 9u);
  EXPECT_FALSE(buffer_fd_id("rmmd-backup-9.engine-0").has_value());
  EXPECT_FALSE(backup_fd_id("rmmd-buffer-9.weights").has_value());
  EXPECT_EQ(stored_fd_id("rmmd-backup-9.engine-0"), 9u);
  EXPECT_EQ(stored_fd_id("rmmd-buffer-8.weights"), 8u);
  EXPECT_FALSE(stored_fd_id("rmmd-backup-x").has_value());
  EXPECT_FALSE(stored_fd_id("rmmd.socket").has_value());
  EXPECT_EQ(backup_fd_name(1, std::string(300, 'y')).size(), max_fd_name_bytes);
}

TEST(FdNameRules, AsSystemdChecksThem)
{
  EXPECT_TRUE(is_valid_fd_name(""));
  EXPECT_TRUE(is_valid_fd_name("a b/c.d-e_f"));
  EXPECT_FALSE(is_valid_fd_name("a:b"));
  EXPECT_FALSE(is_valid_fd_name("a\nb"));
  EXPECT_FALSE(is_valid_fd_name("\x7f"));
  EXPECT_FALSE(is_valid_fd_name(std::string(256, 'a')));
}

TEST(FdStore, WithoutAServiceManagerEveryCallIsANoOp)
{
  char const* saved      = std::getenv("NOTIFY_SOCKET");
  std::string const keep = saved != nullptr ? saved : "";
  ::unsetenv("NOTIFY_SOCKET");
  fd_store store;
  EXPECT_FALSE(store.available());
  int fd = ::memfd_create("fd-store-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(store.store(buffer_fd_name(1, "a"), fd).ok());
  EXPECT_TRUE(store.remove(buffer_fd_name(1, "a")).ok());
  auto bad = store.store("a:b", fd);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("without ':'"));
  EXPECT_GE(::fcntl(fd, F_GETFD), 0);  // still the caller's
  ::close(fd);
  if (saved != nullptr) { ::setenv("NOTIFY_SOCKET", keep.c_str(), 1); }
}

TEST(TakePassedFds, NothingPassedIsNothingTaken)
{
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_PID");
  auto passed = take_passed_fds();
  EXPECT_TRUE(passed.stored.empty());
  EXPECT_TRUE(passed.others.empty());
}

}  // namespace
}  // namespace rmmd::restart
