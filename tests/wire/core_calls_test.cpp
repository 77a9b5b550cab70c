// The calls both sockets make, from request to core to reply, into a real
// core with a host pool.

#include "daemon/wire/core_calls.hpp"
#include "daemon/core/daemon_core.hpp"
#include "tests/tools/host_core_fixture.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <string>

namespace rmmd::wire {
namespace {

class CoreCalls : public test::host_core_fixture {
 protected:
  CoreCalls() : host_core_fixture("core-calls") {}
};

TEST_F(CoreCalls, AllocateFillsTheReplyAndFreeTakesItBack)
{
  v1::AllocateRequest request;
  request.set_size(4096);
  v1::AllocateResponse reply;
  ASSERT_TRUE(allocate(*core_, session_, request, {}, &reply).ok());
  EXPECT_EQ(reply.size(), 4096u);
  EXPECT_TRUE(reply.has_host());

  v1::FreeRequest free_request;
  free_request.set_allocation_id(reply.allocation_id());
  EXPECT_TRUE(free(*core_, session_, free_request).ok());
  EXPECT_EQ(free(*core_, session_, free_request).code(), absl::StatusCode::kNotFound);
}

TEST_F(CoreCalls, AFreeNamingAnInterprocessEventIsRefusedAndFreesNothing)
{
  v1::AllocateRequest request;
  request.set_size(4096);
  v1::AllocateResponse reply;
  ASSERT_TRUE(allocate(*core_, session_, request, {}, &reply).ok());

  v1::FreeRequest free_request;
  free_request.set_allocation_id(reply.allocation_id());
  free_request.set_removed_release_event(std::string(64, 'e'));
  auto const refused = free(*core_, session_, free_request);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("no longer supported"));
  EXPECT_EQ(core_->pools().stats().pools.at(0).allocation_count, 1u);

  free_request.clear_removed_release_event();
  EXPECT_TRUE(free(*core_, session_, free_request).ok()) << "the refused Free took the lease";
}

TEST_F(CoreCalls, AFailedCallWritesNoReply)
{
  v1::AllocateRequest request;
  request.set_size(4096);
  request.set_pool_id(99);
  v1::AllocateResponse reply;
  EXPECT_EQ(allocate(*core_, session_, request, {}, &reply).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reply.ByteSizeLong(), 0u);
}

}  // namespace
}  // namespace rmmd::wire
