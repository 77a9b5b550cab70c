// Every row of DESIGN.md's error table, produced by a real request against the
// real daemon over both transports of Allocate and Free (the session socket
// and gRPC): the status code, the message, the client's exception, and the
// daemon's state unchanged afterwards.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/tools/daemon_process.hpp"

#include <rmmd/host_memory_resource.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

grpc::Status allocate(rmmd::session const& s,
                      std::uint32_t pool,
                      std::uint64_t size,
                      std::uint64_t alignment,
                      v1::AllocateResponse* out = nullptr)
{
  v1::AllocateRequest request;
  request.set_pool_id(pool);
  request.set_size(size);
  request.set_alignment(alignment);
  v1::AllocateResponse response;
  return rmmd::detail::impl_of(s).allocate(request, out ? out : &response);
}

grpc::Status free_id(rmmd::session const& s, std::uint64_t id)
{
  v1::FreeRequest request;
  request.set_allocation_id(id);
  return rmmd::detail::impl_of(s).free(request);
}

class ErrorTable : public ::testing::TestWithParam<rmmd::call_transport> {
 protected:
  // No drain deadline: on SIGTERM the live session is cut off at once
  // (drain_reload_test covers draining with a deadline).
  daemon_process daemon_{
      {"--host-pool-bytes", "64MiB", "--session-quota-bytes", "1MiB", "--drain-timeout-ms", "0"}};
  rmmd::session session_ = daemon_.open_session("errors", GetParam());
  std::uint32_t pool_    = session_.host_pool().id;
};

TEST_P(ErrorTable, InvalidArgumentsAreRefusedAndChangeNothing)
{
  EXPECT_EQ(rmmd::detail::impl_of(session_).uses_session_calls(),
            GetParam() == rmmd::call_transport::session_socket);
  auto held         = session_.allocate(pool_, 4096, 0);  // some state to keep
  auto const before = daemon_.ledger();
  struct bad_request {
    std::uint32_t pool;
    std::uint64_t size;
    std::uint64_t alignment;
    char const* says;
  };
  for (auto const& r :
       {bad_request{pool_, 0, 0, "size 0"},
        bad_request{pool_, 4096, 3, "alignment 3 is not a power of two"},
        bad_request{pool_, 4096, std::uint64_t{1} << 40, "not a power of two between"},
        bad_request{99, 4096, 0, "unknown pool id 99"}}) {
    auto st = allocate(session_, r.pool, r.size, r.alignment);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.says;
    EXPECT_THAT(st.error_message(), HasSubstr(r.says));
  }
  EXPECT_THROW((void)session_.allocate(pool_, 0, 0), rmmd::logic_error);
  EXPECT_EQ(daemon_.ledger(), before);
  session_.free(held.id);
}

TEST_P(ErrorTable, ARequestNoPoolCouldHoldIsOutOfMemoryAndChangesNothing)
{
  // As RMM's own resources answer a request larger than any memory they have.
  auto held         = session_.allocate(pool_, 4096, 0);
  auto const before = daemon_.ledger();
  auto st           = allocate(session_, pool_, std::uint64_t{1} << 50, 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("larger than the pool's capacity"));
  try {
    (void)session_.allocate(pool_, std::size_t{1} << 50, 0);
    ADD_FAILURE() << "1 PiB was granted";
  } catch (rmm::out_of_memory const& e) {
    EXPECT_THAT(e.what(), HasSubstr("out_of_memory"));
  }
  EXPECT_EQ(daemon_.ledger(), before);
  session_.free(held.id);
}

TEST_P(ErrorTable, QuotaIsEnforced)
{
  auto a            = session_.allocate(pool_, 768 * 1024, 0);
  auto const before = daemon_.ledger();
  auto st           = allocate(session_, pool_, 512 * 1024, 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("quota of 1048576 bytes"));
  EXPECT_THROW((void)session_.allocate(pool_, 512 * 1024, 0), rmm::out_of_memory);
  EXPECT_EQ(daemon_.ledger(), before);
  // What is left of the quota can still be used.
  auto b = session_.allocate(pool_, 256 * 1024, 0);
  session_.free(a.id);
  session_.free(b.id);
}

TEST_P(ErrorTable, UnknownAndDoubleFreeAreNotFound)
{
  auto a = session_.allocate(pool_, 4096, 0);
  ASSERT_TRUE(free_id(session_, a.id).ok());
  auto const before = daemon_.ledger();
  for (auto id : {a.id, std::uint64_t{123456789}}) {
    auto st = free_id(session_, id);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(st.error_message(), HasSubstr("no such allocation"));
  }
  EXPECT_THROW(session_.free(a.id), rmmd::logic_error);
  EXPECT_EQ(daemon_.ledger(), before);
}

TEST_P(ErrorTable, FreeingAnotherSessionsAllocationIsPermissionDenied)
{
  auto other        = daemon_.open_session("other", GetParam());
  auto theirs       = other.allocate(pool_, 8192, 0);
  auto const before = daemon_.ledger();
  auto st           = free_id(session_, theirs.id);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(st.error_message(), HasSubstr("held by another session"));
  EXPECT_THROW(session_.free(theirs.id), rmmd::permission_error);
  EXPECT_EQ(daemon_.ledger(), before);
  other.free(theirs.id);
}

TEST_P(ErrorTable, MissingOrForgedTokenIsUnauthenticated)
{
  auto channel      = grpc::CreateChannel("unix:" + (daemon_.runtime_dir() / "rmmd.sock").string(),
                                     grpc::InsecureChannelCredentials());
  auto stub         = v1::Rmmd::NewStub(channel);
  auto const before = daemon_.ledger();
  for (std::string token : {"", "00000000000000000000000000000000", "not-hex", "zz"}) {
    grpc::ClientContext ctx;
    if (!token.empty()) { ctx.AddMetadata("rmmd-token", token); }
    v1::AllocateRequest request;
    request.set_pool_id(pool_);
    request.set_size(4096);
    v1::AllocateResponse response;
    auto st = stub->Allocate(&ctx, request, &response);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "token '" << token << "'";
    EXPECT_THAT(st.error_message(), HasSubstr("session token"));
    grpc::ClientContext stats_ctx;
    if (!token.empty()) { stats_ctx.AddMetadata("rmmd-token", token); }
    v1::Stats stats;
    EXPECT_EQ(stub->GetStats(&stats_ctx, {}, &stats).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  EXPECT_EQ(daemon_.ledger(), before);
}

TEST_P(ErrorTable, PoolExhaustionIsResourceExhausted)
{
  // Other sessions fill the pool; ours then cannot get what is left.
  std::vector<rmmd::session> fillers;
  for (int i = 0; i < 64; ++i) {
    fillers.push_back(daemon_.open_session("filler"));
    (void)fillers.back().allocate(pool_, 1 << 20, 0);
  }
  auto const before = daemon_.ledger();
  auto st           = allocate(session_, pool_, 1 << 20, 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("in use"));
  EXPECT_EQ(daemon_.ledger(), before);
}

TEST_P(ErrorTable, AStoppedDaemonIsASessionError)
{
  // A session that does not wait for a daemon to come back (reconnect_test.cpp).
  rmmd::session session(rmmd::session::options{.runtime_dir = daemon_.runtime_dir(),
                                               .client_name = "stopped",
                                               .lease_calls = GetParam(),
                                               .reconnect   = std::chrono::milliseconds(0)});
  (void)session.allocate(pool_, 4096, 0);
  daemon_.process().kill(SIGTERM);
  // The daemon stops (no drain deadline here); the session then reports it is gone.
  EXPECT_TRUE(daemon_.process().wait(30s).has_value());
  try {
    (void)session.allocate(pool_, 4096, 0);
    FAIL() << "allocate succeeded against a stopped daemon";
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("allocate 4096 bytes"));
  }
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         ErrorTable,
                         ::testing::Values(rmmd::call_transport::session_socket,
                                           rmmd::call_transport::grpc),
                         [](auto const& info) {
                           return info.param == rmmd::call_transport::grpc ? "grpc"
                                                                           : "session_socket";
                         });

TEST(SessionAccess, UidNotAllowedIsRefusedAtTheSessionSocket)
{
  // Allow only a uid and gid this test does not run as.
  auto other = std::to_string(::getuid() == 4242 ? 4243 : 4242);
  daemon_process daemon({"--allow-uid", other, "--allow-gid", other});
  try {
    (void)daemon.open_session();
    FAIL() << "the session was opened";
  } catch (rmmd::permission_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("is not allowed to use this daemon"));
    EXPECT_THAT(e.what(), HasSubstr("uid " + std::to_string(::getuid())));
  }
}

TEST(SessionAccess, NoDaemonIsASessionError)
{
  try {
    (void)rmmd::session(rmmd::session::options{.runtime_dir = "/nonexistent/rmmd"});
    FAIL();
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("no daemon is listening at /nonexistent/rmmd/rmmd-session.sock"));
  }
}

}  // namespace
}  // namespace rmmd::test
