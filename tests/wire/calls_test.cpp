// The call table: that it agrees with rmmd.proto, and its calls, from request
// to core to reply, into a real core with a host pool.

#include "daemon/wire/calls.hpp"
#include "daemon/core/daemon_core.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/tools/host_core_fixture.hpp"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <set>
#include <string>

namespace rmmd::wire {
namespace {

TEST(CallTable, EveryMethodOfTheServiceAndEverySessionCallHasOneEntry)
{
  ASSERT_NO_THROW(calls());
  std::set<std::string> grpc;
  std::set<std::string> session;
  for (auto const& c : calls()) {
    if (carries(c, transport::grpc)) { grpc.insert(std::string(c.name)); }
    if (carries(c, transport::session_socket)) {
      session.insert(c.session_call_field->name());
      EXPECT_EQ(c.session_call_field->message_type(), c.request->GetDescriptor()) << c.name;
      EXPECT_EQ(c.session_reply_field->message_type(), c.reply->GetDescriptor()) << c.name;
    }
  }
  auto const* service = v1::AllocateRequest::descriptor()->file()->FindServiceByName("Rmmd");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(grpc.size(), static_cast<std::size_t>(service->method_count()));
  for (int i = 0; i < service->method_count(); ++i) {
    EXPECT_TRUE(grpc.contains(service->method(i)->name())) << service->method(i)->name();
  }
  auto const* oneof = v1::SessionCall::descriptor()->FindOneofByName("call");
  for (int i = 0; i < oneof->field_count(); ++i) {
    EXPECT_TRUE(session.contains(oneof->field(i)->name())) << oneof->field(i)->name();
  }
  EXPECT_EQ(find_call("NoSuchCall"), nullptr);
  ASSERT_NE(find_call("Health"), nullptr);
  EXPECT_FALSE(find_call("Health")->routes.needs_session);
  EXPECT_EQ(call_names(transport::grpc).size(), grpc.size());
}

class Calls : public test::host_core_fixture {
 protected:
  Calls() : host_core_fixture("calls") {}

  /// Makes the call `name` as a transport with `rules` would.
  absl::Status make(std::string_view name,
                    Message const& request,
                    Message* reply,
                    transport_rules rules = {})
  {
    auto const* c = find_call(name);
    EXPECT_NE(c, nullptr) << name;
    if (c == nullptr) { return absl::NotFoundError("no such call"); }
    return c->handle({.core = *core_, .session = session_, .rules = rules}, request, reply);
  }
};

TEST_F(Calls, AllocateFillsTheReplyAndFreeTakesItBack)
{
  v1::AllocateRequest request;
  request.set_size(4096);
  v1::AllocateResponse reply;
  ASSERT_TRUE(make("Allocate", request, &reply).ok());
  EXPECT_EQ(reply.size(), 4096u);
  EXPECT_TRUE(reply.has_host());

  v1::FreeRequest free_request;
  free_request.set_allocation_id(reply.allocation_id());
  v1::FreeResponse freed;
  EXPECT_TRUE(make("Free", free_request, &freed).ok());
  EXPECT_EQ(make("Free", free_request, &freed).code(), absl::StatusCode::kNotFound);
}

TEST_F(Calls, AFreeNamingAnInterprocessEventIsRefusedAndFreesNothing)
{
  v1::AllocateRequest request;
  request.set_size(4096);
  v1::AllocateResponse reply;
  ASSERT_TRUE(make("Allocate", request, &reply).ok());

  v1::FreeRequest free_request;
  free_request.set_allocation_id(reply.allocation_id());
  free_request.set_removed_release_event(std::string(64, 'e'));
  v1::FreeResponse freed;
  auto const refused = make("Free", free_request, &freed);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("no longer supported"));
  EXPECT_EQ(core_->pools().stats().pools.at(0).allocation_count, 1u);

  free_request.clear_removed_release_event();
  EXPECT_TRUE(make("Free", free_request, &freed).ok()) << "the refused Free took the lease";
}

TEST_F(Calls, AFailedCallWritesNoReply)
{
  v1::AllocateRequest request;
  request.set_size(4096);
  request.set_pool_id(99);
  v1::AllocateResponse reply;
  EXPECT_EQ(make("Allocate", request, &reply).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reply.ByteSizeLong(), 0u);
}

// Without peering, another node's buffers are NOT_FOUND on gRPC (which may
// wait), and refused on a transport that lets no call wait.
TEST_F(Calls, AnotherNodesBufferNeedsPeeringAndATransportThatMayWait)
{
  v1::OpenBufferRequest open;
  open.set_name("team/w");
  open.set_peer("node-b");
  v1::BufferGrant grant;
  auto const* c = find_call("OpenBuffer");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->handle({.core = *core_, .session = session_}, open, &grant).code(),
            absl::StatusCode::kInvalidArgument);
  auto const waiting = call_context{
      .core = *core_, .session = session_, .deadline = std::chrono::system_clock::now()};
  EXPECT_EQ(c->handle(waiting, open, &grant).code(), absl::StatusCode::kNotFound);

  v1::ListBuffersRequest list;
  list.set_peer("node-b");
  v1::ListBuffersResponse listed;
  EXPECT_EQ(make("ListBuffers", list, &listed).code(), absl::StatusCode::kNotFound);
}

TEST_F(Calls, HealthReportsTheDaemonWithoutASession)
{
  daemon_facts const facts{.metrics_address = "127.0.0.1:9400"};
  v1::HealthRequest request;
  v1::HealthResponse reply;
  ASSERT_TRUE(find_call("Health")->handle({.core = *core_, .facts = &facts}, request, &reply).ok());
  EXPECT_EQ(reply.status(), v1::SERVING_STATUS_SERVING);
  EXPECT_EQ(reply.pool_count(), 1u);
  EXPECT_EQ(reply.session_count(), 1u);
  EXPECT_EQ(reply.pid(), ::getpid());
  EXPECT_EQ(reply.metrics_address(), "127.0.0.1:9400");
  EXPECT_FALSE(reply.version().empty());
}

}  // namespace
}  // namespace rmmd::wire
