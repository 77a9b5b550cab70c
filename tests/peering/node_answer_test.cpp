// What this node's daemon answers its client when another node's daemon
// refused an open or could not be reached (peering::open over node_answer):
// the node named once, and the unreachable ones marked for the client.

#include "daemon/peering/node_answer.hpp"
#include "daemon/wire/status_mapping.hpp"
#include "rmmd/v1/errors.pb.h"

#include <gtest/gtest.h>

#include <string>

namespace rmmd::peering {
namespace {

TEST(NodeAnswer, ARefusalNamesTheNodeOnceAsTheOneThatRefused)
{
  auto const said = node_answer(
      absl::PermissionDeniedError("peer 'nodeA': peer 'CN=rmmd-nodeB' may not open buffer "
                                  "'private/w' (no grant in peering.grants names it)"),
      "nodeA");
  EXPECT_EQ(said.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(said.message(),
            "node 'nodeA' refused: peer 'CN=rmmd-nodeB' may not open buffer 'private/w' (no "
            "grant in peering.grants names it)");
  EXPECT_EQ(wire::unreachable_node(said), "");
  auto const wire = wire::to_grpc_status(said);
  EXPECT_EQ(wire.error_details(), "");  // nothing more than code and message
}

TEST(NodeAnswer, AnUnreachableNodeIsMarkedAndPointsAtRmmctlPeers)
{
  // As peer_link::open refuses while its link is not up...
  auto said = node_answer(
      absl::UnavailableError("peer 'nodeX' at 127.0.0.1:9 is unreachable: cannot reach it; try "
                             "again once `rmmctl peers` shows it ready"),
      "nodeX");
  EXPECT_EQ(said.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(said.message(),
            "node 'nodeX' cannot be reached from this node's rmmd: its daemon at 127.0.0.1:9 is "
            "unreachable: cannot reach it; try again once `rmmctl peers` shows it ready");
  EXPECT_EQ(wire::unreachable_node(said), "nodeX");
  // ... and as its call fails (gRPC's words).
  said = node_answer(absl::UnavailableError("peer 'nodeX': failed to connect to all addresses"),
                     "nodeX");
  EXPECT_EQ(said.message(),
            "node 'nodeX' cannot be reached from this node's rmmd (see `rmmctl peers`): failed to "
            "connect to all addresses");
  said = node_answer(absl::DeadlineExceededError("peer 'nodeX': Deadline Exceeded"), "nodeX");
  EXPECT_EQ(said.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(said.message(),
            "node 'nodeX' did not answer this node's rmmd in time (see `rmmctl peers`): Deadline "
            "Exceeded");
  EXPECT_EQ(wire::unreachable_node(said), "nodeX");
}

TEST(NodeAnswer, TheMarkTravelsAsErrorDetailsLaidOutAsGoogleRpcStatus)
{
  auto const wire = wire::to_grpc_status(
      node_answer(absl::UnavailableError("peer 'nodeX': connection refused"), "nodeX"));
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::UNAVAILABLE);
  v1::ErrorDetails details;
  ASSERT_TRUE(details.ParseFromString(wire.error_details()));
  EXPECT_EQ(details.unreachable_node(), "nodeX");
  EXPECT_EQ(details.code(), static_cast<int>(grpc::StatusCode::UNAVAILABLE));
  EXPECT_EQ(details.message(), wire.error_message());
}

TEST(NodeAnswer, WhoeverAnsweredForTheNodeIsNotSaidToRefuse)
{
  auto const said =
      node_answer(absl::UnauthenticatedError("peer 'nodeA': it presented CN=rmmd-nodeC"), "nodeA");
  EXPECT_EQ(said.message(), "node 'nodeA': it presented CN=rmmd-nodeC");
  EXPECT_EQ(wire::unreachable_node(said), "");
}

}  // namespace
}  // namespace rmmd::peering
