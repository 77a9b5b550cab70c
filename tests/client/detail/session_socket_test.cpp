// session_socket: a datagram round trip over a socketpair standing in for
// the daemon's end (no daemon, no CUDA): the reply with the call's tag is
// the answer, what comes before it is handed on as unasked, a closed peer
// is UNAVAILABLE and closed() says so.

#include "client/detail/session_socket.hpp"

#include <gtest/gtest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <thread>
#include <vector>

namespace rmmd::detail {
namespace {

using namespace std::chrono_literals;

/// A socketpair: [0] the session's end (the session_socket takes it), [1]
/// the daemon's.
std::array<int, 2> pair_of_ends()
{
  std::array<int, 2> fds{-1, -1};
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds.data()), 0);
  return fds;
}

void send_reply(int fd, v1::SessionReply const& reply)
{
  auto const bytes = reply.SerializeAsString();
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

v1::SessionCall receive_call(int fd)
{
  std::array<char, 4096> buffer{};
  auto const n = ::recv(fd, buffer.data(), buffer.size(), 0);
  v1::SessionCall call;
  EXPECT_TRUE(n > 0 && call.ParseFromArray(buffer.data(), static_cast<int>(n)));
  return call;
}

TEST(SessionSocket, TheTaggedReplyAnswersAndWhatCameBeforeIsHandedOn)
{
  auto const ends = pair_of_ends();
  session_socket socket(ends[0], 5000ms);
  std::thread daemon([&] {
    auto const call = receive_call(ends[1]);
    v1::SessionReply reclaim;  // unasked: no call's tag
    reclaim.mutable_reclaim()->set_pool_id(3);
    send_reply(ends[1], reclaim);
    v1::SessionReply answer;
    answer.set_tag(call.tag());
    answer.mutable_allocate()->set_allocation_id(42);
    send_reply(ends[1], answer);
  });
  v1::SessionCall call;
  call.mutable_allocate()->set_size(4096);
  v1::SessionReply reply;
  std::vector<std::uint32_t> reclaims;
  auto const status = socket.round_trip(call, reply, nullptr, [&](v1::SessionReply const& r) {
    if (r.has_reclaim()) { reclaims.push_back(r.reclaim().pool_id()); }
  });
  daemon.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(reply.allocate().allocation_id(), 42u);
  EXPECT_EQ(reclaims, std::vector<std::uint32_t>{3});
  EXPECT_FALSE(socket.closed());
  ::close(ends[1]);
}

TEST(SessionSocket, ADaemonThatWentAwayIsUnavailableAndClosedSaysSo)
{
  auto const ends = pair_of_ends();
  session_socket socket(ends[0], 5000ms);
  ::close(ends[1]);
  EXPECT_TRUE(socket.closed());
  v1::SessionCall call;
  call.mutable_ping();
  v1::SessionReply reply;
  auto const status = socket.round_trip(call, reply, nullptr, [](v1::SessionReply const&) {});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST(SessionSocket, ASilentDaemonEndsTheCallAtTheDeadline)
{
  auto const ends = pair_of_ends();
  session_socket socket(ends[0], 200ms);
  v1::SessionCall call;
  call.mutable_ping();
  v1::SessionReply reply;
  auto const status = socket.round_trip(call, reply, nullptr, [](v1::SessionReply const&) {});
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ::close(ends[1]);
}

TEST(SessionSocket, AReplacedSocketCarriesTheNextCalls)
{
  auto const first  = pair_of_ends();
  auto const second = pair_of_ends();
  session_socket socket(first[0], 5000ms);
  ::close(first[1]);
  ASSERT_TRUE(socket.closed());
  socket.replace(second[0]);
  EXPECT_FALSE(socket.closed());
  EXPECT_EQ(socket.fd(), second[0]);
  std::thread daemon([&] {
    auto const call = receive_call(second[1]);
    v1::SessionReply answer;
    answer.set_tag(call.tag());
    answer.mutable_ping();
    send_reply(second[1], answer);
  });
  v1::SessionCall call;
  call.mutable_ping();
  v1::SessionReply reply;
  auto const status = socket.round_trip(call, reply, nullptr, [](v1::SessionReply const&) {});
  daemon.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  ::close(second[1]);
}

}  // namespace
}  // namespace rmmd::detail
