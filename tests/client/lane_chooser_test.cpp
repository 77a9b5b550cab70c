// client/lane_chooser: which carving lane serves each thread, with real
// threads (alive together, so that each has a key of its own).

#include "client/lane_chooser.hpp"

#include <gtest/gtest.h>

#include <barrier>
#include <cstddef>
#include <set>
#include <thread>
#include <vector>

namespace rmmd::detail {
namespace {

/// Runs `steps` on each of `threads` threads, all alive until all are done;
/// step k of every thread runs after step k-1 of thread `threads`-1 (the
/// threads take turns, in order, one step each).
template <typename Step>
void in_turn(std::size_t threads, std::size_t steps, Step step)
{
  std::barrier turn(static_cast<std::ptrdiff_t>(threads));
  std::vector<std::jthread> crew;
  for (std::size_t t = 0; t < threads; ++t) {
    crew.emplace_back([&, t] {
      for (std::size_t k = 0; k < steps; ++k) {
        for (std::size_t who = 0; who < threads; ++who) {
          if (who == t) { step(t, k); }
          turn.arrive_and_wait();
        }
      }
    });
  }
}

TEST(LaneChooser, OneThreadCarvesAloneInTheFirstLane)
{
  lane_chooser lanes(8, false);
  EXPECT_TRUE(lanes.single());
  EXPECT_EQ(lanes.threads_seen(), 0u);
  for (int i = 0; i < 100; ++i) { EXPECT_EQ(lanes.pick(), 0u); }
  EXPECT_TRUE(lanes.single());
  EXPECT_EQ(lanes.threads_seen(), 1u);
  EXPECT_EQ(lanes.hint(), 0u);
}

TEST(LaneChooser, ASecondThreadSpreadsTheLanesAndTheFirstKeepsLaneZero)
{
  lane_chooser lanes(8, false);
  std::vector<std::size_t> got(3);
  std::vector<bool> single_before(3);
  in_turn(3, 2, [&](std::size_t t, std::size_t k) {
    if (k == 0) {
      single_before[t] = lanes.single();
      got[t]           = lanes.pick();
    } else {
      EXPECT_EQ(lanes.pick(), got[t]) << "thread " << t << " keeps its lane";
      EXPECT_EQ(lanes.hint(), got[t]) << "thread " << t;
    }
  });
  EXPECT_TRUE(single_before[0]);
  EXPECT_TRUE(single_before[1]) << "one lane until the second thread picks";
  EXPECT_FALSE(single_before[2]);
  EXPECT_EQ(got[0], 0u);
  EXPECT_EQ(got[1], 1u);
  EXPECT_EQ(got[2], 2u);
  EXPECT_FALSE(lanes.single());
  EXPECT_EQ(lanes.threads_seen(), 3u);
}

TEST(LaneChooser, ThreadsBeyondTheBoundShareLanes)
{
  lane_chooser lanes(3, false);
  std::vector<std::size_t> got(7);
  in_turn(7, 1, [&](std::size_t t, std::size_t) { got[t] = lanes.pick(); });
  EXPECT_EQ(std::set<std::size_t>(got.begin(), got.begin() + 3).size(), 3u)
      << "the first three threads have a lane each";
  for (auto lane : got) { EXPECT_LT(lane, 3u); }
}

TEST(LaneChooser, OneLaneStaysOneWhateverTheThreads)
{
  lane_chooser lanes(1, true);
  std::vector<std::size_t> got(4, 99);
  in_turn(4, 2, [&](std::size_t t, std::size_t) { got[t] = lanes.pick(); });
  for (auto lane : got) { EXPECT_EQ(lane, 0u); }
  EXPECT_TRUE(lanes.single());
}

TEST(LaneChooser, ExplicitLanesArePerThreadFromTheFirstCall)
{
  lane_chooser lanes(4, true);
  EXPECT_FALSE(lanes.single());
  std::vector<std::size_t> got(4);
  in_turn(4, 1, [&](std::size_t t, std::size_t) { got[t] = lanes.pick(); });
  EXPECT_EQ(got, (std::vector<std::size_t>{0, 1, 2, 3}));
}

TEST(LaneChooser, ThreadsStartingAtOnceEachKeepOneLaneInBounds)
{
  constexpr std::size_t threads = 16;
  lane_chooser lanes(6, false);
  std::barrier start(static_cast<std::ptrdiff_t>(threads));
  std::vector<std::size_t> first(threads), again(threads);
  {
    std::vector<std::jthread> crew;
    for (std::size_t t = 0; t < threads; ++t) {
      crew.emplace_back([&, t] {
        start.arrive_and_wait();
        first[t] = lanes.pick();
        for (int i = 0; i < 1000; ++i) {
          if (lanes.pick() != first[t]) { again[t] = 99; }
        }
        start.arrive_and_wait();  // all alive till all have picked
      });
    }
  }
  for (std::size_t t = 0; t < threads; ++t) {
    EXPECT_LT(first[t], 6u) << "thread " << t;
    EXPECT_EQ(again[t], 0u) << "thread " << t << " changed lanes";
  }
  EXPECT_FALSE(lanes.single());
  EXPECT_EQ(lanes.threads_seen(), threads);
}

}  // namespace
}  // namespace rmmd::detail
