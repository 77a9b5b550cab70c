// The asking node's link when the peer's daemon has started again: the
// peer refuses a client's call until this node says Hello, and the link
// says Hello on the client's thread. When that Hello fails (the new daemon
// is still coming up, or is killed again), the client is told the peer
// cannot be reached, as for any peer that is down, not the peer's stale
// "call Hello first", which asks for something a client cannot do.
//
// The peer here is a scripted RmmdPeer service on 127.0.0.1, plaintext: the
// layer under test is peer_link; two real daemons are the integration
// tests' and the chaos soak's.

#include "daemon/peering/peer_link.hpp"
#include "daemon/wire/status_mapping.hpp"

#include <absl/status/status.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace rmmd::peering {
namespace {

using namespace std::chrono_literals;

/// A peer whose daemon "started again" after its first Hello: every
/// ListRemoteBuffers asks for a Hello, and every later Hello gets
/// `later_hello` (OK: welcomed, and still asked again).
class restarted_peer final : public v1::RmmdPeer::Service {
 public:
  explicit restarted_peer(grpc::Status later_hello) : later_hello_(std::move(later_hello)) {}

  grpc::Status Hello(grpc::ServerContext*, v1::PeerHello const*, v1::PeerWelcome* welcome) override
  {
    if (hellos_.fetch_add(1) > 0 && !later_hello_.ok()) { return later_hello_; }
    welcome->set_node_name("nodeA");
    welcome->set_incarnation(7);
    welcome->mutable_probe()->set_problem("this node has no CUDA pool with fabric handles");
    return grpc::Status::OK;
  }

  grpc::Status ListRemoteBuffers(grpc::ServerContext*,
                                 v1::ListRemoteBuffersRequest const*,
                                 v1::ListRemoteBuffersResponse*) override
  {
    lists_.fetch_add(1);
    return wire::to_grpc_status(wire::mark_hello_needed(absl::FailedPreconditionError(
        "list buffers from another node: peer '(plaintext)' has not said Hello; call Hello "
        "first")));
  }

  [[nodiscard]] int hellos() const noexcept
  {
    return hellos_.load();
  }
  [[nodiscard]] int lists() const noexcept
  {
    return lists_.load();
  }

 private:
  grpc::Status later_hello_;
  std::atomic<int> hellos_{0};
  std::atomic<int> lists_{0};
};

struct scripted_peer {
  explicit scripted_peer(grpc::Status later_hello) : service(std::move(later_hello))
  {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~scripted_peer()
  {
    server->Shutdown();
  }
  scripted_peer(scripted_peer const&)            = delete;
  scripted_peer& operator=(scripted_peer const&) = delete;

  restarted_peer service;
  int port{};
  std::unique_ptr<grpc::Server> server;
};

/// A started link to `peer`, once its first Hello is answered.
std::unique_ptr<peer_link> link_to(scripted_peer const& peer, probe_exchange const& probes)
{
  auto link = std::make_unique<peer_link>(
      config::peer_node_settings{.name    = "nodeA",
                                 .address = "127.0.0.1:" + std::to_string(peer.port)},
      link_options{.node_name      = "nodeB",
                   .incarnation    = 42,
                   .probes         = &probes,
                   .credentials    = grpc::InsecureChannelCredentials(),
                   .keepalive      = 10s,
                   .renew_interval = 1h});
  link->start();
  auto const until = std::chrono::steady_clock::now() + 10s;
  while (link->view().state == link_state::connecting && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  return link;
}

TEST(PeerLink, AHelloThatFailsAfterThePeerRestartedIsUnavailableWithItsReason)
{
  scripted_peer peer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "its listener is starting"));
  auto const probes = no_fabric_probe();
  auto link         = link_to(peer, probes);
  ASSERT_EQ(link->view().state, link_state::probe_failed) << link->view().problem;

  auto const listed = link->list({});
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kUnavailable) << listed.status();
  EXPECT_EQ(listed.status().message(),
            "peer 'nodeA' at 127.0.0.1:" + std::to_string(peer.port) +
                " started again and our Hello failed: cannot reach it (its listener is "
                "starting): is its rmmd running with peering.listen_address there, and do both "
                "certificates chain to the other's trusted CA?; try again once `rmmctl peers` "
                "shows it ready");
  EXPECT_EQ(peer.service.lists(), 1);
  EXPECT_EQ(link->view().state, link_state::unreachable);
  // The link's thread says Hello again now, not at its next renewal (an
  // hour here): the caller's next try finds the link as soon as the peer
  // answers.
  auto const hellos_after = peer.service.hellos();
  auto const until        = std::chrono::steady_clock::now() + 5s;
  while (peer.service.hellos() == hellos_after && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_GT(peer.service.hellos(), hellos_after) << "the link's thread waits for its renewal";
}

TEST(PeerLink, APeerThatKeepsAskingForHelloIsUnavailableAfterTwoHellos)
{
  scripted_peer peer(grpc::Status::OK);
  auto const probes = no_fabric_probe();
  auto link         = link_to(peer, probes);
  ASSERT_EQ(link->view().state, link_state::probe_failed) << link->view().problem;
  auto const hellos_before = peer.service.hellos();

  auto const listed = link->list({});
  ASSERT_FALSE(listed.ok());
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kUnavailable) << listed.status();
  EXPECT_EQ(listed.status().message(),
            "peer 'nodeA' at 127.0.0.1:" + std::to_string(peer.port) +
                " started again and our Hello did not take (it asked again); try again once "
                "`rmmctl peers` shows it ready");
  // The call, then a Hello and the call again, twice: bounded, not a loop.
  // Its answer also tells the link's thread to say Hello at once, which may
  // land before the count is read: one more, from that thread.
  EXPECT_EQ(peer.service.lists(), 3);
  auto const hellos = peer.service.hellos() - hellos_before;
  EXPECT_GE(hellos, 2);
  EXPECT_LE(hellos, 3) << "more Hellos than the call's two and the link thread's one";
}

}  // namespace
}  // namespace rmmd::peering
