// Peering between two real daemons (host backend) on 127.0.0.1, with
// certificates made by openssl for the test: they peer, A refuses what it
// must (another CA's certificate, an expired one, plaintext, an identity
// without a grant) and changes nothing, and B's opens and listings of A's
// buffers get the errors of the contract. What needs GPUs in one NVLink domain (a
// fabric buffer opened and read from the other node) is in tests/gpu.

#include "client/detail/session_access.hpp"
#include "client/detail/session_channel.hpp"
#include "client/detail/session_impl.hpp"
#include "harness/peer_setup.hpp"
#include "rmmd/shared_buffer.hpp"
#include "rmmd/v1/peer.grpc.pb.h"
#include "tests/tools/child_process.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/test_certs.hpp"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace rmmd::test {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
namespace fs = std::filesystem;

class Peering : public certs_suite {
 protected:
  void SetUp() override
  {
    port_a_ = harness::free_loopback_port();
    port_b_ = harness::free_loopback_port();
    write_config("a.conf",
                 "peering { node_name: 'nodeA' listen_address: '127.0.0.1:" +
                     std::to_string(port_a_) + "' " + tls("nodeA") +
                     " grants { identity: 'CN=rmmd-nodeB' name_prefixes: 'models/' }"
                     " peers { name: 'nodeB' address: '127.0.0.1:" +
                     std::to_string(port_b_) +
                     "' identity: 'CN=rmmd-nodeB' tls_server_name: 'localhost' }"
                     " hold_lease_ms: 2000 renew_interval_ms: 500 }");
    write_config("b.conf",
                 "peering { node_name: 'nodeB' listen_address: '127.0.0.1:" +
                     std::to_string(port_b_) + "' " + tls("nodeB") +
                     " peers { name: 'nodeA' address: '127.0.0.1:" + std::to_string(port_a_) +
                     "' identity: 'CN=rmmd-nodeA' tls_server_name: 'localhost' }"
                     " hold_lease_ms: 2000 renew_interval_ms: 500 }");
    a_ = std::make_unique<daemon_process>(
        std::vector<std::string>{"--backend", "host", "--config", (certs_ / "a.conf").string()});
    b_ = std::make_unique<daemon_process>(
        std::vector<std::string>{"--backend", "host", "--config", (certs_ / "b.conf").string()});
  }

  static std::string tls(std::string const& node)
  {
    return "tls { certificate_file: '" + (certs_ / (node + ".pem")).string() +
           "' private_key_file: '" + (certs_ / (node + ".key")).string() + "' trusted_ca_file: '" +
           (certs_ / "ca.pem").string() + "' }";
  }

  void write_config(std::string const& name, std::string const& text)
  {
    std::ofstream(certs_ / name) << text << "\n";
  }

  static v1::ListPeersResponse peers(rmmd::session& s)
  {
    v1::ListPeersResponse reply;
    auto st = rmmd::detail::impl_of(s).stub().ListPeers(
        rmmd::detail::impl_of(s).context().get(), {}, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return reply;
  }

  /// Until `s`'s daemon sees the other both ways (it dialed it and was
  /// dialed) and its link is done dialing: before then ListPeers changes by
  /// itself (a daemon that started first finds the other unreachable).
  static bool settled(rmmd::session& s)
  {
    return eventually(
        [&] {
          auto r = peers(s);
          return r.peers_size() == 1 && r.peers(0).direction() == "both" &&
                 r.peers(0).state() == "probe_failed";
        },
        30s);
  }

  /// A's ledger as ListPeers shows it, for "nothing changed".
  static std::string ledger(rmmd::session& s)
  {
    auto r = peers(s);
    for (auto& p : *r.mutable_peers()) { p.clear_last_contact_unix_ms(); }
    return r.SerializeAsString();
  }

  /// A raw RmmdPeer client of A with `node`'s certificate ("" : plaintext).
  std::unique_ptr<v1::RmmdPeer::Stub> raw_peer(std::string const& node) const
  {
    std::shared_ptr<grpc::ChannelCredentials> creds;
    if (node.empty()) {
      creds = grpc::InsecureChannelCredentials();
    } else {
      grpc::SslCredentialsOptions o;
      o.pem_root_certs  = read_text(certs_ / "ca.pem");
      o.pem_cert_chain  = read_text(certs_ / (node + ".pem"));
      o.pem_private_key = read_text(certs_ / (node + ".key"));
      creds             = grpc::SslCredentials(o);
    }
    grpc::ChannelArguments args;
    args.SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, "localhost");
    return v1::RmmdPeer::NewStub(
        grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(port_a_), creds, args));
  }

  static grpc::Status hello(v1::RmmdPeer::Stub& stub, std::uint64_t incarnation)
  {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::PeerHello h;
    h.set_node_name("intruder");
    h.set_incarnation(incarnation);
    v1::PeerWelcome w;
    return stub.Hello(&c, h, &w);
  }

  int port_a_{};
  int port_b_{};
  std::unique_ptr<daemon_process> a_;
  std::unique_ptr<daemon_process> b_;
};

TEST_F(Peering, BothDaemonsSeeEachOtherWithTheHostBackendsProbeProblem)
{
  auto sa      = a_->open_session("a", call_transport::grpc);
  auto sb      = b_->open_session("b", call_transport::grpc);
  auto settled = [&](rmmd::session& s, std::string const& other) {
    auto r = peers(s);
    for (auto const& p : r.peers()) {
      if (p.node_name() == other && p.state() == "probe_failed" && p.direction() == "both") {
        return true;
      }
    }
    return false;
  };
  ASSERT_TRUE(eventually([&] { return settled(sb, "nodeA"); }, 30s)) << peers(sb).DebugString();
  ASSERT_TRUE(eventually([&] { return settled(sa, "nodeB"); }, 30s)) << peers(sa).DebugString();
  auto const r = peers(sb);
  EXPECT_EQ(r.node_name(), "nodeB");
  ASSERT_EQ(r.peers_size(), 1);
  EXPECT_EQ(r.peers(0).identity(), "CN=rmmd-nodeA");
  EXPECT_THAT(r.peers(0).problem(), HasSubstr("this node has no CUDA pool with fabric handles"));
  EXPECT_FALSE(r.peers(0).probe_ok());
  EXPECT_FALSE(r.peers(0).their_probe_ok());
}

TEST_F(Peering, ARemoteOpenOfAHostPoolBufferNamesThePool)
{
  auto sa = a_->open_session("a", call_transport::grpc);
  auto sb = b_->open_session("b", call_transport::grpc);
  v1::CreateBufferRequest create;
  create.set_name("models/w");
  create.set_pool_id(0);
  create.set_size(4096);
  v1::BufferGrant made;
  ASSERT_TRUE(rmmd::detail::impl_of(sa)
                  .stub()
                  .CreateBuffer(rmmd::detail::impl_of(sa).context().get(), create, &made)
                  .ok());
  v1::PublishBufferRequest publish;
  publish.set_buffer_id(made.buffer_id());
  v1::PublishBufferResponse published;
  ASSERT_TRUE(rmmd::detail::impl_of(sa)
                  .stub()
                  .PublishBuffer(rmmd::detail::impl_of(sa).context().get(), publish, &published)
                  .ok());
  ASSERT_TRUE(eventually(
      [&] {
        auto r = peers(sb);
        return r.peers_size() == 1 && r.peers(0).state() == "probe_failed";
      },
      30s));
  ASSERT_TRUE(settled(sa)) << peers(sa).DebugString();
  auto const before = ledger(sa);
  v1::OpenBufferRequest open;
  open.set_name("models/w");
  open.set_peer("nodeA");
  v1::BufferGrant grant;
  auto st = rmmd::detail::impl_of(sb).stub().OpenBuffer(
      rmmd::detail::impl_of(sb).context().get(), open, &grant);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_THAT(st.error_message(), StartsWith("node 'nodeA' refused: "));
  EXPECT_THAT(st.error_message(), HasSubstr("is in pool 'host', which exports no fabric handles"));
  EXPECT_EQ(detail::unreachable_node(st), "");
  EXPECT_EQ(ledger(sa), before);

  open.set_peer("nodeZ");
  st = rmmd::detail::impl_of(sb).stub().OpenBuffer(
      rmmd::detail::impl_of(sb).context().get(), open, &grant);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(st.error_message(), HasSubstr("no peer 'nodeZ' in peering.peers"));

  // No grant names it for nodeB: A says so.
  open.set_peer("nodeA");
  open.set_name("private/w");
  st = rmmd::detail::impl_of(sb).stub().OpenBuffer(
      rmmd::detail::impl_of(sb).context().get(), open, &grant);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // The node that answered, named once: not "peer 'nodeA': peer 'CN=...'".
  EXPECT_EQ(st.error_message(),
            "node 'nodeA' refused: peer 'CN=rmmd-nodeB' may not open buffer 'private/w' (no "
            "grant in peering.grants names it)");
  // As the client says it (shared_buffer::open throws what throw_status gives).
  try {
    detail::throw_status(st, "open buffer 'nodeA:private/w'");
  } catch (rmmd::permission_error const& e) {
    EXPECT_THAT(e.what(),
                EndsWith("rmmd: open buffer 'nodeA:private/w': node 'nodeA' refused: peer "
                         "'CN=rmmd-nodeB' may not open buffer 'private/w' (no grant in "
                         "peering.grants names it)"));
  }
}

TEST_F(Peering, ANodeNobodyAnswersForIsUnreachableFromThisNodesDaemonAndTheSessionGoesOn)
{
  // Node B's daemon with a peer entry whose port nobody listens on.
  auto const nobody = harness::free_loopback_port();
  write_config("x.conf",
               "peering { node_name: 'nodeB' " + tls("nodeB") +
                   " peers { name: 'nodeX' address: '127.0.0.1:" + std::to_string(nobody) +
                   "' identity: 'CN=rmmd-nodeA' tls_server_name: 'localhost' } }");
  daemon_process b({"--backend", "host", "--config", (certs_ / "x.conf").string()});
  rmmd::session::options o;
  o.runtime_dir = b.runtime_dir();
  o.client_name = "b";
  o.lease_calls = call_transport::grpc;
  o.reconnect   = std::chrono::milliseconds(0);  // below: B gone is B gone, at once
  rmmd::session s(o);
  ASSERT_TRUE(eventually(
      [&] {
        auto r = peers(s);
        return r.peers_size() == 1 && r.peers(0).state() == "unreachable";
      },
      30s))
      << peers(s).DebugString();
  v1::OpenBufferRequest open;
  open.set_name("w");
  open.set_peer("nodeX");
  v1::BufferGrant grant;
  // What shared_buffer::open sends (with a GPU: it maps the answer on one)
  // and how it turns the refusal into an exception.
  auto const st = rmmd::detail::impl_of(s).open_buffer(open, &grant);
  ASSERT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_EQ(detail::unreachable_node(st), "nodeX");
  try {
    detail::throw_status(st, "open buffer 'nodeX:w'");
  } catch (rmmd::session_error const& e) {
    std::string const said = e.what();
    EXPECT_THAT(said,
                HasSubstr("rmmd: open buffer 'nodeX:w': node 'nodeX' cannot be reached from "
                          "this node's rmmd: its daemon at 127.0.0.1:" +
                          std::to_string(nobody) + " is unreachable: "));
    EXPECT_THAT(said, HasSubstr("`rmmctl peers`"));
    EXPECT_THAT(said, Not(HasSubstr("the daemon is gone")));
    EXPECT_THAT(said, Not(HasSubstr("peer 'nodeX'")));
  }
  // The session, and this node's daemon, go on.
  auto made =
      shared_buffer::create(s, "after/w", 4096, shared_buffer_options{.pool = s.host_pool().name});
  made.publish();
  auto again = shared_buffer::open(s, "after/w");
  EXPECT_EQ(again.size(), 4096u);
  again.close();
  made.close();

  // This node's daemon gone: the same call says so, with no node named.
  ASSERT_TRUE(b.stop().has_value());
  auto const gone = rmmd::detail::impl_of(s).open_buffer(open, &grant);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::UNAVAILABLE) << gone.error_message();
  EXPECT_EQ(detail::unreachable_node(gone), "");
  try {
    detail::throw_status(gone, "open buffer 'nodeX:w'");
  } catch (rmmd::session_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("the daemon is gone or not answering"));
  }
}

TEST_F(Peering, AnIdentityWithoutAGrantIsPermissionDenied)
{
  auto sa = a_->open_session("a", call_transport::grpc);
  ASSERT_TRUE(eventually(
      [&] { return peers(sa).peers_size() == 1 && peers(sa).peers(0).direction() == "both"; },
      30s));
  ASSERT_TRUE(settled(sa)) << peers(sa).DebugString();
  auto const before = ledger(sa);
  auto stub         = raw_peer("nodeC");
  // Its certificate is the CA's, but no grant and no peers entry names it:
  // not even Hello is answered, and A records nothing.
  auto refused = hello(*stub, 42);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << refused.error_message();
  EXPECT_THAT(refused.error_message(),
              HasSubstr("peer 'CN=rmmd-nodeC' may not peer with this node: no peering.grants "
                        "entry names its identity"));
  EXPECT_EQ(ledger(sa), before);
  grpc::ClientContext c;
  v1::RemoteOpenRequest r;
  r.set_name("models/w");
  r.set_incarnation(42);
  v1::RemoteGrant g;
  auto st = stub->OpenRemoteBuffer(&c, r, &g);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(st.error_message(), HasSubstr("peer 'CN=rmmd-nodeC' may not open buffer"));
}

TEST_F(Peering, AnotherCAsExpiredAndPlaintextCallersAreRefusedAndChangeNothing)
{
  auto sa = a_->open_session("a", call_transport::grpc);
  ASSERT_TRUE(eventually(
      [&] { return peers(sa).peers_size() == 1 && peers(sa).peers(0).direction() == "both"; },
      30s));
  ASSERT_TRUE(settled(sa)) << peers(sa).DebugString();
  auto const before = ledger(sa);
  for (std::string node : {"stranger", "expired", ""}) {
    auto stub = raw_peer(node);
    auto st   = hello(*stub, 7);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE)
        << (node.empty() ? "plaintext" : node) << ": " << st.error_message();
    EXPECT_EQ(ledger(sa), before) << (node.empty() ? "plaintext" : node);
  }
}

/// Creates and publishes `name` (4 KiB of the host pool) with `labels`;
/// published while the creator holds it.
rmmd::shared_buffer publish_labelled(rmmd::session& s,
                                     std::string const& name,
                                     std::map<std::string, std::string, std::less<>> const& labels)
{
  auto b = rmmd::shared_buffer::create(s, name, 4096, {.pool = s.host_pool().name});
  b.set_manifest({.tensors = {}, .labels = labels});
  b.publish();
  return b;
}

TEST_F(Peering, AListingOfAnotherNodeHasOnlyWhatCouldBeOpenedFromThere)
{
  auto sa   = a_->open_session("a", call_transport::grpc);
  auto sb   = b_->open_session("b", call_transport::grpc);
  auto held = publish_labelled(sa, "models/w", {{"model", "m1"}});
  ASSERT_TRUE(settled(sa)) << peers(sa).DebugString();
  ASSERT_TRUE(eventually(
      [&] {
        auto r = peers(sb);
        return r.peers_size() == 1 && r.peers(0).state() == "probe_failed";
      },
      30s));

  // A's only buffer is in a host pool, which a remote open refuses: a
  // listing from B leaves it out, with or without a filter.
  EXPECT_TRUE(rmmd::shared_buffer::list(sb, {.peer = "nodeA"}).empty());
  EXPECT_TRUE(
      rmmd::shared_buffer::list(sb, {.labels = {{"model", "m1"}}, .peer = "nodeA"}).empty());
  EXPECT_EQ(rmmd::shared_buffer::list(sa, {.labels = {{"model", "m1"}}}).size(), 1u);
  try {
    (void)rmmd::shared_buffer::open_by_labels(sb, {{"model", "m1"}}, {.peer = "nodeA"});
    ADD_FAILURE() << "opened a host buffer of another node by its labels";
  } catch (rmmd::not_found_error const& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("open the buffer labelled {model=m1} on node 'nodeA': no published "
                          "buffer that node's grant lets this node open carries them "
                          "(`rmmctl buffers --peer nodeA` lists them"));
  }

  v1::ListBuffersRequest request;
  request.set_peer("nodeZ");
  v1::ListBuffersResponse reply;
  auto st = rmmd::detail::impl_of(sb).stub().ListBuffers(
      rmmd::detail::impl_of(sb).context().get(), request, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(st.error_message(),
            "list buffers: no peer 'nodeZ' in peering.peers (see `rmmctl peers`)");
  EXPECT_THROW((void)rmmd::shared_buffer::list(sb, {.peer = "nodeZ"}), rmmd::not_found_error);

  // The RmmdPeer call itself, with B's certificate: an incarnation of no
  // Hello is refused; after one, the answer is empty (host pool).
  auto stub = raw_peer("nodeB");
  grpc::ClientContext before_hello;
  v1::ListRemoteBuffersRequest ask;
  ask.set_incarnation(4242);
  v1::ListRemoteBuffersResponse answer;
  st = stub->ListRemoteBuffers(&before_hello, ask, &answer);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("list buffers from another node: incarnation 4242"));
  ASSERT_TRUE(hello(*stub, 4242).ok());
  grpc::ClientContext after_hello;
  st = stub->ListRemoteBuffers(&after_hello, ask, &answer);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(answer.buffers_size(), 0);
  EXPECT_FALSE(answer.truncated());
}

TEST_F(Peering, OpenByLabelsOnThisNodeOpensTheOneMatchAndNamesTheOthers)
{
  auto sa  = a_->open_session("a", call_transport::grpc);
  auto r0  = publish_labelled(sa, "models/r0", {{"model", "m1"}, {"rank", "0"}});
  auto r1  = publish_labelled(sa, "models/r1", {{"model", "m1"}, {"rank", "1"}});
  auto one = rmmd::shared_buffer::open_by_labels(sa, {{"model", "m1"}, {"rank", "1"}});
  EXPECT_EQ(one.name(), "models/r1");
  EXPECT_EQ(one.manifest().labels.at("rank"), "1");
  EXPECT_EQ(one.access(), rmmd::buffer_access::read);
  try {
    (void)rmmd::shared_buffer::open_by_labels(sa, {{"model", "m1"}});
    ADD_FAILURE() << "opened one of two matches";
  } catch (rmmd::precondition_error const& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("open the buffer labelled {model=m1}: 2 buffers carry them "
                          "('models/r0', 'models/r1'); add a label that tells them apart"));
  }
  try {
    (void)rmmd::shared_buffer::open_by_labels(sa, {{"model", "m2"}});
    ADD_FAILURE() << "opened a buffer no label matched";
  } catch (rmmd::not_found_error const& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("open the buffer labelled {model=m2}: no published buffer this process "
                          "may see carries them"));
  }
  EXPECT_THROW((void)rmmd::shared_buffer::open_by_labels(sa, {}), rmmd::logic_error);
  EXPECT_THROW((void)rmmd::shared_buffer::open_by_labels(
                   sa, {{"rank", "0"}}, {.expect_labels = {{"rank", "1"}}}),
               rmmd::logic_error);
}

TEST_F(Peering, RmmctlListsAnotherNodesBuffersOrSaysWhyNot)
{
  auto sb = b_->open_session("b", call_transport::grpc);
  ASSERT_TRUE(eventually(
      [&] {
        auto r = peers(sb);
        return r.peers_size() == 1 && r.peers(0).state() == "probe_failed";
      },
      30s));
  auto run = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{
        program_path("rmmctl").string(), "--runtime-dir", b_->runtime_dir().string()};
    argv.insert(argv.end(), args.begin(), args.end());
    child_process p(argv, {}, {.merge_stderr = true});
    p.close_stdin();
    auto out = p.read_all();
    return std::pair{p.wait().value_or(-1), out};
  };
  auto [listed, table] = run({"buffers", "--peer", "nodeA", "--label", "model=m1"});
  EXPECT_EQ(listed, 0) << table;
  EXPECT_THAT(table, HasSubstr("(no buffers of node 'nodeA' that its grant lets this node open"));
  auto [unknown, words] = run({"buffers", "--peer", "nodeZ"});
  EXPECT_EQ(unknown, 1) << words;
  EXPECT_THAT(words, HasSubstr("no peer 'nodeZ' in peering.peers"));
}

TEST_F(Peering, CallsToAPeerThatStartedAgainSayHelloAgainAndReachIt)
{
  // Renewals far apart, so that only a client's call can find that A's
  // daemon started again (a new incarnation, which knows no Hello of B's).
  b_.reset();
  a_.reset();
  auto const slow = std::string(" hold_lease_ms: 120000 renew_interval_ms: 60000 }");
  write_config(
      "a-slow.conf",
      "peering { node_name: 'nodeA' listen_address: '127.0.0.1:" + std::to_string(port_a_) + "' " +
          tls("nodeA") + " grants { identity: 'CN=rmmd-nodeB' name_prefixes: 'models/' }" + slow);
  write_config("b-slow.conf",
               "peering { node_name: 'nodeB' " + tls("nodeB") +
                   " peers { name: 'nodeA' address: '127.0.0.1:" + std::to_string(port_a_) +
                   "' identity: 'CN=rmmd-nodeA' tls_server_name: 'localhost' }" + slow);
  auto const a_args =
      std::vector<std::string>{"--backend", "host", "--config", (certs_ / "a-slow.conf").string()};
  a_ = std::make_unique<daemon_process>(a_args);
  b_ = std::make_unique<daemon_process>(
      std::vector<std::string>{"--backend", "host", "--config", (certs_ / "b-slow.conf").string()});
  auto sb = b_->open_session("b", call_transport::grpc);
  ASSERT_TRUE(eventually(
      [&] {
        auto r = peers(sb);
        return r.peers_size() == 1 && r.peers(0).state() == "probe_failed";
      },
      30s))
      << peers(sb).DebugString();
  EXPECT_TRUE(rmmd::shared_buffer::list(sb, {.peer = "nodeA"}).empty());

  ASSERT_TRUE(a_->stop().has_value());
  a_        = std::make_unique<daemon_process>(a_args);
  auto sa   = a_->open_session("a", call_transport::grpc);
  auto held = publish_labelled(sa, "models/w", {{"model", "m1"}});

  // B's link has not renewed since: its first calls find A's new daemon,
  // say Hello to it, and get its answers, not "call Hello first".
  try {
    EXPECT_TRUE(rmmd::shared_buffer::list(sb, {.peer = "nodeA"}).empty());
  } catch (std::exception const& e) {
    ADD_FAILURE() << "a listing of nodeA after its daemon started again: " << e.what();
  }
  v1::OpenBufferRequest open;
  open.set_name("models/w");
  open.set_peer("nodeA");
  v1::BufferGrant grant;
  auto const st = rmmd::detail::impl_of(sb).open_buffer(open, &grant);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("is in pool 'host', which exports no fabric handles"));
  EXPECT_THAT(st.error_message(), Not(HasSubstr("Hello")));
}

}  // namespace
}  // namespace rmmd::test
