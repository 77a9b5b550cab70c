// Lines in the daemon's log that a client can cause: what libprotobuf and
// gRPC print on their own comes out as the daemon's lines (never as raw
// "[libprotobuf ERROR ...]" lines on stderr), and a flood of bad hellos
// writes a bounded number of lines, the rest counted as suppressed.

#include "harness/raw_session.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/integration/logged_daemon.hpp"
#include "tests/tools/text.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

/// A SessionHello of protocol version 1 whose client_name (field 2) holds
/// bytes that are not UTF-8, encoded by hand: protobuf would complain about
/// the string in this process too.
std::string hello_not_utf8()
{
  std::string const name = "bad \xff\xfe name";
  std::string bytes      = {'\x08', '\x01', '\x12', static_cast<char>(name.size())};
  return bytes + name;
}

/// Sends `bytes` on a new connection to the session socket and returns the
/// daemon's welcome (empty if it sent none within 10 s); throws when it
/// cannot connect.
v1::SessionWelcome send_hello(std::filesystem::path const& dir, std::string const& bytes)
{
  int const fd = harness::connect_session_socket(dir);
  v1::SessionWelcome welcome;
  if (::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size())) {
    pollfd p{fd, POLLIN, 0};
    std::string buffer(1 << 16, '\0');
    if (::poll(&p, 1, 10'000) > 0) {
      auto n = ::recv(fd, buffer.data(), buffer.size(), 0);
      if (n > 0) { welcome.ParseFromArray(buffer.data(), static_cast<int>(n)); }
    }
  }
  ::close(fd);
  return welcome;
}

/// Reads the log until a session's "opened" line: every line written before
/// it (the daemon writes stderr unbuffered, in order) is then in log().
void read_log_up_to_a_new_session(logged_daemon& daemon, std::string const& name)
{
  auto marker = daemon.open_session(name);
  ASSERT_TRUE(daemon.wait_log("(" + name + ")")) << daemon.log();
}

TEST(ClientCausedLogs, AHelloThatIsNotUtf8IsRefusedAndProtobufSpeaksThroughTheDaemonsLog)
{
  logged_daemon daemon({"--backend", "host", "--host-pool-bytes", "16MiB"});
  auto welcome = send_hello(daemon.runtime_dir(), hello_not_utf8());
  ASSERT_TRUE(welcome.has_error()) << "the daemon welcomed a hello whose name is not UTF-8";
  EXPECT_EQ(welcome.error().code(), 3);  // INVALID_ARGUMENT
  EXPECT_THAT(welcome.error().message(), HasSubstr("a client_name that is not UTF-8"));

  read_log_up_to_a_new_session(daemon, "marker");
  for (auto const& line : lines_of(daemon.log())) {
    EXPECT_THAT(line, MatchesRegex("<[3467]>rmmd: .*")) << "a line not written by rmmd::log";
    EXPECT_THAT(line, ::testing::Not(HasSubstr("[libprotobuf")));
  }
  EXPECT_THAT(daemon.log(), HasSubstr("protobuf (")) << "protobuf's complaint went elsewhere";
  EXPECT_THAT(daemon.log(), HasSubstr("invalid UTF-8"));
  EXPECT_THAT(daemon.log(), HasSubstr("session refused for pid"));
}

TEST(ClientCausedLogs, GrpcSpeaksThroughTheDaemonsLog)
{
  // At debug level the daemon lets gRPC's info lines through (its server
  // start says a few); at other levels gRPC keeps to its errors.
  logged_daemon daemon({"--backend", "host", "--host-pool-bytes", "16MiB", "--log-level", "debug"});
  read_log_up_to_a_new_session(daemon, "marker");
  EXPECT_THAT(daemon.log(), HasSubstr("rmmd: grpc (")) << "no gRPC line came through rmmd::log";
  for (auto const& line : lines_of(daemon.log())) {
    EXPECT_THAT(line, MatchesRegex("<[3467]>rmmd: .*")) << "a line not written by rmmd::log";
  }
}

TEST(ClientCausedLogs, AFloodOfBadHellosWritesABoundedNumberOfLinesAndCountsTheRest)
{
  logged_daemon daemon({"--backend", "host", "--host-pool-bytes", "16MiB"});
  constexpr int flood = 300;
  auto const start    = std::chrono::steady_clock::now();
  for (int i = 0; i < flood; ++i) {
    ASSERT_TRUE(send_hello(daemon.runtime_dir(), hello_not_utf8()).has_error());
  }
  auto const seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Every refusal is accounted for, written or counted: wait until the
  // counts the daemon reports (at the next line, or once a second) add up.
  // "N similar line(s) suppressed: sessions and connections refused" (no
  // std::regex: GCC 12 at -O1 warns inside <regex>, which the asan build fails on).
  std::string const count = " similar line(s) suppressed: sessions and connections refused";
  auto tally              = [&] {
    int written = 0, suppressed = 0;
    for (auto const& line : lines_of(daemon.log())) {
      if (auto at = line.find(count); at != std::string::npos) {
        auto start = line.find_last_not_of("0123456789", at - 1);
        start      = start == std::string::npos ? 0 : start + 1;
        suppressed += std::stoi(line.substr(start, at - start));
      } else if (line.find("session refused for pid") != std::string::npos) {
        ++written;
      }
    }
    return std::pair{written, suppressed};
  };
  while (tally().first + tally().second < flood) {
    ASSERT_TRUE(daemon.wait_log("similar line(s) suppressed: sessions and connections refused"))
        << "the daemon stopped reporting before all " << flood << " refusals were accounted for\n"
        << daemon.log();
  }
  auto const [written, suppressed] = tally();
  EXPECT_EQ(written + suppressed, flood);
  // A burst of 20, then 2 a second while the flood lasted.
  EXPECT_LE(written, 20 + static_cast<int>(2 * seconds) + 1) << daemon.log();
  EXPECT_GT(suppressed, 0);

  // protobuf's own line, once per bad hello, has a budget too.
  read_log_up_to_a_new_session(daemon, "marker");
  int protobuf_lines = 0;
  for (auto const& line : lines_of(daemon.log())) {
    protobuf_lines += line.find("protobuf (") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(protobuf_lines, 1);
  EXPECT_LE(protobuf_lines, 10 + static_cast<int>(seconds) + 2) << daemon.log();
}

}  // namespace
}  // namespace rmmd::test
