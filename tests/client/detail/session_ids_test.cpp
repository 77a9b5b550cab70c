// session_ids: the translation of ids between a session and the daemon of
// now, across generations (no daemon: the gRPC channels never connect).

#include "client/detail/session_ids.hpp"

#include <gtest/gtest.h>

#include <string>

namespace rmmd::detail {
namespace {

v1::SessionWelcome welcome(std::string const& token,
                           std::uint64_t session_id,
                           std::vector<std::pair<std::string, std::uint32_t>> const& pools)
{
  v1::SessionWelcome w;
  w.set_token(token);
  w.set_session_id(session_id);
  w.set_session_calls(true);
  for (auto const& [name, id] : pools) {
    auto* p = w.add_pools();
    p->set_name(name);
    p->set_id(id);
  }
  return w;
}

class SessionIds : public ::testing::Test {
 protected:
  session::options options_{.runtime_dir = "/nonexistent-rmmd-dir",
                            .reconnect   = std::chrono::seconds(1)};
  session_ids ids_{options_, welcome("\x01\x02", 7, {{"host", 0}, {"gpu0", 1}})};

  /// A second daemon that numbers the pools the other way round.
  void reconnect()
  {
    auto w = welcome("\x03", 8, {{"gpu0", 0}, {"host", 1}, {"new", 2}});
    ids_.adopt(w, 1, ids_.match_pools(w));
  }
};

TEST_F(SessionIds, TheFirstDaemonsIdsAreTheSessions)
{
  EXPECT_EQ(ids_.generation(), 0u);
  EXPECT_EQ(ids_.session_id(), 7u);
  EXPECT_EQ(ids_.token_hex(), "0102");
  EXPECT_TRUE(ids_.session_calls());
  EXPECT_EQ(ids_.daemon_pool(1), 1u);
  v1::SessionCall call;
  call.mutable_allocate()->set_pool_id(1);
  EXPECT_FALSE(ids_.to_daemon(call, 0).has_value());
  EXPECT_EQ(call.allocate().pool_id(), 1u);
  v1::SessionReply reply;
  reply.mutable_allocate()->set_allocation_id(5);
  ASSERT_TRUE(ids_.from_daemon(reply, 0).ok());
  EXPECT_EQ(reply.allocate().allocation_id(), 5u);
}

TEST_F(SessionIds, AfterAReconnectPoolsMatchByNameAndIdsCarryTheGeneration)
{
  reconnect();
  EXPECT_EQ(ids_.generation(), 1u);
  EXPECT_EQ(ids_.session_id(), 8u);
  EXPECT_EQ(ids_.token_hex(), "03");
  EXPECT_EQ(ids_.daemon_pool(0), 1u);
  EXPECT_EQ(ids_.daemon_pool(1), 0u);
  EXPECT_EQ(ids_.session_pool(1), 0u);
  EXPECT_EQ(ids_.session_pool(2), std::nullopt) << "a pool the first daemon did not serve";

  v1::SessionCall free_old;
  free_old.mutable_free()->set_allocation_id(5);  // generation 0's
  auto answered = ids_.to_daemon(free_old, 1);
  ASSERT_TRUE(answered.has_value()) << "the new daemon never lent it";
  EXPECT_TRUE(answered->ok());

  v1::SessionReply reply;
  reply.mutable_allocate()->set_allocation_id(9);
  ASSERT_TRUE(ids_.from_daemon(reply, 1).ok());
  EXPECT_EQ(reply.allocate().allocation_id(), client_id(9, 1));
  EXPECT_EQ(generation_of(reply.allocate().allocation_id()), 1u);

  v1::SessionCall free_new;
  free_new.mutable_free()->set_allocation_id(client_id(9, 1));
  EXPECT_FALSE(ids_.to_daemon(free_new, 1).has_value());
  EXPECT_EQ(free_new.free().allocation_id(), 9u);
}

TEST_F(SessionIds, APoolTheNewDaemonDoesNotServeIsRefusedBeforeAnyRequest)
{
  auto w = welcome("\x04", 9, {{"host", 0}});
  ids_.adopt(w, 1, ids_.match_pools(w));
  v1::SessionCall call;
  call.mutable_allocate()->set_pool_id(1);  // gpu0
  auto answered = ids_.to_daemon(call, 1);
  ASSERT_TRUE(answered.has_value());
  EXPECT_EQ(answered->error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(SessionIds, ABufferHeldAgainTakesItsNewId)
{
  v1::SessionCall open;
  open.mutable_open_buffer()->set_name("team/w");
  v1::SessionReply granted;
  granted.mutable_open_buffer()->set_buffer_id(3);
  ids_.note_holds(open, granted);
  reconnect();
  auto held = ids_.take_held();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held.at(3).name, "team/w");
  session_ids::held_map now{{client_id(4, 1), held.at(3)}};
  ids_.held_again({{3, client_id(4, 1)}}, std::move(now));
  EXPECT_EQ(ids_.daemon_buffer(3), 4u);
  v1::SessionCall close;
  close.mutable_close_buffer()->set_buffer_id(3);
  EXPECT_FALSE(ids_.to_daemon(close, 1).has_value());
  EXPECT_EQ(close.close_buffer().buffer_id(), 4u);
  // A buffer the new daemon does not hold: its close asks nothing.
  v1::SessionCall other;
  other.mutable_close_buffer()->set_buffer_id(6);
  auto answered = ids_.to_daemon(other, 1);
  ASSERT_TRUE(answered.has_value());
  EXPECT_TRUE(answered->ok());
}

TEST_F(SessionIds, StableFdsOfAnEarlierDaemonsAllocationsAreRefusedWithoutAsking)
{
  reconnect();
  v1::SessionCall now;
  now.mutable_stable_fds()->add_allocation_ids(client_id(3, 1));
  EXPECT_FALSE(ids_.to_daemon(now, 1).has_value());
  EXPECT_EQ(now.stable_fds().allocation_ids(0), 3u);  // as the daemon of now knows it

  v1::SessionCall old;
  old.mutable_stable_fds()->add_allocation_ids(client_id(4, 1));
  old.mutable_stable_fds()->add_allocation_ids(3);  // generation 0's allocation 3
  auto answered = ids_.to_daemon(old, 1);
  ASSERT_TRUE(answered.has_value());
  EXPECT_EQ(answered->error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(answered->error_message().find("restore(name)"), std::string::npos);
}

TEST_F(SessionIds, AContextIsMadeOnlyForTheGenerationOfNow)
{
  EXPECT_NE(ids_.target(0).context, nullptr);
  reconnect();
  auto past = ids_.target(0);
  EXPECT_EQ(past.context, nullptr);
  EXPECT_NE(past.stub, nullptr);
  EXPECT_NE(ids_.target(1).context, nullptr);
}

TEST_F(SessionIds, ReconnectsNotYetToldAreTakenOnce)
{
  EXPECT_FALSE(ids_.has_untold());
  ids_.note_untold(reconnect_info{.reconnects = 1}, 0);
  EXPECT_TRUE(ids_.has_untold());
  EXPECT_EQ(ids_.take_untold().size(), 1u);
  EXPECT_FALSE(ids_.has_untold());
}

}  // namespace
}  // namespace rmmd::detail
