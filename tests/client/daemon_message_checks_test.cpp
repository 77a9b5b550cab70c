// The client's checks of what a daemon sends (client/detail/daemon_message_checks):
// what a real daemon sends passes, and each way a broken one could mislead
// the session is refused with a message. tests/fuzz/client_messages_fuzz.cpp
// throws arbitrary bytes at the same functions.

#include "client/detail/daemon_message_checks.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <string>
#include <tuple>

namespace rmmd::detail {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::SessionWelcome daemon_welcome()
{
  v1::SessionWelcome w;
  w.set_protocol_version(1);
  w.set_token(std::string(16, 't'));
  w.set_session_id(3);
  auto* host = w.add_pools();
  host->set_id(0);
  host->set_name("host");
  host->set_backend(v1::BACKEND_HOST);
  host->set_capacity_bytes(1 << 20);
  host->set_max_alignment(1 << 21);
  host->set_fd_index(0);
  auto* gpu = w.add_pools();
  gpu->set_id(1);
  gpu->set_name("gpu0");
  gpu->set_backend(v1::BACKEND_CUDA);
  gpu->set_capacity_bytes(1 << 30);
  gpu->set_fd_index(1);
  auto* fabric_only = w.add_pools();
  fabric_only->set_id(2);
  fabric_only->set_name("gpu1");
  fabric_only->set_backend(v1::BACKEND_CUDA);
  fabric_only->set_fd_index(-1);
  w.set_session_calls(true);
  return w;
}

welcome_result read(v1::SessionWelcome const& sent, std::span<int const> fds)
{
  auto const bytes = sent.SerializeAsString();
  v1::SessionWelcome welcome;
  return read_welcome(bytes, fds, welcome);
}

constexpr std::array<int, 3> attached{40, 41, 42};

TEST(DaemonMessageChecksWelcome, ADaemonsWelcomeGivesEachPoolItsFd)
{
  auto const result = read(daemon_welcome(), std::span(attached).first(2));
  EXPECT_EQ(result.status, welcome_status::ok) << result.message;
  EXPECT_THAT(result.pool_fds, ElementsAre(40, 41, -1));
}

TEST(DaemonMessageChecksWelcome, AnFdNoPoolNamesIsLeftToTheCaller)
{
  auto const result = read(daemon_welcome(), attached);
  EXPECT_EQ(result.status, welcome_status::ok);
  EXPECT_THAT(result.pool_fds, ElementsAre(40, 41, -1));  // 42 is the caller's to close
}

TEST(DaemonMessageChecksWelcome, RefusalsKeepTheDaemonsWords)
{
  v1::SessionWelcome w;
  w.set_protocol_version(1);
  w.mutable_error()->set_code(static_cast<int>(grpc::StatusCode::PERMISSION_DENIED));
  w.mutable_error()->set_message("uid 5 is not allowed");
  auto denied = read(w, {});
  EXPECT_EQ(denied.status, welcome_status::permission_denied);
  EXPECT_THAT(denied.message, HasSubstr("uid 5 is not allowed"));

  w.mutable_error()->set_code(static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(read(w, {}).status, welcome_status::refused);
}

TEST(DaemonMessageChecksWelcome, WhatTheSessionCannotRelyOnIsMalformed)
{
  auto const check = [](auto change, std::string const& why) {
    auto w = daemon_welcome();
    change(w);
    auto const result = read(w, std::span(attached).first(2));
    EXPECT_EQ(result.status, welcome_status::malformed) << why;
    EXPECT_THAT(result.message, HasSubstr(why));
    EXPECT_TRUE(result.pool_fds.empty());
  };
  check([](auto& w) { w.mutable_pools(1)->set_id(0); }, "pool ids must be 0, 1, 2");
  check([](auto& w) { w.mutable_pools(2)->set_id(7); }, "has id 7");
  check([](auto& w) { w.mutable_pools(1)->set_fd_index(0); }, "which another pool names too");
  check([](auto& w) { w.mutable_pools(2)->set_fd_index(2); }, "names fd 2 of 2 attached");
  check([](auto& w) { w.mutable_pools(2)->set_fd_index(-5); }, "fd_index -5");
  check([](auto& w) { w.mutable_pools(0)->set_capacity_bytes(0); }, "has no capacity");
  check([](auto& w) { w.mutable_pools(0)->set_max_alignment(3 << 10); }, "max_alignment 3072");
  check([](auto& w) { w.mutable_pools(0)->set_max_alignment(std::uint64_t{1} << 40); },
        "a power of two up to 1 GiB");
  check([](auto& w) { w.mutable_pools(0)->set_capacity_bytes(~std::uint64_t{0}); },
        "beyond any address space");

  v1::SessionWelcome welcome;
  auto const garbage = read_welcome(std::string("\xff\xff\xff", 3), {}, welcome);
  EXPECT_EQ(garbage.status, welcome_status::malformed);
  EXPECT_THAT(garbage.message, HasSubstr("not a valid SessionWelcome"));
}

std::string reply_bytes(std::uint64_t tag, auto fill)
{
  v1::SessionReply r;
  r.set_tag(tag);
  fill(r);
  return r.SerializeAsString();
}

TEST(DaemonMessageChecksReply, TheAnswerToTheCallCarriesItsStatus)
{
  v1::SessionReply reply;
  auto ok = read_reply(reply_bytes(9, [](auto& r) { r.mutable_allocate()->set_allocation_id(4); }),
                       9,
                       v1::SessionCall::kAllocate,
                       reply);
  EXPECT_EQ(ok.kind, reply_kind::answer);
  EXPECT_TRUE(ok.status.ok());
  EXPECT_EQ(reply.allocate().allocation_id(), 4u);

  auto failed = read_reply(reply_bytes(9,
                                       [](auto& r) {
                                         r.mutable_error()->set_code(5);
                                         r.mutable_error()->set_message("no such allocation");
                                       }),
                           9,
                           v1::SessionCall::kFree,
                           reply);
  EXPECT_EQ(failed.kind, reply_kind::answer);
  EXPECT_EQ(failed.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(failed.status.error_message(), "no such allocation");
}

TEST(DaemonMessageChecksReply, AnErrorCodeTheClientDoesNotKnowIsUnknownNeverOk)
{
  v1::SessionReply reply;
  for (int code : {0, -1, 17, 1000}) {
    auto r = read_reply(reply_bytes(2, [&](auto& m) { m.mutable_error()->set_code(code); }),
                        2,
                        v1::SessionCall::kAllocate,
                        reply);
    EXPECT_EQ(r.kind, reply_kind::answer);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNKNOWN) << code;
  }
}

TEST(DaemonMessageChecksReply, ALateReplyIsAnEarlierCallsAndAWrongOneIsInvalid)
{
  v1::SessionReply reply;
  EXPECT_EQ(read_reply(
                reply_bytes(1, [](auto& r) { r.mutable_free(); }), 2, v1::SessionCall::kFree, reply)
                .kind,
            reply_kind::earlier);

  // An Allocate answered as if it were a Free would read as a lease at
  // offset 0 that nobody granted.
  auto other = read_reply(
      reply_bytes(2, [](auto& r) { r.mutable_free(); }), 2, v1::SessionCall::kAllocate, reply);
  EXPECT_EQ(other.kind, reply_kind::invalid);
  EXPECT_EQ(other.status.error_code(), grpc::StatusCode::INTERNAL);

  auto garbage = read_reply(std::string("\x08", 1), 2, v1::SessionCall::kPing, reply);
  EXPECT_EQ(garbage.kind, reply_kind::invalid);
  EXPECT_THAT(garbage.status.error_message(), HasSubstr("not a valid SessionReply"));
}

v1::AllocateResponse host_lease(std::uint64_t offset, std::uint64_t size)
{
  v1::AllocateResponse r;
  r.set_allocation_id(1);
  r.set_size(size);
  r.mutable_host()->set_offset(offset);
  return r;
}

TEST(AllocationCheck, AHostLeaseMustLieInThePoolAlignedAsAsked)
{
  allocation_request const asked{
      .host_pool = true, .pool_capacity = 1 << 20, .bytes = 1000, .alignment = 512};
  EXPECT_TRUE(check_allocation(host_lease(0, 1024), asked).ok());
  EXPECT_TRUE(check_allocation(host_lease((1 << 20) - 1024, 1024), asked).ok());
  for (auto const& [lease, why] :
       {std::pair{host_lease(256, 1024), "not aligned to 512"},
        std::pair{host_lease(1 << 20, 1024), "past the pool"},
        std::pair{host_lease(~std::uint64_t{0} - 511, 1024), "past the pool"},
        std::pair{host_lease(0, 512), "grants only 512 bytes"}}) {
    auto const status = check_allocation(lease, asked);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << why;
    EXPECT_THAT(status.error_message(), HasSubstr(why));
  }
  v1::AllocateResponse cuda;
  cuda.set_size(1024);
  cuda.mutable_cuda()->set_export_data(std::string(64, 'x'));
  EXPECT_THAT(check_allocation(cuda, asked).error_message(), HasSubstr("no host pool offset"));
}

TEST(AllocationCheck, ACudaLeaseMustCarryExportData)
{
  allocation_request const asked{
      .host_pool = false, .pool_capacity = 0, .bytes = 64, .alignment = 0};
  EXPECT_THAT(check_allocation(host_lease(0, 64), asked).error_message(),
              HasSubstr("no CUDA export data"));
  v1::AllocateResponse cuda;
  cuda.set_size(256);
  cuda.mutable_cuda()->set_export_data(std::string(64, 'x'));
  EXPECT_TRUE(check_allocation(cuda, asked).ok());
}

v1::AllocateResponse packed_lease(std::uint64_t block, std::uint64_t offset, std::uint64_t size)
{
  v1::AllocateResponse r;
  r.set_allocation_id(7);
  r.set_size(size);
  r.mutable_cuda()->set_export_data(std::string(64, 'x'));
  r.set_block_id(block);
  r.set_block_offset(offset);
  return r;
}

TEST(AllocationCheck, APackedLeaseMustLieInItsBlockAlignedAsAskedAndOnlyWhereAsked)
{
  allocation_request const asked{
      .host_pool = false, .pool_capacity = 0, .bytes = 1000, .alignment = 0, .may_pack = true};
  EXPECT_TRUE(check_allocation(packed_lease(3, 0, 1024), asked).ok());
  EXPECT_TRUE(check_allocation(packed_lease(3, (2 << 20) - 1024, 1024), asked).ok());
  auto not_asked     = asked;
  not_asked.may_pack = false;
  auto with_id_bit   = packed_lease(0, 0, 1024);
  with_id_bit.set_allocation_id(std::uint64_t{1} << 63);
  for (auto const& [lease, request, why] : {
           std::tuple{packed_lease(3, 128, 1024), asked, "not aligned to 256"},
           std::tuple{packed_lease(3, 2 << 20, 1024), asked, "past its block's 2097152 bytes"},
           std::tuple{packed_lease(3, (2 << 20) - 768, 1024), asked, "past its block's"},
           std::tuple{packed_lease(3, ~std::uint64_t{0} - 255, 1024), asked, "past its block's"},
           std::tuple{packed_lease(0, 4096, 1024), asked, "a block offset but no block"},
           std::tuple{packed_lease(3, 0, 1024), not_asked, "which this call did not ask for"},
           std::tuple{with_id_bit, asked, "not below 2^63"},
       }) {
    auto const status = check_allocation(lease, request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INTERNAL) << why;
    EXPECT_THAT(status.error_message(), HasSubstr(why));
  }
  // A host pool packs nothing.
  auto host = host_lease(0, 1024);
  host.set_block_id(3);
  EXPECT_THAT(check_allocation(host,
                               {.host_pool     = true,
                                .pool_capacity = 1 << 20,
                                .bytes         = 1000,
                                .alignment     = 0,
                                .may_pack      = true})
                  .error_message(),
              HasSubstr("which this call did not ask for"));
}

TEST(HostPoolFd, AnFdSmallerThanThePoolIsRefused)
{
  int fd = ::memfd_create("welcome-parser-test", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 1 << 16), 0);
  EXPECT_EQ(check_host_pool_fd(fd, 1 << 16), std::nullopt);
  auto why = check_host_pool_fd(fd, 1 << 20);
  ASSERT_TRUE(why.has_value());
  EXPECT_THAT(*why, HasSubstr("holds 65536 bytes, less than its capacity of 1048576"));
  ::close(fd);
  EXPECT_THAT(check_host_pool_fd(fd, 1).value_or(""), HasSubstr("fstat"));
}

}  // namespace
}  // namespace rmmd::detail
