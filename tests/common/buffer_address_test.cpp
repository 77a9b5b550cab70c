// NAME and NODE:NAME as the client library reads them before it asks
// (common/buffer_address.hpp): what is refused, with which words.

#include "common/buffer_address.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace rmmd::names {
namespace {

using ::testing::HasSubstr;

struct parsed {
  std::optional<buffer_address> address;
  std::string problem;
};

parsed parse(std::string_view address, std::string_view peer = {})
{
  parsed out;
  out.address = parse_buffer_address(address, peer, &out.problem);
  return out;
}

TEST(BufferAddress, ANameWithoutANodeIsThisNodes)
{
  auto p = parse("team/model/w0");
  ASSERT_TRUE(p.address) << p.problem;
  EXPECT_EQ(p.address->node, "");
  EXPECT_EQ(p.address->name, "team/model/w0");
}

TEST(BufferAddress, NodeColonNameSplitsAtTheColon)
{
  auto p = parse("nodeA:models/llama");
  ASSERT_TRUE(p.address) << p.problem;
  EXPECT_EQ(p.address->node, "nodeA");
  EXPECT_EQ(p.address->name, "models/llama");
  // Host names as node names.
  auto h = parse("gpu-07.rack_3.example:w");
  ASSERT_TRUE(h.address) << h.problem;
  EXPECT_EQ(h.address->node, "gpu-07.rack_3.example");
}

TEST(BufferAddress, ThePeerOptionNamesTheNodeToo)
{
  auto p = parse("models/llama", "nodeA");
  ASSERT_TRUE(p.address) << p.problem;
  EXPECT_EQ(p.address->node, "nodeA");
  EXPECT_EQ(p.address->name, "models/llama");
  auto same = parse("nodeA:models/llama", "nodeA");
  ASSERT_TRUE(same.address) << same.problem;
  EXPECT_EQ(same.address->node, "nodeA");
}

TEST(BufferAddress, AColonTwiceIsRefused)
{
  auto p = parse("nodeA:models:llama");
  EXPECT_FALSE(p.address);
  EXPECT_EQ(p.problem, "it has ':' twice; a buffer of another node is NODE:NAME, with one ':'");
  EXPECT_FALSE(parse("a::b").address);
}

TEST(BufferAddress, AnEmptyNodeIsRefused)
{
  auto p = parse(":models/llama");
  EXPECT_FALSE(p.address);
  EXPECT_EQ(p.problem,
            "the node before ':' is empty; write NODE:NAME, or NAME for a buffer of this node");
}

TEST(BufferAddress, AnInvalidNodeIsRefusedSayingWhichByte)
{
  auto p = parse("node/A:w");
  EXPECT_FALSE(p.address);
  EXPECT_EQ(p.problem,
            "byte 4 of the node name (0x2f) is not allowed; a node name is 1 to 253 bytes of "
            "A-Z a-z 0-9 . _ - (a host name will do)");
  auto space = parse("node A:w");
  EXPECT_THAT(space.problem, HasSubstr("byte 4 of the node name (0x20)"));
  auto longer = parse(std::string(254, 'n') + ":w");
  EXPECT_THAT(longer.problem, HasSubstr("the node name has 254 bytes"));
  auto peer = parse("w", "bad node");
  EXPECT_FALSE(peer.address);
  EXPECT_THAT(peer.problem, HasSubstr("byte 3 of the node name (0x20)"));
}

TEST(BufferAddress, AnInvalidNameAfterTheNodeIsRefusedByTheNameRule)
{
  auto empty = parse("nodeA:");
  EXPECT_FALSE(empty.address);
  EXPECT_THAT(empty.problem, HasSubstr("the name is empty"));
  auto dots = parse("nodeA:a/../b");
  EXPECT_THAT(dots.problem, HasSubstr("the name contains \"..\""));
}

TEST(BufferAddress, ANodeThatDiffersFromThePeerOptionIsRefused)
{
  auto p = parse("nodeA:w", "nodeB");
  EXPECT_FALSE(p.address);
  EXPECT_EQ(p.problem, "it names node 'nodeA' and the peer option names node 'nodeB'");
}

}  // namespace
}  // namespace rmmd::names
