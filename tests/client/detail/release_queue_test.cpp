// release_queue: what a CUDA host function's call becomes, whether the
// socket is free, taken, or the session gone (no daemon, no CUDA).

#include "client/detail/release_queue.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace rmmd::detail {
namespace {

class fake_sender : public release_sender {
 public:
  bool busy{false};
  std::vector<queued_call> sent;

  bool try_send_now(std::vector<queued_call>& calls) noexcept override
  {
    if (busy) { return false; }
    sent.insert(sent.end(), calls.begin(), calls.end());
    calls.clear();
    return true;
  }
};

TEST(ReleaseQueue, AFreeSocketSendsAtOnce)
{
  release_queue q;
  fake_sender s;
  q.sender = &s;
  q.send_when_reached({.what = queued_call::kind::free, .id = 1});
  ASSERT_EQ(s.sent.size(), 1u);
  EXPECT_EQ(s.sent[0].id, 1u);
  EXPECT_TRUE(q.take().empty());
}

TEST(ReleaseQueue, ATakenSocketLeavesTheCallsToItsHolderInOrder)
{
  release_queue q;
  fake_sender s;
  s.busy   = true;
  q.sender = &s;
  q.send_when_reached({.what = queued_call::kind::free, .id = 1});
  q.send_when_reached({.what = queued_call::kind::close_buffer, .id = 2});
  EXPECT_TRUE(s.sent.empty());
  auto calls = q.take();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].id, 1u);
  EXPECT_EQ(calls[1].what, queued_call::kind::close_buffer);
  EXPECT_TRUE(q.take().empty());
}

TEST(ReleaseQueue, CallsAfterTheSessionIsGoneAreDropped)
{
  release_queue q;
  q.send_when_reached({.what = queued_call::kind::publish_buffer, .id = 3});
  EXPECT_TRUE(q.take().empty());
  EXPECT_STREQ(queued_what(queued_call::kind::drop_block), "dropping packed block");
}

}  // namespace
}  // namespace rmmd::detail
