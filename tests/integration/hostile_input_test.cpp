// The session socket and the gRPC socket against clients that do not follow
// the protocol: each is answered or disconnected, and the daemon keeps serving.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "common/fd_passing.hpp"
#include "common/hex.hpp"
#include "harness/raw_session.hpp"
#include "tests/tools/daemon_process.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

class raw_session_socket {
 public:
  explicit raw_session_socket(std::filesystem::path const& dir)
      : fd_(harness::connect_session_socket(dir))
  {
  }
  ~raw_session_socket()
  {
    ::close(fd_);
  }

  void send(std::string const& bytes) const
  {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  void send_with_fd(std::string const& bytes, int fd) const
  {
    ASSERT_EQ(fd_passing::send_datagram(fd_, bytes, std::span<int const>(&fd, 1)),
              static_cast<ssize_t>(bytes.size()));
  }

  /// The daemon's next message; nullopt if it closed the connection (or the
  /// deadline passed: `closed` tells which).
  std::optional<std::string> receive(std::chrono::milliseconds timeout = 10s)
  {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) {
      closed = false;
      return std::nullopt;
    }
    std::string buffer(1 << 16, '\0');
    auto n = ::recv(fd_, buffer.data(), buffer.size(), 0);
    if (n <= 0) {
      closed = true;
      return std::nullopt;
    }
    buffer.resize(static_cast<std::size_t>(n));
    return buffer;
  }

  /// True once the daemon has closed the connection.
  bool closed_by_daemon(std::chrono::milliseconds timeout = 10s)
  {
    while (receive(timeout)) {}
    return closed;
  }

  [[nodiscard]] int fd() const noexcept
  {
    return fd_;
  }

  bool closed{false};

 private:
  int fd_{-1};
};

v1::ErrorInfo expect_refusal(raw_session_socket& s)
{
  auto reply = s.receive();
  EXPECT_TRUE(reply.has_value()) << "no reply before the connection ended";
  v1::SessionWelcome welcome;
  EXPECT_TRUE(welcome.ParseFromString(reply.value_or("")));
  EXPECT_TRUE(welcome.has_error());
  EXPECT_TRUE(welcome.token().empty());
  EXPECT_TRUE(s.closed_by_daemon());
  return welcome.error();
}

class HostileInput : public ::testing::Test {
 protected:
  void TearDown() override
  {
    // Whatever happened, the daemon still serves a well-behaved client.
    auto s = daemon_.open_session("after");
    auto a = s.allocate(s.host_pool().id, 4096, 0);
    s.free(a.id);
    // `s` and the observer (a hang-up is seen on another thread than a hello).
    EXPECT_TRUE(eventually([&] { return daemon_.stats().sessions_size() == 2; }));
  }

  daemon_process daemon_{{"--hello-timeout-ms", "300"}};
};

TEST_F(HostileInput, GarbageHelloIsRefused)
{
  raw_session_socket s(daemon_.runtime_dir());
  s.send(std::string("\xff\xff\xff\xff garbage \x00\x01", 16));
  auto error = expect_refusal(s);
  EXPECT_EQ(error.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(error.message(), HasSubstr("not a valid rmmd.v1.SessionHello"));
}

TEST_F(HostileInput, TruncatedHelloIsRefused)
{
  v1::SessionHello hello;
  hello.set_protocol_version(1);
  hello.set_client_name("a name long enough to cut in half");
  auto bytes = hello.SerializeAsString();
  raw_session_socket s(daemon_.runtime_dir());
  s.send(bytes.substr(0, bytes.size() / 2));
  auto error = expect_refusal(s);
  EXPECT_EQ(error.code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(HostileInput, OversizedHelloIsRefused)
{
  v1::SessionHello hello;
  hello.set_protocol_version(1);
  hello.set_client_name(std::string(100000, 'x'));
  raw_session_socket s(daemon_.runtime_dir());
  s.send(hello.SerializeAsString());
  auto error = expect_refusal(s);
  EXPECT_EQ(error.code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(error.message(), HasSubstr("larger than 4096 bytes"));
}

TEST_F(HostileInput, WrongProtocolVersionIsRefused)
{
  v1::SessionHello hello;
  hello.set_protocol_version(7);
  raw_session_socket s(daemon_.runtime_dir());
  s.send(hello.SerializeAsString());
  auto error = expect_refusal(s);
  EXPECT_EQ(error.code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(error.message(), HasSubstr("protocol version 7"));
}

TEST_F(HostileInput, SilentClientsAreClosedAtTheHelloDeadline)
{
  std::vector<std::unique_ptr<raw_session_socket>> silent;
  for (int i = 0; i < 8; ++i) {
    silent.push_back(std::make_unique<raw_session_socket>(daemon_.runtime_dir()));
  }
  for (auto& s : silent) { EXPECT_TRUE(s->closed_by_daemon(10s)); }
}

TEST_F(HostileInput, EmptyMessageAndEarlyCloseAreHandled)
{
  {
    raw_session_socket s(daemon_.runtime_dir());
    // A zero-length datagram reads as end-of-file: the daemon hangs up.
    s.send(std::string());
    EXPECT_TRUE(s.closed_by_daemon());
  }
  {
    raw_session_socket s(daemon_.runtime_dir());  // connects and hangs up at once
  }
  {
    // A hello with fds attached: the daemon takes no fds from clients.
    v1::SessionHello hello;
    hello.set_protocol_version(1);
    auto bytes = hello.SerializeAsString();
    raw_session_socket s(daemon_.runtime_dir());
    s.send_with_fd(bytes, STDERR_FILENO);
    v1::SessionWelcome welcome;
    ASSERT_TRUE(welcome.ParseFromString(s.receive().value_or("")));
    EXPECT_FALSE(welcome.has_error());
    EXPECT_EQ(welcome.token().size(), 16u);
  }
}

/// A session opened by hand, to send calls the client library never would.
class raw_session : public raw_session_socket {
 public:
  explicit raw_session(std::filesystem::path const& dir) : raw_session_socket(dir)
  {
    v1::SessionHello hello;
    hello.set_protocol_version(1);
    send(hello.SerializeAsString());
    v1::SessionWelcome welcome;
    if (!welcome.ParseFromString(receive().value_or("")) || welcome.has_error() ||
        !welcome.session_calls()) {
      throw std::runtime_error("no welcome offering session calls");
    }
    id    = welcome.session_id();
    token = welcome.token();
  }

  v1::SessionReply reply()
  {
    v1::SessionReply r;
    EXPECT_TRUE(r.ParseFromString(receive().value_or("")));
    return r;
  }

  v1::SessionReply call(v1::SessionCall const& c)
  {
    send(c.SerializeAsString());
    return reply();
  }

  std::uint64_t id{};
  std::string token;  ///< raw bytes; the gRPC metadata carries it in hex
};

/// Allocate 4096 bytes of the host pool.
v1::SessionCall allocate_call(std::uint64_t tag)
{
  v1::SessionCall c;
  c.set_tag(tag);
  c.mutable_allocate()->set_pool_id(0);
  c.mutable_allocate()->set_size(4096);
  return c;
}

TEST_F(HostileInput, BadCallsAreAnsweredAndTheSessionGoesOn)
{
  raw_session s(daemon_.runtime_dir());
  auto const alloc = allocate_call(1);
  auto held        = s.call(alloc);
  ASSERT_FALSE(held.has_error()) << held.error().message();
  ASSERT_EQ(held.tag(), 1u);
  auto const before = daemon_.ledger();

  s.send(std::string("\xff\xff\xff\xff garbage \x00\x01", 16));
  auto garbage = s.reply();
  EXPECT_EQ(garbage.tag(), 0u);
  EXPECT_EQ(garbage.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(garbage.error().message(), HasSubstr("not a valid rmmd.v1.SessionCall"));

  v1::SessionCall big;
  big.set_tag(2);
  big.mutable_open_buffer()->set_name(std::string(8000, 'x'));
  auto oversized = s.call(big);
  EXPECT_EQ(oversized.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(oversized.error().message(), HasSubstr("larger than 4096 bytes"));

  v1::SessionCall none;  // a call from a newer client, or none at all
  none.set_tag(3);
  auto unknown = s.call(none);
  EXPECT_EQ(unknown.tag(), 3u);
  EXPECT_EQ(unknown.error().code(), grpc::StatusCode::UNIMPLEMENTED);

  v1::SessionCall bad_alloc = alloc;
  bad_alloc.set_tag(4);
  bad_alloc.mutable_allocate()->set_size(0);
  auto zero = s.call(bad_alloc);
  EXPECT_EQ(zero.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(zero.has_allocate());

  v1::SessionCall free_unknown;
  free_unknown.set_tag(5);
  free_unknown.mutable_free()->set_allocation_id(987654321);
  EXPECT_EQ(s.call(free_unknown).error().code(), grpc::StatusCode::NOT_FOUND);

  v1::SessionCall ping;  // with an fd attached: the daemon takes no fds
  ping.set_tag(6);
  ping.mutable_ping();
  s.send_with_fd(ping.SerializeAsString(), STDERR_FILENO);
  auto pong = s.reply();
  EXPECT_EQ(pong.tag(), 6u);
  EXPECT_FALSE(pong.has_error());
  EXPECT_TRUE(pong.has_ping());

  EXPECT_EQ(daemon_.ledger(), before);
  v1::SessionCall release;
  release.set_tag(7);
  release.mutable_free()->set_allocation_id(held.allocate().allocation_id());
  auto freed = s.call(release);
  EXPECT_FALSE(freed.has_error()) << freed.error().message();
  EXPECT_TRUE(freed.has_free());
  EXPECT_EQ(in_use(daemon_.stats()), 0u);
}

TEST_F(HostileInput, AFreeThatAsksForNoReplyIsAnsweredOnlyIfItFails)
{
  raw_session s(daemon_.runtime_dir());
  auto held = s.call(allocate_call(1));
  ASSERT_FALSE(held.has_error()) << held.error().message();

  v1::SessionCall good;
  good.set_tag(2);
  good.set_reply_only_on_error(true);
  good.mutable_free()->set_allocation_id(held.allocate().allocation_id());
  s.send(good.SerializeAsString());
  v1::SessionCall bad = good;
  bad.set_tag(3);
  bad.mutable_free()->set_allocation_id(987654321);
  s.send(bad.SerializeAsString());
  v1::SessionCall ping;
  ping.set_tag(4);
  ping.mutable_ping();
  s.send(ping.SerializeAsString());

  // Calls are handled in order: the failed Free's answer, then the Ping's;
  // the good Free sent nothing.
  auto first = s.reply();
  EXPECT_EQ(first.tag(), 3u);
  EXPECT_EQ(first.error().code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.reply().tag(), 4u);
  EXPECT_EQ(in_use(daemon_.stats()), 0u);
}

TEST_F(HostileInput, AFreeNamingAnInterprocessEventIsRefusedOnBothSocketsAndFreesNothing)
{
  raw_session s(daemon_.runtime_dir());
  auto held = s.call(allocate_call(1));
  ASSERT_FALSE(held.has_error()) << held.error().message();
  auto const id     = held.allocate().allocation_id();
  auto const before = daemon_.ledger();

  // The session socket: refused even when it asks for no reply.
  v1::SessionCall old_free;
  old_free.set_tag(2);
  old_free.set_reply_only_on_error(true);
  old_free.mutable_free()->set_allocation_id(id);
  old_free.mutable_free()->set_removed_release_event(std::string(64, 'e'));
  auto refused = s.call(old_free);
  EXPECT_EQ(refused.tag(), 2u);
  EXPECT_EQ(refused.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error().message(), HasSubstr("no longer supported"));
  EXPECT_EQ(daemon_.ledger(), before);

  // The gRPC socket, with the same session's token.
  auto channel = grpc::CreateChannel("unix:" + (daemon_.runtime_dir() / "rmmd.sock").string(),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.AddMetadata("rmmd-token", common::to_hex(s.token));
  v1::FreeResponse response;
  auto st = v1::Rmmd::NewStub(channel)->Free(&ctx, old_free.free(), &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("no longer supported"));
  EXPECT_EQ(daemon_.ledger(), before);

  // The lease is still there to free.
  v1::SessionCall release;
  release.set_tag(3);
  release.mutable_free()->set_allocation_id(id);
  auto freed = s.call(release);
  EXPECT_FALSE(freed.has_error()) << freed.error().message();
  EXPECT_EQ(in_use(daemon_.stats()), 0u);
}

TEST_F(HostileInput, AClientThatReadsNoRepliesLosesItsSession)
{
  raw_session s(daemon_.runtime_dir());
  s.send(allocate_call(1).SerializeAsString());
  ASSERT_FALSE(s.reply().has_error());
  EXPECT_GT(in_use(daemon_.stats()), 0u);
  // Calls without reading a reply, until the daemon's replies fill the socket.
  v1::SessionCall ping;
  ping.mutable_ping();
  auto const bytes = ping.SerializeAsString();
  // However large the host's socket buffers, the daemon's replies fill them
  // in time; until then, keep calling.
  auto const give_up = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < give_up) {
    if (::send(s.fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT) >= 0) { continue; }
    if (errno == EAGAIN) {
      pollfd p{s.fd(), POLLOUT, 0};
      ::poll(&p, 1, 100);
    } else {
      break;  // the daemon has hung up
    }
  }
  EXPECT_TRUE(s.closed_by_daemon());
  // Its session ended, and with it the lease.
  EXPECT_TRUE(eventually([&] { return in_use(daemon_.stats()) == 0; }));
}

TEST_F(HostileInput, OversizedGrpcMessageIsRejected)
{
  auto s = daemon_.open_session("big");
  v1::AllocateRequest request;
  request.set_pool_id(0);
  request.set_size(4096);
  // 8 MiB of an unknown field: over the daemon's message cap (4 MiB and
  // 64 KiB at least, for a manifest's 4 MiB).
  request.GetReflection()->MutableUnknownFields(&request)->AddLengthDelimited(
      1000, std::string(8 << 20, 'x'));
  // A channel of our own: the session's channel would refuse to send it.
  auto channel = grpc::CreateChannel("unix:" + (daemon_.runtime_dir() / "rmmd.sock").string(),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.AddMetadata("rmmd-token", rmmd::detail::impl_of(s).token_hex());
  v1::AllocateResponse response;
  auto st = v1::Rmmd::NewStub(channel)->Allocate(&ctx, request, &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_EQ(in_use(daemon_.stats()), 0u);
}

// Each call's own cap: a request of 100 KiB, well under what gRPC takes for a
// manifest, is refused by a call that takes no manifest (the daemon's
// max_message_bytes, 64 KiB), before it is parsed, naming the call and its
// limit; nothing changes.
TEST_F(HostileInput, ARequestOverItsCallsCapIsRefusedBeforeItIsParsed)
{
  auto s = daemon_.open_session("capped");
  v1::OpenBufferRequest request;
  request.set_name(std::string(100 << 10, 'n'));
  auto channel = grpc::CreateChannel("unix:" + (daemon_.runtime_dir() / "rmmd.sock").string(),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.AddMetadata("rmmd-token", rmmd::detail::impl_of(s).token_hex());
  v1::BufferGrant grant;
  auto const before = daemon_.ledger();
  auto st           = v1::Rmmd::NewStub(channel)->OpenBuffer(&ctx, request, &grant);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_THAT(st.error_message(),
              HasSubstr("OpenBuffer: a request of 102404 bytes is larger than the 65536 bytes "
                        "this method accepts"));
  EXPECT_EQ(daemon_.ledger(), before);
}

}  // namespace
}  // namespace rmmd::test
