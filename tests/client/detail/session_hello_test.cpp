// say_hello against a socketpair standing in for a daemon that stops between
// taking the connection and answering (no daemon, no CUDA): the client says
// that the daemon stopped, whether it read the hello first or not.

#include "client/detail/session_hello.hpp"

#include <rmmd/error.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <string>
#include <thread>

namespace rmmd::detail {
namespace {

using ::testing::HasSubstr;

/// What say_hello throws when the daemon's end, once the hello is there,
/// is closed after reading it (`read_first`) or with it unread (a reset).
std::string error_when_the_daemon_stops(bool read_first)
{
  std::array<int, 2> fds{-1, -1};
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds.data()), 0);
  std::thread daemon([&] {
    pollfd p{fds[1], POLLIN, 0};
    ::poll(&p, 1, 10'000);
    if (read_first) {
      std::array<char, 4096> hello{};
      static_cast<void>(::recv(fds[1], hello.data(), hello.size(), 0));
    }
    ::close(fds[1]);
  });
  std::string what = "no error";
  try {
    session_welcome welcome;
    say_hello(fds[0], "stopping", welcome);  // closes fds[0] when it throws
  } catch (rmmd::session_error const& e) {
    what = e.what();
  }
  daemon.join();
  return what;
}

TEST(SayHello, ADaemonThatClosesAfterReadingTheHelloIsSaidToHaveStopped)
{
  EXPECT_THAT(error_when_the_daemon_stops(true),
              HasSubstr("closed the session socket without a welcome: it stopped before it "
                        "answered"));
}

TEST(SayHello, ADaemonThatClosesOnAnUnreadHelloIsSaidToHaveStopped)
{
  // The kernel resets the connection (ECONNRESET) rather than ending it.
  EXPECT_THAT(error_when_the_daemon_stops(false),
              HasSubstr("closed the session socket without a welcome: it stopped before it "
                        "answered"));
}

}  // namespace
}  // namespace rmmd::detail
