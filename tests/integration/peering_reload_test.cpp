// SIGHUP and peering's certificates, with two real daemons (host backend)
// on 127.0.0.1 and certificates from scripts/make-test-certs.sh: node A
// listens and grants nodeB, node B dials A and has no listener of its own.
// A reload reads the TLS files again for A's listener and for B's link; B
// dials with its new certificate at once (A refuses one from another CA,
// and nothing changes on A), comes back by itself after A serves a rotated
// certificate, files that cannot be read keep the old certificates, and a
// move to a new CA as docs/operations.md tells it loses no contact.
// On a host without fabric every link settles at probe_failed (the host
// backend exports no probe): that is "sees the other" here.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "harness/peer_setup.hpp"
#include "rmmd/v1/peer.grpc.pb.h"
#include "tests/integration/logged_daemon.hpp"
#include "tests/tools/test_certs.hpp"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

std::int64_t now_unix_ms()
{
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

class PeeringReload : public certs_suite {
 protected:
  void SetUp() override
  {
    port_a_ = harness::free_loopback_port();
    install("nodeA", "a");
    install("nodeB", "b");
    live_.write("ca.pem", read_text(certs_ / "ca.pem"));
    auto tls = [&](std::string const& node) {
      return "tls { certificate_file: '" + (live_.path() / (node + ".pem")).string() +
             "' private_key_file: '" + (live_.path() / (node + ".key")).string() +
             "' trusted_ca_file: '" + (live_.path() / "ca.pem").string() + "' }";
    };
    auto const a_conf = live_.write(
        "a.conf",
        "peering { node_name: 'nodeA' listen_address: '127.0.0.1:" + std::to_string(port_a_) +
            "' " + tls("a") +
            " grants { identity: 'CN=rmmd-nodeB' name_prefixes: 'models/' }"
            " hold_lease_ms: 2000 renew_interval_ms: 500 }\n");
    auto const b_conf =
        live_.write("b.conf",
                    "peering { node_name: 'nodeB' " + tls("b") +
                        " peers { name: 'nodeA' address: '127.0.0.1:" + std::to_string(port_a_) +
                        "' identity: 'CN=rmmd-nodeA' tls_server_name: 'localhost' }"
                        " hold_lease_ms: 2000 renew_interval_ms: 500 }\n");
    a_ = std::make_unique<logged_daemon>(
        std::vector<std::string>{"--backend", "host", "--config", a_conf.string()});
    b_ = std::make_unique<logged_daemon>(
        std::vector<std::string>{"--backend", "host", "--config", b_conf.string()});
    sa_.emplace(a_->open_session("a"));
    sb_.emplace(b_->open_session("b"));
  }

  void TearDown() override
  {
    sa_.reset();
    sb_.reset();
    b_.reset();
    a_.reset();
  }

  /// `from`'s certificate and key (make-test-certs.sh's names) become the
  /// live files `to`.pem and `to`.key, each replaced whole.
  void install(std::string const& from, std::string const& to) const
  {
    live_.write(to + ".pem", read_text(certs_ / (from + ".pem")));
    live_.write(to + ".key", read_text(certs_ / (from + ".key")));
  }

  static v1::ListPeersResponse peers(rmmd::session& s)
  {
    v1::ListPeersResponse reply;
    auto st = rmmd::detail::impl_of(s).stub().ListPeers(
        rmmd::detail::impl_of(s).context().get(), {}, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return reply;
  }

  /// B's one peer, A, as B shows it.
  v1::PeerInfo a_seen_by_b()
  {
    auto r = peers(*sb_);
    return r.peers_size() == 1 ? r.peers(0) : v1::PeerInfo{};
  }
  /// A's one peer, B (it dialed A), as A shows it.
  v1::PeerInfo b_seen_by_a()
  {
    auto r = peers(*sa_);
    return r.peers_size() == 1 ? r.peers(0) : v1::PeerInfo{};
  }

  /// B's link to A got its Welcome: probe_failed on a host without fabric.
  bool b_sees_a()
  {
    return eventually(
        [&] {
          auto p = a_seen_by_b();
          return p.state() == "probe_failed" && p.identity() == "CN=rmmd-nodeA";
        },
        30s);
  }
  /// Both sides settled: B's link said Hello and A recorded it.
  bool settled()
  {
    return b_sees_a() && eventually([&] { return b_seen_by_a().direction() == "accepted"; }, 30s);
  }
  /// B renewed on A after `t` (unix ms): its link is working.
  bool b_in_touch_after(std::int64_t t)
  {
    return eventually([&] { return b_seen_by_a().last_contact_unix_ms() > t; }, 30s);
  }

  /// A's ledger as ListPeers shows it, for "nothing changed".
  std::string a_ledger()
  {
    auto r = peers(*sa_);
    for (auto& p : *r.mutable_peers()) { p.clear_last_contact_unix_ms(); }
    return r.SerializeAsString();
  }

  /// The certificate A's listener serves now (PEM), seen by a call with
  /// `client`'s certificate trusting `ca` that changes nothing there (a
  /// renewal for an incarnation nobody has: FAILED_PRECONDITION).
  std::string certificate_a_serves(std::string const& ca     = "ca",
                                   std::string const& client = "nodeB") const
  {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs  = read_text(certs_ / (ca + ".pem"));
    o.pem_cert_chain  = read_text(certs_ / (client + ".pem"));
    o.pem_private_key = read_text(certs_ / (client + ".key"));
    grpc::ChannelArguments args;
    args.SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, "localhost");
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = v1::RmmdPeer::NewStub(grpc::CreateCustomChannel(
        "127.0.0.1:" + std::to_string(port_a_), grpc::SslCredentials(o), args));
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + 10s);
    v1::RenewHoldsRequest request;
    request.set_incarnation(7);
    v1::RenewHoldsResponse reply;
    auto st = stub->RenewHolds(&c, request, &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
    auto auth = c.auth_context();
    if (!auth) { return {}; }
    auto pem = auth->FindPropertyValues("x509_pem_cert");
    return pem.empty() ? std::string() : std::string(pem.front().data(), pem.front().size());
  }

  static bool same_pem(std::string const& seen, fs::path const& file)
  {
    // gRPC hands the certificate back as PEM, perhaps without the file's
    // last newline.
    auto want = read_text(file);
    while (!want.empty() && want.back() == '\n') { want.pop_back(); }
    auto got = seen;
    while (!got.empty() && got.back() == '\n') { got.pop_back(); }
    return !got.empty() && got == want;
  }

  scratch_dir live_;
  int port_a_{};
  std::unique_ptr<logged_daemon> a_;
  std::unique_ptr<logged_daemon> b_;
  std::optional<rmmd::session> sa_;
  std::optional<rmmd::session> sb_;
};

TEST_F(PeeringReload, BsCertificateFromAnotherCAMakesAUnreachableAtOnceAndAChangesNothing)
{
  ASSERT_TRUE(settled()) << peers(*sb_).DebugString() << peers(*sa_).DebugString();
  auto const before = a_ledger();

  install("nodeB-other-ca", "b");
  b_->process().kill(SIGHUP);
  ASSERT_TRUE(b_->wait_log("link(s) now dial with the reloaded certificate")) << b_->log();
  ASSERT_TRUE(eventually([&] { return a_seen_by_b().state() == "unreachable"; }, 30s))
      << peers(*sb_).DebugString();
  auto const refused = a_seen_by_b();
  // TLS 1.3 judges the client's certificate after the client's side of the
  // handshake: B sees A close the connection.
  EXPECT_THAT(refused.problem(), HasSubstr("it closed the connection during the TLS handshake"))
      << refused.DebugString();
  EXPECT_THAT(refused.problem(), HasSubstr("most likely it refuses this node's certificate"));
  EXPECT_EQ(a_ledger(), before) << peers(*sa_).DebugString();

  install("nodeB", "b");
  b_->process().kill(SIGHUP);
  ASSERT_TRUE(b_->wait_log("link(s) now dial with the reloaded certificate")) << b_->log();
  EXPECT_TRUE(b_sees_a()) << peers(*sb_).DebugString();
  auto const back = b_seen_by_a();
  EXPECT_EQ(back.identity(), "CN=rmmd-nodeB");
  EXPECT_EQ(back.direction(), "accepted");
}

TEST_F(PeeringReload, ARotatedCertificateOfTheSameCAIsServedAndBComesBackByItself)
{
  ASSERT_TRUE(settled()) << peers(*sb_).DebugString() << peers(*sa_).DebugString();
  EXPECT_TRUE(same_pem(certificate_a_serves(), certs_ / "nodeA.pem"));

  install("nodeA-next", "a");
  a_->process().kill(SIGHUP);
  ASSERT_TRUE(a_->wait_log("serves the reloaded certificate")) << a_->log();
  auto const reloaded = now_unix_ms();
  EXPECT_TRUE(same_pem(certificate_a_serves(), certs_ / "nodeA-next.pem"));
  // The old listener is gone with its connections: B's renewals after the
  // reload reached the new one, with no restart and no signal to B.
  EXPECT_TRUE(b_in_touch_after(reloaded)) << peers(*sa_).DebugString();
  EXPECT_TRUE(b_sees_a()) << peers(*sb_).DebugString();
  auto const r = peers(*sa_);
  ASSERT_EQ(r.peers_size(), 1) << r.DebugString();
  EXPECT_EQ(r.peers(0).identity(), "CN=rmmd-nodeB");

  // A certificate of the same CA for another name: B's link, on the new
  // listener, finds the identity wrong and says so.
  install("nodeC", "a");
  a_->process().kill(SIGHUP);
  ASSERT_TRUE(a_->wait_log("serves the reloaded certificate")) << a_->log();
  ASSERT_TRUE(eventually([&] { return a_seen_by_b().state() == "unreachable"; }, 30s))
      << peers(*sb_).DebugString();
  EXPECT_THAT(a_seen_by_b().problem(),
              HasSubstr("its certificate names 'CN=rmmd-nodeC', but peering.peers names "
                        "identity 'CN=rmmd-nodeA' for it"));
  install("nodeA-next", "a");
  a_->process().kill(SIGHUP);
  ASSERT_TRUE(a_->wait_log("serves the reloaded certificate")) << a_->log();
  EXPECT_TRUE(b_sees_a()) << peers(*sb_).DebugString();
}

TEST_F(PeeringReload, FilesThatCannotBeReadKeepTheOldCertificatesAndTheLinksWork)
{
  ASSERT_TRUE(settled()) << peers(*sb_).DebugString() << peers(*sa_).DebugString();
  fs::remove(live_.path() / "b.key");
  b_->process().kill(SIGHUP);
  auto const b_said = b_->wait_log("is rejected");
  ASSERT_TRUE(b_said) << b_->log();
  EXPECT_THAT(*b_said, HasSubstr("peering keeps its old certificates"));
  EXPECT_THAT(b_->log(), HasSubstr("peering.tls.private_key_file"));

  fs::remove(live_.path() / "a.pem");
  a_->process().kill(SIGHUP);
  auto const a_said = a_->wait_log("is rejected");
  ASSERT_TRUE(a_said) << a_->log();
  EXPECT_THAT(*a_said, HasSubstr("peering keeps its old certificates"));
  EXPECT_THAT(a_->log(), HasSubstr("peering.tls.certificate_file"));

  auto const after = now_unix_ms();
  EXPECT_TRUE(b_in_touch_after(after)) << peers(*sa_).DebugString();
  EXPECT_EQ(a_seen_by_b().state(), "probe_failed") << peers(*sb_).DebugString();
  EXPECT_TRUE(same_pem(certificate_a_serves(), certs_ / "nodeA.pem"));
  EXPECT_THAT(b_->log(), Not(HasSubstr("now dial with the reloaded certificate")));
  EXPECT_THAT(a_->log(), Not(HasSubstr("serves the reloaded certificate")));
}

TEST_F(PeeringReload, MovingToANewCAWithBothTrustedFirstKeepsThePeersInTouch)
{
  ASSERT_TRUE(settled()) << peers(*sb_).DebugString() << peers(*sa_).DebugString();
  // Each step: SIGHUP to one node, which says what it now uses; B is still
  // in touch with A, and no link went unreachable (an operator signals the
  // nodes one at a time; one dialing into a listener being swapped can miss
  // it for one backoff, docs/operations.md).
  auto step = [&](logged_daemon& d) {
    d.process().kill(SIGHUP);
    EXPECT_TRUE(d.wait_log(&d == b_.get() ? "now dial with the reloaded certificate"
                                          : "serves the reloaded certificate"))
        << d.log();
    EXPECT_TRUE(b_in_touch_after(now_unix_ms())) << peers(*sa_).DebugString();
    EXPECT_TRUE(b_sees_a()) << peers(*sb_).DebugString();
  };
  // 1. Both trust both CAs.
  live_.write("ca.pem", read_text(certs_ / "ca.pem") + read_text(certs_ / "other-ca.pem"));
  step(*a_);
  step(*b_);
  // 2. Each node in turn gets its certificate from the new CA.
  install("nodeB-other-ca", "b");
  step(*b_);
  install("nodeA-other-ca", "a");
  step(*a_);
  EXPECT_TRUE(
      same_pem(certificate_a_serves("other-ca", "nodeB-other-ca"), certs_ / "nodeA-other-ca.pem"));
  // 3. Both drop the old CA.
  live_.write("ca.pem", read_text(certs_ / "other-ca.pem"));
  step(*a_);
  step(*b_);
  EXPECT_THAT(b_->log(), Not(HasSubstr(": unreachable")));
  EXPECT_THAT(a_->log(), Not(HasSubstr("peering keeps its old certificates")));
}

}  // namespace
}  // namespace rmmd::test
