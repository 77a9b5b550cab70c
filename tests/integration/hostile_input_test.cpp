// The session socket and the gRPC socket against clients that do not follow
// the protocol: each is answered or disconnected, and the daemon keeps serving.

#include "client/detail/session_impl.hpp"
#include "tests/tools/daemon_process.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

class raw_session_socket {
 public:
  explicit raw_session_socket(std::filesystem::path const& dir)
  {
    fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    auto path       = (dir / "rmmd-session.sock").string();
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      throw std::runtime_error("connect " + path);
    }
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
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    msghdr msg{};
    msg.msg_iov        = &iov;
    msg.msg_iovlen     = 1;
    msg.msg_control    = control;
    msg.msg_controllen = sizeof(control);
    auto* c            = CMSG_FIRSTHDR(&msg);
    c->cmsg_level      = SOL_SOCKET;
    c->cmsg_type       = SCM_RIGHTS;
    c->cmsg_len        = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    ASSERT_EQ(::sendmsg(fd_, &msg, MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
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
    EXPECT_EQ(daemon_.stats().sessions_size(), 2);  // `s` and the observer
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

TEST_F(HostileInput, OversizedGrpcMessageIsRejected)
{
  auto s = daemon_.open_session("big");
  v1::AllocateRequest request;
  request.set_pool_id(0);
  request.set_size(4096);
  // 1 MiB of an unknown field: over the daemon's 64 KiB message cap.
  request.GetReflection()->MutableUnknownFields(&request)->AddLengthDelimited(
      1000, std::string(1 << 20, 'x'));
  // A channel of our own: the session's channel would refuse to send it.
  auto channel = grpc::CreateChannel("unix:" + (daemon_.runtime_dir() / "rmmd.sock").string(),
                                     grpc::InsecureChannelCredentials());
  grpc::ClientContext ctx;
  ctx.AddMetadata("rmmd-token", s.impl().token_hex());
  v1::AllocateResponse response;
  auto st = v1::Rmmd::NewStub(channel)->Allocate(&ctx, request, &response);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_EQ(in_use(daemon_.stats()), 0u);
}

}  // namespace
}  // namespace rmmd::test
