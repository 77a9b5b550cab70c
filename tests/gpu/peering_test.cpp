// Peering between daemons of different nodes (docs/operations.md, "Across
// nodes"), on one host with two GPUs: two real daemons with runtime
// directories and TCP ports of their own stand for nodes A and B. A serves a
// fabric pool on GPU 0 and grants CN=rmmd-nodeB the prefix "peertest/"; B
// runs under CUDA_VISIBLE_DEVICES=1 and dials A with mutual TLS
// (certificates from scripts/make-test-certs.sh). Clients are real
// processes (rmmd_share_client, posix_spawn): A's producer writes a pattern
// on GPU 0, B's consumer opens nodeA:NAME on GPU 1 through its daemon and
// copies it back on its GPU.
//
// Needs 2 GPUs and an IMEX channel (/dev/nvidia-caps-imex-channels/channel0,
// created as root: DEVELOPERS.md, "On the GPU host"); skips saying which is
// missing. The certificate script is found at $RMMD_TEST_CERTS_SCRIPT, else
// in the source tree (RMMD_SOURCE_DIR), else beside this binary.

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/child_process.hpp"

#include "harness/daemon_process.hpp"
#include "harness/peer_setup.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"

#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr std::size_t buffer_bytes     = std::size_t{64} << 20;
constexpr std::uint32_t hold_lease_ms  = 3000;
constexpr std::uint32_t renew_every_ms = 500;

fs::path const imex_channel{"/dev/nvidia-caps-imex-channels/channel0"};

/// One node's daemon: its config file, runtime directory and CUDA devices.
struct node {
  std::string name;
  fs::path config;
  std::string visible_devices;
  std::unique_ptr<harness::daemon_process> daemon;

  [[nodiscard]] std::vector<std::string> client_env() const
  {
    return {"RMMD_RUNTIME_DIR=" + daemon->runtime_dir().string(),
            "CUDA_VISIBLE_DEVICES=" + visible_devices};
  }
  [[nodiscard]] rmmd::session session() const
  {
    return rmmd::session({.runtime_dir = daemon->runtime_dir(), .client_name = "peering-test"});
  }
  [[nodiscard]] v1::ListPeersResponse peers() const
  {
    auto s = session();
    v1::ListPeersResponse out;
    auto status = rmmd::detail::impl_of(s).list_peers(&out);
    EXPECT_TRUE(status.ok()) << name << ": ListPeers: " << status.error_message();
    return out;
  }
  [[nodiscard]] std::optional<v1::PeerInfo> peer(std::string const& node_name) const
  {
    auto const listed = peers();
    for (auto const& p : listed.peers()) {
      if (p.node_name() == node_name) { return p; }
    }
    return std::nullopt;
  }
  /// Holders of buffer `name` as this daemon counts them (0: no such buffer).
  [[nodiscard]] std::uint32_t holders(std::string const& buffer) const
  {
    for (auto const& b : rmmd::shared_buffer::list(session(), {.name_prefix = buffer})) {
      if (b.name == buffer) { return b.holders; }
    }
    return 0;
  }
  void start()
  {
    harness::daemon_process::options o{.program     = program_path("rmmd"),
                                       .args        = {"--config", config.string()},
                                       .dir_prefix  = "rmmd-" + name + "-",
                                       .log_to_file = true,
                                       .env         = {"CUDA_VISIBLE_DEVICES=" + visible_devices}};
    daemon = std::make_unique<harness::daemon_process>(std::move(o));
  }
};

std::string tls_block(fs::path const& certs, std::string const& stem)
{
  return "  tls {\n    certificate_file: \"" + (certs / (stem + ".pem")).string() +
         "\"\n    private_key_file: \"" + (certs / (stem + ".key")).string() +
         "\"\n    trusted_ca_file: \"" + (certs / "ca.pem").string() + "\"\n  }\n";
}

std::string timing_block()
{
  return "  hold_lease_ms: " + std::to_string(hold_lease_ms) +
         "\n  renew_interval_ms: " + std::to_string(renew_every_ms) + "\n  keepalive_ms: 1000\n";
}

/// A's: a host pool and a fabric pool on its GPU; listens, grants nodeB
/// "peertest/".
std::string config_a(fs::path const& certs, int port, bool fabric_required = true)
{
  return "pools { name: \"host\" backend: HOST capacity_bytes: 67108864 }\n"
         "pools { name: \"gpu\" backend: CUDA device: 0 " +
         std::string(fabric_required ? "handle_types: [POSIX_FD, FABRIC]" : "") +
         "\n        limit_bytes: 8589934592 }\n"
         "peering {\n  node_name: \"nodeA\"\n  listen_address: \"127.0.0.1:" +
         std::to_string(port) + "\"\n" + tls_block(certs, "nodeA") +
         "  grants { identity: \"CN=rmmd-nodeB\" name_prefixes: \"peertest/\" }\n" +
         timing_block() + "}\n";
}

/// A dialer's (B's, or C's with another certificate or none): dials A.
std::string config_dialer(std::string const& node_name,
                          fs::path const& certs,
                          std::string const& stem,  // empty: plaintext
                          int port_a)
{
  std::string peering = "peering {\n  node_name: \"" + node_name + "\"\n";
  peering += stem.empty() ? "  insecure_plaintext_for_tests: true\n" : tls_block(certs, stem);
  peering += "  peers { name: \"nodeA\" address: \"127.0.0.1:" + std::to_string(port_a) +
             "\" identity: \"CN=rmmd-nodeA\" }\n";
  return "pools { name: \"host\" backend: HOST capacity_bytes: 67108864 }\n"
         "pools { name: \"gpu\" backend: CUDA device: 0 handle_types: [POSIX_FD, FABRIC]\n"
         "        limit_bytes: 4294967296 }\n" +
         peering + timing_block() + "}\n";
}

/// The child's next line of output (or what says there was none).
std::string next_line(child_process& p)
{
  return p.read_line(60s).value_or("(no line: it ended or 60 s passed)");
}

void write_file(fs::path const& path, std::string const& text)
{
  std::ofstream(path) << text;
}

class Peering : public ::testing::Test {
 protected:
  void SetUp() override
  {
    REQUIRE_GPUS(2);
    if (!fs::exists(imex_channel)) {
      GTEST_SKIP() << "no IMEX channel (" << imex_channel.string()
                   << "): fabric handles cannot be imported; create it as root "
                      "(DEVELOPERS.md, \"On the GPU host\")";
    }
    start_nodes("ready");
  }

  /// Makes the certificates, starts A and B, and waits until B sees A in
  /// `state`. `fabric_required`: A's GPU pool asks fabric handles (not
  /// served without them); otherwise it takes them where the start finds an
  /// IMEX channel, and serves posix-fd only where not.
  void start_nodes(std::string const& state, bool fabric_required = true)
  {
    auto script = harness::find_certs_script(RMMD_SOURCE_DIR);
    if (script.empty()) {
      GTEST_SKIP() << "scripts/make-test-certs.sh not found: set RMMD_TEST_CERTS_SCRIPT";
    }
    char tmpl[] = "/tmp/rmmd-peering-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_      = tmpl;
    auto made = run({"/bin/bash", script.string(), (dir_ / "certs").string()}, 60s);
    ASSERT_EQ(made.status, 0) << made.out;
    port_a_ = harness::free_loopback_port();
    ASSERT_NE(port_a_, 0);
    a_ = {.name = "nodeA", .config = dir_ / "a.conf", .visible_devices = "0", .daemon = nullptr};
    b_ = {.name = "nodeB", .config = dir_ / "b.conf", .visible_devices = "1", .daemon = nullptr};
    write_file(a_.config, config_a(certs(), port_a_, fabric_required));
    write_file(b_.config, config_dialer("nodeB", certs(), "nodeB", port_a_));
    a_.start();
    b_.start();
    ASSERT_TRUE(eventually(
        [&] {
          auto p = b_.peer("nodeA");
          return p && p->state() == state;
        },
        30s))
        << "B never saw A " << state << ":\n"
        << b_.peers().DebugString() << "B's log:\n"
        << b_.daemon->log_tail(30) << "A's log:\n"
        << a_.daemon->log_tail(30);
  }

  void TearDown() override
  {
    // Tests here make either GPU current; the suites after them allocate on
    // the current device and read device 0's pool.
    cudaSetDevice(0);
    clients_.clear();
    c_.daemon.reset();
    b_.daemon.reset();
    a_.daemon.reset();
    if (!dir_.empty()) { fs::remove_all(dir_); }
  }

  [[nodiscard]] fs::path certs() const
  {
    return dir_ / "certs";
  }

  child_process& client(node const& n, std::vector<std::string> args)
  {
    std::vector<std::string> argv{program_path("rmmd_share_client").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    clients_.push_back(std::make_unique<child_process>(argv, n.client_env()));
    return *clients_.back();
  }

  /// A producer on A that published `name` (64 MiB of seed 7's pattern).
  child_process& produce(std::string const& name)
  {
    auto& p = client(a_, {"produce", name, std::to_string(buffer_bytes), "7"});
    EXPECT_THAT(next_line(p), StartsWith("created "));
    EXPECT_EQ(next_line(p), "published");
    return p;
  }

  fs::path dir_;
  int port_a_{};
  node a_, b_, c_;
  std::vector<std::unique_ptr<child_process>> clients_;
};

TEST_F(Peering, BothSidesAreReadyWithTheProbeImportedBothWays)
{
  auto const on_b = b_.peer("nodeA");
  ASSERT_TRUE(on_b);
  EXPECT_EQ(on_b->state(), "ready") << on_b->problem();
  EXPECT_TRUE(on_b->probe_ok()) << on_b->problem();
  EXPECT_TRUE(on_b->their_probe_ok()) << on_b->problem();
  EXPECT_EQ(on_b->identity(), "CN=rmmd-nodeA");
  EXPECT_THAT(on_b->direction(), ::testing::AnyOf("dialed", "both"));
  EXPECT_EQ(b_.peers().node_name(), "nodeB");

  // A hears B's verdict on A's probe with B's next renewal.
  EXPECT_TRUE(eventually(
      [&] {
        auto p = a_.peer("nodeB");
        return p.has_value() && p->their_probe_ok();
      },
      10s));
  auto const on_a = a_.peer("nodeB");
  ASSERT_TRUE(on_a);
  EXPECT_EQ(on_a->state(), "ready") << on_a->problem();
  EXPECT_TRUE(on_a->probe_ok()) << on_a->problem();
  EXPECT_TRUE(on_a->their_probe_ok()) << on_a->problem();
  EXPECT_EQ(on_a->identity(), "CN=rmmd-nodeB");
  EXPECT_THAT(on_a->direction(), ::testing::AnyOf("accepted", "both"));
  EXPECT_EQ(a_.peers().node_name(), "nodeA");
}

TEST_F(Peering, ARemoteOpenReadsTheSameBytesReadOnlyAndHoldsOnA)
{
  auto& producer = produce("peertest/w");
  ASSERT_EQ(a_.holders("peertest/w"), 1u);

  auto& consumer = client(b_, {"consume", "nodeA:peertest/w", std::to_string(buffer_bytes), "7"});
  auto const verified = next_line(consumer);
  ASSERT_THAT(verified, StartsWith("verified " + std::to_string(buffer_bytes)))
      << "B's log:\n"
      << b_.daemon->log_tail(20) << "A's log:\n"
      << a_.daemon->log_tail(20);
  std::cout << "note: remote open (open, import, map) took "
            << verified.substr(verified.rfind(' ') + 1) << " us\n";

  // The remote hold counts on A like a local one, and each side lists it.
  EXPECT_TRUE(eventually([&] { return a_.holders("peertest/w") == 2; }));
  auto const on_a = a_.peer("nodeB");
  ASSERT_TRUE(on_a);
  EXPECT_EQ(on_a->holds_they_have(), 1u);
  EXPECT_GE(on_a->bytes_they_hold(), buffer_bytes);
  auto const on_b = b_.peer("nodeA");
  ASSERT_TRUE(on_b);
  EXPECT_EQ(on_b->holds_we_have(), 1u);
  EXPECT_GE(on_b->bytes_we_hold(), buffer_bytes);

  // Read-only: a write from B faults in the writer alone.
  auto& writer = client(b_, {"write", "nodeA:peertest/w", std::to_string(buffer_bytes), "9"});
  EXPECT_THAT(next_line(writer), StartsWith("cuda-error "));
  EXPECT_EQ(writer.wait(), 3);

  // Closing ends the hold on A; the bytes there are untouched.
  consumer.close_stdin();
  EXPECT_EQ(next_line(consumer), "intact");
  EXPECT_EQ(consumer.wait(), 0);
  EXPECT_TRUE(eventually([&] {
    auto p = a_.peer("nodeB");
    return a_.holders("peertest/w") == 1 && p && p->holds_they_have() == 0;
  }));
  producer.close_stdin();
  EXPECT_EQ(next_line(producer), "intact");
  EXPECT_EQ(producer.wait(), 0);
}

TEST_F(Peering, AClientKeepsOneAnchorOfAsGpuThroughClosingEveryRemoteBufferAndHoldsNothingByIt)
{
  // The anchor is A's granule of its GPU, mapped once per session and local
  // device, so that an open after the last close finds the driver's mapping
  // between the GPUs still made (bench section p times it).
  auto& producer        = produce("peertest/anchor");
  auto const a_gpu_uuid = a_.session().pool("gpu").gpu_uuid;
  {
    auto s      = b_.session();
    auto& views = rmmd::detail::impl_of(s).buffers();
    EXPECT_TRUE(views.peer_anchors().empty());
    for (int round = 0; round < 3; ++round) {
      auto opened = rmmd::shared_buffer::open(s, "nodeA:peertest/anchor", {.device = 1});
      EXPECT_EQ(opened.size(), buffer_bytes);
      opened.close();
      auto const kept = views.peer_anchors();
      ASSERT_EQ(kept.size(), 1u) << "round " << round;
      EXPECT_EQ(kept[0].gpu_uuid, a_gpu_uuid);
      EXPECT_EQ(kept[0].device, 1);
    }
    // The anchor is no hold: A counts its producer alone.
    EXPECT_TRUE(eventually([&] {
      auto p = a_.peer("nodeB");
      return a_.holders("peertest/anchor") == 1 && p && p->holds_they_have() == 0;
    }));
  }
  // The session's end let go of it: the producer's buffer is intact.
  producer.close_stdin();
  EXPECT_EQ(next_line(producer), "intact");
  EXPECT_EQ(producer.wait(), 0);
}

TEST_F(Peering, ASigkilledPeerLosesItsHoldsOnAWhenItsLeaseEnds)
{
  auto& producer = produce("peertest/k");
  auto& consumer = client(b_, {"consume", "nodeA:peertest/k", std::to_string(buffer_bytes), "7"});
  ASSERT_THAT(next_line(consumer), StartsWith("verified "));
  ASSERT_TRUE(eventually([&] { return a_.holders("peertest/k") == 2; }));

  ::kill(b_.daemon->pid(), SIGKILL);
  // No CloseHolds comes: the lease ends it (hold_lease_ms, and the reaper's
  // round on top).
  EXPECT_TRUE(eventually(
      [&] {
        auto p = a_.peer("nodeB");
        return a_.holders("peertest/k") == 1 && (!p || p->holds_they_have() == 0);
      },
      std::chrono::milliseconds(hold_lease_ms) + 15s))
      << a_.daemon->log_tail(20);
  auto const log = a_.daemon->log_tail(200);
  EXPECT_THAT(log, HasSubstr("nodeB")) << log;
  EXPECT_THAT(log,
              ::testing::ContainsRegex("hold.*(expire|lease|renew)|(expire|lease|renew).*hold"))
      << log;
  consumer.kill(SIGKILL);
  producer.close_stdin();
  EXPECT_EQ(next_line(producer), "intact");
}

TEST_F(Peering, ABufferOutsideTheGrantIsPermissionDenied)
{
  auto& producer  = produce("private/w");
  auto& opener    = client(b_, {"try-open", "nodeA:private/w"});
  auto const line = next_line(opener);
  EXPECT_THAT(line, StartsWith("error permission"));
  EXPECT_THAT(line, HasSubstr("private/w"));
  EXPECT_THAT(line, HasSubstr("CN=rmmd-nodeB"));
  EXPECT_THAT(line, HasSubstr("node 'nodeA' refused: peer 'CN=rmmd-nodeB' may not open"));
  EXPECT_EQ(opener.wait(), 2);
  EXPECT_EQ(a_.holders("private/w"), 1u);
  auto const on_a = a_.peer("nodeB");
  ASSERT_TRUE(on_a);
  EXPECT_EQ(on_a->holds_they_have(), 0u);

  // A node B has no peer for.
  auto& nowhere = client(b_, {"try-open", "nodeZ:peertest/w"});
  EXPECT_THAT(next_line(nowhere), StartsWith("error not_found"));
  producer.close_stdin();
}

TEST_F(Peering, BListsAsBuffersThroughItsGrantAndOpensOneByLabelsReadingItsBytes)
{
  // This process makes A's buffers (on A's GPU, as this process numbers it)
  // and opens one through B on B's GPU.
  // It makes each GPU current in turn: the tests after it in this process
  // find the device they started with.
  int started_on = 0;
  ASSERT_EQ(cudaGetDevice(&started_on), cudaSuccess);
  struct restore_device {
    int device;
    ~restore_device()
    {
      cudaSetDevice(device);
    }
  } const restore{started_on};
  auto sa          = a_.session();
  auto sb          = b_.session();
  auto const dev_a = sa.pool("gpu").device;
  auto const dev_b = sb.pool("gpu").device;
  ASSERT_NE(dev_a, dev_b);
  auto make = [&](std::string const& name, std::string const& rank, int byte) {
    auto b = rmmd::shared_buffer::create(sa, name, buffer_bytes, {.pool = "gpu"});
    b.set_manifest({.tensors = {}, .labels = {{"model", "m1"}, {"rank", rank}}});
    EXPECT_EQ(cudaSetDevice(dev_a), cudaSuccess);
    EXPECT_EQ(cudaMemset(b.data(), byte, buffer_bytes), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    b.publish();
    return b;
  };
  auto r0      = make("peertest/r0", "0", 0x30);
  auto r1      = make("peertest/r1", "1", 0x31);
  auto outside = make("private/r2", "2", 0x32);  // no grant names it for B

  auto listed = rmmd::shared_buffer::list(sb, {.labels = {{"model", "m1"}}, .peer = "nodeA"});
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].name, "peertest/r0");
  EXPECT_EQ(listed[1].name, "peertest/r1");
  EXPECT_EQ(listed[1].peer, "nodeA");
  EXPECT_EQ(listed[1].labels.at("rank"), "1");
  EXPECT_EQ(listed[1].size, buffer_bytes);

  EXPECT_THROW((void)rmmd::shared_buffer::open_by_labels(
                   sb, {{"model", "m1"}}, {.peer = "nodeA", .device = dev_b}),
               rmmd::precondition_error);
  EXPECT_THROW((void)rmmd::shared_buffer::open_by_labels(
                   sb, {{"rank", "2"}}, {.peer = "nodeA", .device = dev_b}),
               rmmd::not_found_error);  // outside the grant: not even listed

  auto opened = rmmd::shared_buffer::open_by_labels(
      sb, {{"model", "m1"}, {"rank", "1"}}, {.peer = "nodeA", .device = dev_b});
  EXPECT_EQ(opened.name(), "peertest/r1");
  EXPECT_EQ(opened.peer(), "nodeA");
  EXPECT_EQ(opened.device(), dev_b);
  EXPECT_EQ(opened.manifest().labels.at("rank"), "1");
  std::vector<unsigned char> host(buffer_bytes);
  ASSERT_EQ(cudaSetDevice(dev_b), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(host.data(), opened.data(), buffer_bytes, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(std::count(host.begin(), host.end(), 0x31), static_cast<std::ptrdiff_t>(buffer_bytes));
  EXPECT_TRUE(eventually([&] { return a_.holders("peertest/r1") == 2; }));
  opened.close();
  EXPECT_TRUE(eventually([&] { return a_.holders("peertest/r1") == 1; }));
}

/// A third daemon C that A must refuse: a certificate of another CA, an
/// expired one, or no TLS at all.
class RefusedPeer : public Peering, public ::testing::WithParamInterface<std::string> {};

TEST_P(RefusedPeer, IsUnreachableWithAReasonAndChangesNothingOnA)
{
  // A shows B ready once B's renewal has carried its verdict on A's probe.
  ASSERT_TRUE(eventually([&] {
    auto p = a_.peer("nodeB");
    return p.has_value() && p->state() == "ready";
  }));
  auto const before = a_.peers();

  std::string const stem = GetParam() == "plaintext" ? "" : GetParam();
  c_ = {.name = "nodeC", .config = dir_ / "c.conf", .visible_devices = "1", .daemon = nullptr};
  write_file(c_.config, config_dialer("nodeC", certs(), stem, port_a_));
  c_.start();
  ASSERT_TRUE(eventually(
      [&] {
        auto p = c_.peer("nodeA");
        return p && p->state() == "unreachable" && !p->problem().empty();
      },
      30s))
      << c_.peers().DebugString() << c_.daemon->log_tail(20);
  std::cout << "note: C (" << GetParam() << ") sees A: " << c_.peer("nodeA")->problem() << "\n";

  auto const after = a_.peers();
  ASSERT_EQ(after.peers_size(), before.peers_size()) << after.DebugString();
  for (int i = 0; i < after.peers_size(); ++i) {
    EXPECT_EQ(after.peers(i).node_name(), before.peers(i).node_name());
    EXPECT_EQ(after.peers(i).state(), before.peers(i).state());
    EXPECT_EQ(after.peers(i).holds_they_have(), before.peers(i).holds_they_have());
  }
  EXPECT_FALSE(a_.peer("nodeC").has_value());
  // B is still served.
  auto on_b = b_.peer("nodeA");
  ASSERT_TRUE(on_b);
  EXPECT_EQ(on_b->state(), "ready");
}

INSTANTIATE_TEST_SUITE_P(Certificates,
                         RefusedPeer,
                         ::testing::Values("stranger", "expired", "plaintext"));

/// Two nodes started where there is no IMEX channel (it skips where there
/// is one: remove it to run these), their GPU pools requiring fabric
/// handles or taking them where they can.
template <bool FabricRequired>
class NodesWithoutImex : public Peering {
 protected:
  void SetUp() override
  {
    REQUIRE_GPUS(2);
    if (fs::exists(imex_channel)) {
      GTEST_SKIP() << "there is an IMEX channel (" << imex_channel.string()
                   << "); this test needs none: remove it to run it";
    }
    start_nodes("probe_failed", FabricRequired);
  }
};

/// A's pool takes fabric handles where it can and the start finds none, so
/// peering works but no buffer can cross, and both nodes say why in words.
class PeeringWithoutImex : public NodesWithoutImex<false> {};

TEST_F(PeeringWithoutImex, BothNodesSayThereIsNoImexChannelAndAnOpenIsRefusedInWords)
{
  auto const on_b = b_.peer("nodeA");
  ASSERT_TRUE(on_b);
  EXPECT_EQ(on_b->state(), "probe_failed");
  EXPECT_FALSE(on_b->probe_ok());
  EXPECT_THAT(on_b->problem(), HasSubstr("pool 'gpu' has no fabric handles"));
  EXPECT_THAT(on_b->problem(), HasSubstr("IMEX channel"));
  // rmmctl peers on B prints the same words.
  auto const shown = run({program_path("rmmctl").string(),
                          "--runtime-dir",
                          b_.daemon->runtime_dir().string(),
                          "peers"},
                         30s);
  EXPECT_EQ(shown.status, 0) << shown.out;
  EXPECT_THAT(shown.out, HasSubstr("IMEX channel")) << shown.out;

  // A buffer of A's GPU pool has no fabric handle: B's open is refused, in words.
  auto& p = client(a_, {"produce", "peertest/noimex", std::to_string(buffer_bytes), "7"});
  EXPECT_THAT(next_line(p), StartsWith("created "));
  EXPECT_EQ(next_line(p), "published");
  auto s = b_.session();
  try {
    auto r = rmmd::shared_buffer::open(s, "nodeA:peertest/noimex", rmmd::open_options{.device = 0});
    ADD_FAILURE() << "opened a buffer of a pool without fabric handles";
  } catch (std::exception const& e) {
    EXPECT_THAT(e.what(), HasSubstr("exports no fabric handles")) << e.what();
  }
  EXPECT_EQ(a_.holders("peertest/noimex"), 1u);  // its producer alone
}

/// Both nodes' configurations require fabric handles of their GPU pool,
/// which no IMEX channel allows: neither serves it, and each one's peer
/// says which pool is missing and why (rmmctl peers on both sides).
class PeeringWithoutImexRequired : public NodesWithoutImex<true> {};

TEST_F(PeeringWithoutImexRequired, EachPeerNamesThePoolTheOtherDoesNotServeAndWhy)
{
  for (auto const& [node, other] : {std::pair{&b_, "nodeA"}, std::pair{&a_, "nodeB"}}) {
    ASSERT_TRUE(eventually([&] { return node->peer(other).has_value(); }, 30s)) << other;
    auto const seen = node->peer(other);
    EXPECT_FALSE(seen->probe_ok()) << other;
    EXPECT_THAT(seen->problem(),
                HasSubstr("pool 'gpu' is not served: it requires fabric handles, but"))
        << other << ": " << seen->problem();
    EXPECT_THAT(seen->problem(), HasSubstr("IMEX channel")) << other;
    auto const shown = run({program_path("rmmctl").string(),
                            "--runtime-dir",
                            node->daemon->runtime_dir().string(),
                            "peers"},
                           30s);
    EXPECT_EQ(shown.status, 0) << shown.out;
    EXPECT_THAT(shown.out, HasSubstr("is not served")) << shown.out;
  }
}

}  // namespace
}  // namespace rmmd::test
