// The session socket's answers, through the functions the listener calls for
// each datagram, into a real core with a host pool: every call that succeeds
// is answered with its own reply (never an empty one), and only the calls
// that may ask for it (Free, PublishBuffer, CloseBuffer, BlocksDropped) go
// unanswered when they succeed with reply_only_on_error.

#include "daemon/session/session_protocol.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/metrics/request_metrics.hpp"
#include "daemon/wire/calls.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/tools/host_core_fixture.hpp"

#include <gmock/gmock.h>
#include <grpcpp/support/status.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <optional>
#include <string>

namespace rmmd::session_socket {
namespace {

void add_label(google::protobuf::RepeatedPtrField<v1::Label>* labels,
               std::string const& key,
               std::string const& value)
{
  auto* label = labels->Add();
  label->set_key(key);
  label->set_value(value);
}

constexpr std::size_t max_call_bytes = 4096;

class SessionProtocol : public test::host_core_fixture {
 protected:
  SessionProtocol() : host_core_fixture("session-protocol") {}

  /// Sends `call` (with `tag`); the parsed reply, or nullopt if none came.
  std::optional<v1::SessionReply> send(v1::SessionCall call,
                                       std::uint64_t tag,
                                       metrics::request_metrics* calls = nullptr)
  {
    call.set_tag(tag);
    auto const bytes = call.SerializeAsString();
    auto answer      = handle_call(*core_,
                              session_,
                              {.bytes = std::span(bytes.data(), bytes.size()), .truncated = false},
                              max_call_bytes,
                              calls);
    if (!answer) { return std::nullopt; }
    v1::SessionReply reply;
    EXPECT_TRUE(reply.ParseFromString(*answer));
    EXPECT_EQ(reply.tag(), tag);
    return reply;
  }
};

TEST_F(SessionProtocol, EveryCallThatSucceedsIsAnsweredWithItsOwnReply)
{
  v1::SessionCall c;
  c.mutable_allocate()->set_size(4096);
  auto r = send(c, 1);
  ASSERT_TRUE(r && r->has_allocate() && !r->has_error());
  auto const lease = r->allocate().allocation_id();

  c.Clear();
  c.mutable_free()->set_allocation_id(lease);
  r = send(c, 2);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reply_case(), v1::SessionReply::kFree);

  c.Clear();
  c.mutable_ping();
  r = send(c, 3);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reply_case(), v1::SessionReply::kPing);

  // A host pool packs nothing, so this session holds no block: dropping none
  // succeeds, and is answered with its own reply, not an empty one.
  c.Clear();
  c.mutable_blocks_dropped();
  r = send(c, 4);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->has_error());
  EXPECT_EQ(r->reply_case(), v1::SessionReply::kBlocksDropped);

  c.Clear();
  c.mutable_create_buffer()->set_name("team/a");
  c.mutable_create_buffer()->set_size(4096);
  r = send(c, 5);
  ASSERT_TRUE(r && r->has_create_buffer()) << (r ? r->DebugString() : "no reply");
  auto const buffer = r->create_buffer().buffer_id();

  c.Clear();
  c.mutable_publish_buffer()->set_buffer_id(buffer);
  r = send(c, 6);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reply_case(), v1::SessionReply::kPublishBuffer);

  c.Clear();
  c.mutable_open_buffer()->set_name("team/a");
  r = send(c, 7);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reply_case(), v1::SessionReply::kOpenBuffer);

  c.Clear();
  c.mutable_close_buffer()->set_buffer_id(r->open_buffer().buffer_id());
  r = send(c, 8);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reply_case(), v1::SessionReply::kCloseBuffer);
}

TEST_F(SessionProtocol, OnlyTheQuietCallsGoUnansweredAndOnlyWhenTheySucceed)
{
  v1::SessionCall c;
  c.set_reply_only_on_error(true);
  c.mutable_blocks_dropped();
  EXPECT_FALSE(send(c, 1)) << "a quiet BlocksDropped that succeeded was answered";

  c.mutable_blocks_dropped()->add_block_ids(77);  // never leased
  auto r = send(c, 2);
  ASSERT_TRUE(r) << "a quiet BlocksDropped that failed went unanswered";
  EXPECT_TRUE(r->has_error());
  EXPECT_EQ(r->error().code(), static_cast<int>(absl::StatusCode::kNotFound));
  EXPECT_EQ(r->reply_case(), v1::SessionReply::REPLY_NOT_SET);

  // Ping and Allocate carry something: reply_only_on_error does not silence
  // them.
  c.mutable_ping();
  r = send(c, 3);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reply_case(), v1::SessionReply::kPing);
  c.mutable_allocate()->set_size(4096);
  r = send(c, 4);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->reply_case(), v1::SessionReply::kAllocate);
}

TEST_F(SessionProtocol, BlocksDroppedIsCountedApartFromFree)
{
  metrics::request_metrics calls(wire::call_names(wire::transport::session_socket));
  v1::SessionCall c;
  c.mutable_blocks_dropped();
  ASSERT_TRUE(send(c, 1, &calls));
  c.mutable_blocks_dropped()->add_block_ids(77);  // never leased: NOT_FOUND
  ASSERT_TRUE(send(c, 2, &calls));

  auto const s        = calls.snapshot();
  auto const* dropped = s.find("BlocksDropped");
  auto const* freed   = s.find("Free");
  ASSERT_TRUE(dropped != nullptr && freed != nullptr);
  EXPECT_EQ(dropped->calls[0], 1u);
  auto const not_found = static_cast<std::size_t>(absl::StatusCode::kNotFound);
  EXPECT_EQ(dropped->calls[not_found], 1u);
  EXPECT_EQ(freed->calls[0] + freed->calls[not_found], 0u)
      << "a BlocksDropped was counted as a Free";
}

TEST_F(SessionProtocol, AFreeNamingAnInterprocessEventIsRefusedAndFreesNothing)
{
  v1::SessionCall c;
  c.mutable_allocate()->set_size(4096);
  auto r = send(c, 1);
  ASSERT_TRUE(r && r->has_allocate());
  auto const lease = r->allocate().allocation_id();
  auto const held  = core_->pools().stats().pools.at(0).allocation_count;

  c.Clear();
  c.set_reply_only_on_error(true);  // a refusal is answered all the same
  c.mutable_free()->set_allocation_id(lease);
  c.mutable_free()->set_removed_release_event(std::string(64, 'e'));
  r = send(c, 2);
  ASSERT_TRUE(r) << "a refused Free went unanswered";
  EXPECT_EQ(r->error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_THAT(r->error().message(), ::testing::HasSubstr("no longer supported"));
  EXPECT_EQ(r->reply_case(), v1::SessionReply::REPLY_NOT_SET);
  EXPECT_EQ(core_->pools().stats().pools.at(0).allocation_count, held) << "the refused Free freed";

  c.mutable_free()->clear_removed_release_event();
  r = send(c, 3);
  EXPECT_FALSE(r) << "the lease was not there to free: " << (r ? r->DebugString() : "");
}

TEST_F(SessionProtocol, ErrorsCarryTheWireCodeAndNoPayload)
{
  v1::SessionCall c;
  c.mutable_allocate()->set_size(4096);
  c.mutable_allocate()->set_pool_id(99);  // no such pool
  auto r = send(c, 1);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(r->reply_case(), v1::SessionReply::REPLY_NOT_SET);

  c.Clear();  // names no call
  r = send(c, 2);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error().code(), static_cast<int>(grpc::StatusCode::UNIMPLEMENTED));
  EXPECT_THAT(r->error().message(),
              ::testing::HasSubstr("(allocate, free, ping, create_buffer, publish_buffer, "
                                   "open_buffer, close_buffer, buffer_fd, blocks_dropped, "
                                   "stable_fds)"));
}

// Another node's buffer is opened over gRPC (which may wait for the peer),
// never here: such an open is refused, not served from this node.
TEST_F(SessionProtocol, AnOpenOfAnotherNodesBufferIsRefused)
{
  v1::SessionCall c;
  c.mutable_create_buffer()->set_name("team/p");
  c.mutable_create_buffer()->set_size(4096);
  auto r = send(c, 1);
  ASSERT_TRUE(r && r->has_create_buffer());
  c.Clear();
  c.mutable_publish_buffer()->set_buffer_id(r->create_buffer().buffer_id());
  ASSERT_TRUE(send(c, 2));

  c.Clear();
  c.mutable_open_buffer()->set_name("team/p");
  c.mutable_open_buffer()->set_peer("node-b");
  r = send(c, 3);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_EQ(r->reply_case(), v1::SessionReply::REPLY_NOT_SET);
}

// A manifest never travels in a datagram: an open of a buffer that has one
// says manifest_follows. Access and the fingerprint guard work here as on
// gRPC, and a refused open holds nothing.
TEST_F(SessionProtocol, OpenSaysTheManifestFollowsAndKeepsTheGuardAndTheAccessRules)
{
  v1::SessionCall c;
  c.mutable_create_buffer()->set_name("team/m");
  c.mutable_create_buffer()->set_size(4096);
  auto r = send(c, 1);
  ASSERT_TRUE(r && r->has_create_buffer()) << (r ? r->DebugString() : "no reply");
  auto const id = r->create_buffer().buffer_id();
  EXPECT_EQ(r->create_buffer().access(), v1::BUFFER_ACCESS_READ_WRITE);
  EXPECT_FALSE(r->create_buffer().manifest_follows());  // a host pool: no labels yet

  core::buffer_manifest m;
  m.tensors = {core::tensor_entry{.name = "w", .dtype = 10, .shape = {16}, .byte_offset = 0}};
  m.labels  = {{"model", "gpt"}};
  ASSERT_TRUE(core_->buffers().set_buffer_manifest(session_, id, m).ok());
  ASSERT_TRUE(core_->buffers().publish_buffer(session_, id).ok());

  auto const holders = [&] {
    return core_->buffers().describe_buffer(session_, "team/m")->info.holders;
  };
  c.Clear();
  auto* open = c.mutable_open_buffer();
  open->set_name("team/m");
  add_label(open->mutable_expect_labels(), "model", "llama");
  r = send(c, 2);
  ASSERT_TRUE(r && r->has_error());
  EXPECT_EQ(r->error().code(), static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
  EXPECT_EQ(r->error().message(), "buffer 'team/m': label 'model' is 'gpt', expected 'llama'");
  EXPECT_EQ(holders(), 1u);

  open->mutable_expect_labels(0)->set_value("gpt");
  r = send(c, 3);
  ASSERT_TRUE(r && r->has_open_buffer()) << r->DebugString();
  EXPECT_TRUE(r->open_buffer().manifest_follows());
  EXPECT_FALSE(r->open_buffer().has_manifest());
  EXPECT_EQ(r->open_buffer().access(), v1::BUFFER_ACCESS_READ);
  EXPECT_EQ(holders(), 1u);  // the same session: one holder, two opens
  // Its creator may open it read-write.
  open->set_access(v1::BUFFER_ACCESS_READ_WRITE);
  r = send(c, 4);
  ASSERT_TRUE(r && r->has_open_buffer()) << r->DebugString();
  EXPECT_EQ(r->open_buffer().access(), v1::BUFFER_ACCESS_READ_WRITE);
  // An access the protocol does not define.
  open->set_access(static_cast<v1::BufferAccess>(7));
  r = send(c, 5);
  ASSERT_TRUE(r && r->has_error());
  EXPECT_EQ(r->error().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
}

}  // namespace
}  // namespace rmmd::session_socket
