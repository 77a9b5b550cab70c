// fd_passing over a socketpair: the bytes and the fds arrive together, the
// receiver's copies refer to the sender's files and are close-on-exec, and
// whatever does not fit (bytes or fds) is reported and never leaks an fd.

#include "common/fd_passing.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::fd_passing {
namespace {

/// How many fds this process has open.
std::size_t open_fd_count()
{
  std::size_t n = 0;
  for ([[maybe_unused]] auto const& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

/// True if `a` and `b` are the same open file (device and inode).
bool same_file(int a, int b)
{
  struct stat sa {};
  struct stat sb {};
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

class FdPassing : public ::testing::Test {
 protected:
  void SetUp() override
  {
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets_.data()), 0);
    for (auto& p : pipes_) { ASSERT_EQ(::pipe2(p.data(), O_CLOEXEC), 0); }
    baseline_ = open_fd_count();
  }
  void TearDown() override
  {
    for (int fd : sockets_) { ::close(fd); }
    for (auto& p : pipes_) {
      for (int fd : p) { ::close(fd); }
    }
  }

  /// The read ends of the three pipes: files to pass.
  std::vector<int> files(std::size_t n) const
  {
    std::vector<int> out;
    for (std::size_t i = 0; i < n; ++i) { out.push_back(pipes_.at(i)[0]); }
    return out;
  }

  int sender() const
  {
    return sockets_[0];
  }
  int receiver() const
  {
    return sockets_[1];
  }

  std::array<int, 2> sockets_{-1, -1};
  std::array<std::array<int, 2>, 3> pipes_{};
  std::size_t baseline_{};
};

TEST_F(FdPassing, BytesAndFdsArriveTogether)
{
  std::string_view const text = "welcome";
  auto const sent             = files(2);
  ASSERT_EQ(send_datagram(sender(), text, sent), static_cast<ssize_t>(text.size()));

  std::array<char, 64> buffer{};
  std::array<int, 4> fds{-1, -1, -1, -1};
  auto const got = receive_datagram(receiver(), buffer, fds);
  ASSERT_EQ(got.bytes, static_cast<ssize_t>(text.size()));
  EXPECT_EQ(std::string_view(buffer.data(), text.size()), text);
  EXPECT_FALSE(got.truncated);
  EXPECT_FALSE(got.fds_truncated);
  ASSERT_EQ(got.fd_count, 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_NE(fds[i], sent[i]) << "the receiver gets its own fd";
    EXPECT_TRUE(same_file(fds[i], sent[i])) << "fd " << i << " is not the file that was sent";
    EXPECT_EQ(::fcntl(fds[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC) << "fd " << i;
  }
  EXPECT_EQ(open_fd_count(), baseline_ + 2);
  close_fds(fds, got.fd_count);
  EXPECT_EQ(open_fd_count(), baseline_);
}

TEST_F(FdPassing, ADatagramWithoutFdsReportsNone)
{
  std::string_view const text = "call";
  ASSERT_EQ(send_datagram(sender(), text), static_cast<ssize_t>(text.size()));
  std::array<char, 64> buffer{};
  std::array<int, 2> fds{-1, -1};
  auto const got = receive_datagram(receiver(), buffer, fds);
  EXPECT_EQ(got.bytes, static_cast<ssize_t>(text.size()));
  EXPECT_EQ(got.fd_count, 0u);
  EXPECT_FALSE(got.fds_truncated);
  EXPECT_EQ(open_fd_count(), baseline_);
}

TEST_F(FdPassing, FdsNotAskedForAreDroppedAndReported)
{
  // The listener's case: it takes no fds from clients.
  std::string_view const text = "hello";
  ASSERT_EQ(send_datagram(sender(), text, files(3)), static_cast<ssize_t>(text.size()));
  std::array<char, 64> buffer{};
  auto const got = receive_datagram(receiver(), buffer);
  EXPECT_EQ(got.bytes, static_cast<ssize_t>(text.size()));
  EXPECT_EQ(got.fd_count, 0u);
  EXPECT_TRUE(got.fds_truncated);
  EXPECT_EQ(open_fd_count(), baseline_) << "an fd that was not asked for leaked";
}

TEST_F(FdPassing, MoreFdsThanRoomKeepsTheFirstAndClosesTheRest)
{
  // With room for one fd the control buffer's padding lets the kernel
  // install a second one (closed by the helper); the third never arrives.
  std::string_view const text = "x";
  auto const sent             = files(3);
  ASSERT_EQ(send_datagram(sender(), text, sent), 1);
  std::array<char, 8> buffer{};
  std::array<int, 1> fds{-1};
  auto const got = receive_datagram(receiver(), buffer, fds);
  EXPECT_EQ(got.bytes, 1);
  ASSERT_EQ(got.fd_count, 1u);
  EXPECT_TRUE(same_file(fds[0], sent[0]));
  EXPECT_TRUE(got.fds_truncated);
  EXPECT_EQ(open_fd_count(), baseline_ + 1) << "fds beyond the room leaked";
  close_fds(fds, got.fd_count);
}

TEST_F(FdPassing, ALongerDatagramIsReportedTruncated)
{
  std::string const text(100, 'a');
  ASSERT_EQ(send_datagram(sender(), text, files(1)), 100);
  std::array<char, 10> buffer{};
  std::array<int, 1> fds{-1};
  auto const got = receive_datagram(receiver(), buffer, fds);
  EXPECT_EQ(got.bytes, 10);
  EXPECT_TRUE(got.truncated);
  EXPECT_EQ(got.fd_count, 1u) << "the fds still arrive with a truncated datagram";
  close_fds(fds, got.fd_count);
  EXPECT_EQ(open_fd_count(), baseline_);
}

TEST_F(FdPassing, PeerClosedReadsAsZeroAndErrorsKeepErrno)
{
  std::array<char, 8> buffer{};
  auto const empty = receive_datagram(receiver(), buffer, {}, MSG_DONTWAIT);
  EXPECT_EQ(empty.bytes, -1);
  EXPECT_EQ(errno, EAGAIN);

  ::close(sockets_[0]);
  sockets_[0]     = -1;
  auto const gone = receive_datagram(receiver(), buffer);
  EXPECT_EQ(gone.bytes, 0);
  EXPECT_EQ(gone.fd_count, 0u);
}

TEST_F(FdPassing, TooManyFdsToSendIsEinval)
{
  std::vector<int> const many(max_fds_per_datagram + 1, pipes_[0][0]);
  EXPECT_EQ(send_datagram(sender(), std::string_view("x"), many), -1);
  EXPECT_EQ(errno, EINVAL);
  // The largest number Linux passes does go through.
  std::vector<int> const most(max_fds_per_datagram, pipes_[0][0]);
  ASSERT_EQ(send_datagram(sender(), std::string_view("x"), most), 1);
  std::array<char, 8> buffer{};
  std::vector<int> fds(max_fds_per_datagram, -1);
  auto const got = receive_datagram(receiver(), buffer, fds);
  EXPECT_EQ(got.fd_count, max_fds_per_datagram);
  EXPECT_FALSE(got.fds_truncated);
  close_fds(fds, got.fd_count);
  EXPECT_EQ(open_fd_count(), baseline_);
}

}  // namespace
}  // namespace rmmd::fd_passing
