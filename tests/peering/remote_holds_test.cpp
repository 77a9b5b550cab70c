// Remote holds in the core and the serving node's ledger (leases, Hello's
// incarnations), and the grants' checks: a real core with the host backend,
// and below it a backend whose buffers carry a fabric handle (no GPU here);
// two nodes in this process, in plaintext and over mutual TLS.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/peering/peer_grants.hpp"
#include "daemon/peering/peering.hpp"
#include "daemon/peering/remote_hold_ledger.hpp"
#include "daemon/wire/status_mapping.hpp"
#include "tests/tools/test_certs.hpp"

#include "tests/tools/child_process_inl.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <thread>

namespace rmmd::peering {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

/// The host backend, but every shared buffer has an allocation of its own
/// with a (made up) fabric handle, as a CUDA fabric pool's buffers do.
class fabric_like_backend final : public core::pool_backend {
 public:
  fabric_like_backend(std::string name, std::size_t bytes) : host_(std::move(name), bytes) {}
  [[nodiscard]] core::backend_traits traits() const noexcept override
  {
    return {.name = "fabric-like", .space = core::memory_space::device};
  }
  [[nodiscard]] std::size_t capacity() const noexcept override
  {
    return host_.capacity();
  }
  absl::StatusOr<core::backend_allocation> allocate(std::size_t bytes,
                                                    std::size_t alignment) override
  {
    return host_.allocate(bytes, alignment);
  }
  void deallocate(core::backend_allocation const& block) noexcept override
  {
    host_.deallocate(block);
  }
  absl::StatusOr<core::shared_allocation> allocate_shared(std::size_t bytes,
                                                          std::size_t alignment) override
  {
    auto block = allocate(bytes, alignment);
    if (!block.ok()) { return block.status(); }
    return core::shared_allocation{.block         = *block,
                                   .fabric_handle = std::vector<std::byte>(64, std::byte{0x5a}),
                                   .driver_handle = 1};
  }
  void deallocate_shared(core::shared_allocation const& memory) noexcept override
  {
    deallocate(memory.block);
  }

 private:
  backends::host::host_backend host_;
};

class RemoteHolds : public ::testing::Test {
 protected:
  void SetUp() override
  {
    core_ = std::make_unique<core::daemon_core>(
        core::core_options{.access = {.uids = {::getuid()}, .gids = {}}, .quotas = {}});
    host_ =
        core_->pools().add_pool({.name = "host", .handle_types = {core::handle_type::host_offset}},
                                std::make_unique<backends::host::host_backend>("host", 1 << 20));
    fabric_ = core_->pools().add_pool(
        {.name = "fab", .gpu_uuid = "GPU-test", .handle_types = {core::handle_type::fabric}},
        std::make_unique<fabric_like_backend>("fab", 1 << 20));
    auto grant = core_->sessions().open_session(
        {.pid = ::getpid(), .uid = ::getuid(), .gid = ::getgid()}, "test", "creator");
    ASSERT_TRUE(grant.ok()) << grant.status();
    session_ = grant->id;
  }
  void TearDown() override
  {
    ledger_.reset();
    if (core_) { core_->close_session(session_); }
  }

  core::buffer_id publish(std::string const& name, core::pool_id pool, bool allow_writers = false)
  {
    auto b = core_->buffers().create_buffer(
        session_, name, pool, 4096, {.allow_writers = allow_writers});
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(core_->buffers().publish_buffer(session_, b->id).ok());
    return b->id;
  }
  core::buffer_id publish_labelled(std::string const& name,
                                   core::pool_id pool,
                                   std::map<std::string, std::string> labels)
  {
    auto b = core_->buffers().create_buffer(session_, name, pool, 4096, {});
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_TRUE(core_->buffers()
                    .set_buffer_manifest(session_, b->id, core::buffer_manifest{.labels = labels})
                    .ok());
    EXPECT_TRUE(core_->buffers().publish_buffer(session_, b->id).ok());
    return b->id;
  }
  std::size_t holders(std::string const& name) const
  {
    for (auto const& b : core_->buffers().all()) {
      if (b.name == name) { return b.holders; }
    }
    return 0;
  }
  checked_open open_of(std::string name)
  {
    return checked_open{.name = std::move(name)};
  }

  std::unique_ptr<core::daemon_core> core_;
  std::unique_ptr<remote_hold_ledger> ledger_;
  core::pool_id host_{};
  core::pool_id fabric_{};
  core::session_id session_{};
};

TEST_F(RemoteHolds, AHostPoolBufferIsRefusedNamingThePool)
{
  publish("w/host", host_);
  auto r = core_->buffers().open_remote_buffer("w/host", {});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              HasSubstr("is in pool 'host', which exports no fabric handles; only a fabric pool's "
                        "buffers can be opened from another node"));
  EXPECT_TRUE(core_->buffers().remote_holds().empty());
  EXPECT_EQ(holders("w/host"), 1u);
}

TEST_F(RemoteHolds, UnknownAndUnpublishedAreNotFound)
{
  EXPECT_EQ(core_->buffers().open_remote_buffer("nope", {}).status().code(),
            absl::StatusCode::kNotFound);
  auto b = core_->buffers().create_buffer(session_, "w/unpublished", fabric_, 4096, {});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(core_->buffers().open_remote_buffer("w/unpublished", {}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RemoteHolds, AHoldKeepsADeletedBufferUntilClosed)
{
  publish("w/fab", fabric_);
  auto grant = core_->buffers().open_remote_buffer("w/fab", {});
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->grant.block.fabric_handle.size(), 64u);
  EXPECT_EQ(grant->gpu_uuid, "GPU-test");
  EXPECT_EQ(holders("w/fab"), 2u);
  ASSERT_TRUE(core_->buffers().close_buffer(session_, core_->buffers().all().front().id).ok());
  ASSERT_TRUE(core_->buffers().delete_buffer(session_, "w/fab").ok());
  ASSERT_EQ(core_->buffers().all().size(), 1u);  // the remote hold keeps it
  ASSERT_TRUE(core_->buffers().close_remote_hold(grant->hold).ok());
  EXPECT_TRUE(core_->buffers().all().empty());
  EXPECT_EQ(core_->buffers().close_remote_hold(grant->hold).code(), absl::StatusCode::kNotFound);
}

TEST_F(RemoteHolds, WritingNeedsTheBuffersAllowWriters)
{
  publish("w/ro", fabric_);
  core::buffer_open_options rw{.access = core::buffer_access::read_write};
  EXPECT_EQ(core_->buffers().open_remote_buffer("w/ro", rw).status().code(),
            absl::StatusCode::kPermissionDenied);
  publish("w/rw", fabric_, true);
  EXPECT_TRUE(core_->buffers().open_remote_buffer("w/rw", rw).ok());
}

TEST_F(RemoteHolds, TheLedgerWantsAHelloFirst)
{
  publish("w/fab", fabric_);
  ledger_ = std::make_unique<remote_hold_ledger>(*core_, 1000ms);
  auto r  = ledger_->open("CN=b", 7, open_of("w/fab"), {});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("has not said Hello"));
  // The calling daemon knows to say Hello from the answer's details, not
  // from its words.
  EXPECT_TRUE(wire::hello_needed(wire::to_grpc_status(r.status())));
  ledger_->hello("CN=b", "nodeB", "ipv4:1", 7, false, "no GPU");
  auto stale = ledger_->open("CN=b", 8, open_of("w/fab"), {});
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(wire::hello_needed(wire::to_grpc_status(stale.status())));
  EXPECT_TRUE(ledger_->open("CN=b", 7, open_of("w/fab"), {}).ok());
  EXPECT_EQ(holders("w/fab"), 2u);
}

TEST_F(RemoteHolds, AHoldNotRenewedWithinTheLeaseEnds)
{
  publish("w/fab", fabric_);
  ledger_ = std::make_unique<remote_hold_ledger>(*core_, 1000ms);
  ledger_->hello("CN=b", "nodeB", "ipv4:1", 7, false, "");
  auto kept  = ledger_->open("CN=b", 7, open_of("w/fab"), {});
  auto stale = ledger_->open("CN=b", 7, open_of("w/fab"), {});
  ASSERT_TRUE(kept.ok() && stale.ok());
  EXPECT_EQ(holders("w/fab"), 3u);
  // Only `kept` is renewed; the clock is moved, not waited for.
  auto const start = remote_hold_ledger::clock::now();
  EXPECT_EQ(ledger_->expire(start + 800ms), 0u);
  ASSERT_TRUE(ledger_->renew("CN=b", 7, {kept->hold}, start + 800ms).ok());
  EXPECT_EQ(ledger_->expire(start + 1100ms), 1u);
  EXPECT_EQ(ledger_->expiries(), 1u);
  EXPECT_EQ(holders("w/fab"), 2u);
  auto unknown = ledger_->renew("CN=b", 7, {kept->hold, stale->hold});
  ASSERT_TRUE(unknown.ok());
  EXPECT_THAT(*unknown, ::testing::ElementsAre(stale->hold));
  // Another identity cannot close or renew B's hold.
  ledger_->hello("CN=c", "nodeC", "ipv4:2", 9, false, "");
  ASSERT_TRUE(ledger_->close("CN=c", 9, {kept->hold}).ok());
  EXPECT_EQ(holders("w/fab"), 2u);
  ASSERT_TRUE(ledger_->close("CN=b", 7, {kept->hold}).ok());
  EXPECT_EQ(holders("w/fab"), 1u);
}

TEST_F(RemoteHolds, ANewIncarnationEndsTheOldOnesHolds)
{
  publish("w/fab", fabric_);
  ledger_ = std::make_unique<remote_hold_ledger>(*core_, 1000ms);
  ledger_->hello("CN=b", "nodeB", "ipv4:1", 7, false, "");
  ASSERT_TRUE(ledger_->open("CN=b", 7, open_of("w/fab"), {}).ok());
  EXPECT_EQ(holders("w/fab"), 2u);
  ledger_->hello("CN=b", "nodeB", "ipv4:1", 8, false, "");
  EXPECT_EQ(holders("w/fab"), 1u);
  EXPECT_TRUE(core_->buffers().remote_holds().empty());
}

TEST_F(RemoteHolds, NodesSharingACertificateKeepEachOthersHolds)
{
  // A DaemonSet gives every node the same Secret: one identity, two nodes.
  publish("w/fab", fabric_);
  ledger_ = std::make_unique<remote_hold_ledger>(*core_, 1000ms);
  ledger_->hello("CN=ds", "node1", "ipv4:1", 11, false, "");
  ledger_->hello("CN=ds", "node2", "ipv4:2", 22, false, "");
  auto one = ledger_->open("CN=ds", 11, open_of("w/fab"), {});
  auto two = ledger_->open("CN=ds", 22, open_of("w/fab"), {});
  ASSERT_TRUE(one.ok() && two.ok());
  EXPECT_EQ(holders("w/fab"), 3u);
  // Each says Hello again (a redial, the same daemon): nothing ends.
  ledger_->hello("CN=ds", "node1", "ipv4:1", 11, false, "");
  ledger_->hello("CN=ds", "node2", "ipv4:2", 22, false, "");
  EXPECT_EQ(holders("w/fab"), 3u);
  // Each renews and closes only its own.
  auto unknown = ledger_->renew("CN=ds", 22, {one->hold, two->hold});
  ASSERT_TRUE(unknown.ok()) << unknown.status();
  EXPECT_THAT(*unknown, ::testing::ElementsAre(one->hold));
  ASSERT_TRUE(ledger_->close("CN=ds", 22, {one->hold}).ok());
  EXPECT_EQ(holders("w/fab"), 3u);
  // node2's daemon starts again: its hold ends, node1's stays.
  ledger_->hello("CN=ds", "node2", "ipv4:2", 23, false, "");
  EXPECT_EQ(holders("w/fab"), 2u);
  EXPECT_EQ(ledger_->renew("CN=ds", 22, {two->hold}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto kept = ledger_->renew("CN=ds", 11, {one->hold});
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->empty());
  EXPECT_TRUE(ledger_->open("CN=ds", 23, open_of("w/fab"), {}).ok());
  EXPECT_EQ(holders("w/fab"), 3u);
  auto peers = ledger_->accepted();
  ASSERT_EQ(peers.size(), 2u);
  EXPECT_EQ(peers[0].node_name, "node1");
  EXPECT_EQ(peers[0].holds, 1u);
  EXPECT_EQ(peers[1].node_name, "node2");
  EXPECT_EQ(peers[1].holds, 1u);
}

TEST_F(RemoteHolds, ACallersVerdictOnOurProbeShowsOnceItsRenewalsSayIt)
{
  ledger_ = std::make_unique<remote_hold_ledger>(*core_, 1000ms);
  ledger_->hello("CN=b", "nodeB", "ipv4:1", 7, true, "");
  ASSERT_EQ(ledger_->accepted().size(), 1u);
  EXPECT_FALSE(ledger_->accepted()[0].it_imported_our_probe);  // it has not said yet
  ledger_->their_verdict("CN=b", 7, false, "no IMEX channel");
  EXPECT_FALSE(ledger_->accepted()[0].it_imported_our_probe);
  EXPECT_EQ(ledger_->accepted()[0].our_probe_problem, "no IMEX channel");
  ledger_->their_verdict("CN=b", 8, true, "");  // not its incarnation: nothing
  EXPECT_FALSE(ledger_->accepted()[0].it_imported_our_probe);
  ledger_->their_verdict("CN=b", 7, true, "");
  EXPECT_TRUE(ledger_->accepted()[0].it_imported_our_probe);
  EXPECT_EQ(ledger_->accepted()[0].our_probe_problem, "");
}

TEST_F(RemoteHolds, StopEndsEveryHold)
{
  publish("w/fab", fabric_);
  ledger_ = std::make_unique<remote_hold_ledger>(*core_, 1000ms);
  ledger_->start_reaper();
  ledger_->hello("CN=b", "nodeB", "ipv4:1", 7, false, "");
  ASSERT_TRUE(ledger_->open("CN=b", 7, open_of("w/fab"), {}).ok());
  ledger_->stop();
  EXPECT_TRUE(core_->buffers().remote_holds().empty());
  EXPECT_EQ(holders("w/fab"), 1u);
}

TEST_F(RemoteHolds, ForeignHoldsAreLetGoOfByCloseAndBySessionEnd)
{
  std::vector<core::buffer_id> released;
  core_->buffers().set_foreign_release_notifier(
      [&](core::buffer_id id) { released.push_back(id); });
  auto const own = publish("w/own", host_);
  auto a         = core_->buffers().add_foreign_hold(session_);
  auto b         = core_->buffers().add_foreign_hold(session_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, own);
  EXPECT_NE(*a, *b);
  ASSERT_TRUE(core_->buffers().close_buffer(session_, *a).ok());
  EXPECT_THAT(released, ::testing::ElementsAre(*a));
  core_->close_session(session_);
  EXPECT_THAT(released, ::testing::ElementsAre(*a, *b));
}

TEST_F(RemoteHolds, HoldIdsDoNotStartAgainAtOne)
{
  // A daemon that started again must not give out its last one's ids: a
  // peer's stale close of one would end another's hold.
  publish("w/fab", fabric_);
  auto first = core_->buffers().open_remote_buffer("w/fab", {});
  ASSERT_TRUE(first.ok()) << first.status();
  core::daemon_core other(
      core::core_options{.access = {.uids = {::getuid()}, .gids = {}}, .quotas = {}});
  auto const pool = other.pools().add_pool(
      {.name = "fab", .gpu_uuid = "GPU-test", .handle_types = {core::handle_type::fabric}},
      std::make_unique<fabric_like_backend>("fab", 1 << 20));
  auto s = other.sessions().open_session(
      {.pid = ::getpid(), .uid = ::getuid(), .gid = ::getgid()}, "t", "c");
  ASSERT_TRUE(s.ok());
  auto b = other.buffers().create_buffer(s->id, "w/fab", pool, 4096, {});
  ASSERT_TRUE(b.ok() && other.buffers().publish_buffer(s->id, b->id).ok());
  auto second = other.buffers().open_remote_buffer("w/fab", {});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE(first->hold, second->hold);
  EXPECT_LT(first->hold, std::uint64_t{1} << 63);
  ASSERT_TRUE(other.buffers().close_remote_hold(second->hold).ok());
  other.close_session(s->id);
}

std::vector<std::string> names_of(std::vector<core::buffer_info> const& buffers)
{
  std::vector<std::string> out;
  for (auto const& b : buffers) { out.push_back(b.name); }
  return out;
}

TEST_F(RemoteHolds, AListingShowsWhatTheGrantLetsTheCallerOpenAndNothingElse)
{
  publish_labelled("w/b", fabric_, {{"model", "m1"}});
  publish_labelled("w/a", fabric_, {{"model", "m2"}});
  publish("w/host", host_);      // no fabric handle: a remote open is refused
  publish("secret/x", fabric_);  // outside the grant
  ASSERT_TRUE(core_->buffers().create_buffer(session_, "w/unpublished", fabric_, 4096, {}).ok());
  ledger_ = std::make_unique<remote_hold_ledger>(*core_, 60s);
  ledger_->hello("CN=b", "nodeB", "ipv4:1", 7, false, "");
  std::vector<config::peer_grant_settings> const grants{
      {.identity = "CN=b", .name_prefixes = {"w/"}, .allow_writers = false},
      {.identity = "CN=other", .name_prefixes = {"secret/"}, .allow_writers = false}};

  v1::ListRemoteBuffersRequest request;
  auto all = check_remote_list(grants, "CN=b", request);
  ASSERT_TRUE(all.ok()) << all.status();
  auto listed = ledger_->list("CN=b", 7, *all);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_THAT(names_of(*listed), ::testing::ElementsAre("w/a", "w/b"));  // by name
  EXPECT_EQ(listed->front().labels.at("model"), "m2");

  auto* label = request.add_labels();
  label->set_key("model");
  label->set_value("m1");
  auto by_label = check_remote_list(grants, "CN=b", request);
  ASSERT_TRUE(by_label.ok());
  EXPECT_THAT(names_of(*ledger_->list("CN=b", 7, *by_label)), ::testing::ElementsAre("w/b"));

  // An identity no grant names sees nothing; a stale incarnation is refused.
  ledger_->hello("CN=stranger", "nodeC", "ipv4:2", 9, false, "");
  auto stranger = check_remote_list(grants, "CN=stranger", v1::ListRemoteBuffersRequest{});
  ASSERT_TRUE(stranger.ok());
  EXPECT_TRUE(ledger_->list("CN=stranger", 9, *stranger)->empty());
  auto stale = ledger_->list("CN=b", 8, *all);
  ASSERT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.status().message(), HasSubstr("list buffers from another node"));

  *request.add_labels() = *label;
  auto twice            = check_remote_list(grants, "CN=b", request);
  ASSERT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(twice.status().message(), HasSubstr("names label 'model' twice"));
  EXPECT_TRUE(core_->buffers().remote_holds().empty());  // a listing holds nothing
}

/// Until `done` holds, or false after 20 s (a bound, not a timing).
bool eventually(std::function<bool()> const& done)
{
  return test::eventually(done, 20s);
}

/// Node A (a core whose buffers carry fabric handles, and its peering) and
/// node B (a host core, and its peering dialing A), in this process over
/// plaintext gRPC on 127.0.0.1: A can start again on the same port.
class TwoNodes : public ::testing::Test {
 protected:
  struct node_a {
    std::unique_ptr<core::daemon_core> core;
    core::session_id session{};
    std::unique_ptr<peering> peers;
  };

  static node_a start_a(int port)
  {
    node_a a;
    a.core = std::make_unique<core::daemon_core>(
        core::core_options{.access = {.uids = {::getuid()}, .gids = {}}, .quotas = {}});
    auto pool = a.core->pools().add_pool(
        {.name = "fab", .gpu_uuid = "GPU-test", .handle_types = {core::handle_type::fabric}},
        std::make_unique<fabric_like_backend>("fab", 1 << 20));
    auto s = a.core->sessions().open_session(
        {.pid = ::getpid(), .uid = ::getuid(), .gid = ::getgid()}, "a", "c");
    EXPECT_TRUE(s.ok());
    a.session = s->id;
    auto b    = a.core->buffers().create_buffer(a.session, "w/fab", pool, 4096, {});
    EXPECT_TRUE(b.ok() && a.core->buffers().publish_buffer(a.session, b->id).ok());
    config::peering_settings settings{
        .node_name                    = "nodeA",
        .listen_address               = "127.0.0.1:" + std::to_string(port),
        .insecure_plaintext_for_tests = true,
        .grants         = {{.identity = "*", .name_prefixes = {""}, .allow_writers = false}},
        .hold_lease     = 60s,
        .renew_interval = 50ms};
    a.peers = peering::start(*a.core, settings, no_fabric_probe());
    EXPECT_NE(a.peers, nullptr);
    return a;
  }
  static void stop_a(node_a& a)
  {
    a.peers.reset();
    a.core->close_session(a.session);
    a.core.reset();
  }

  void SetUp() override
  {
    a_ = start_a(0);
    ASSERT_NE(a_.peers, nullptr);
    port_   = a_.peers->listening_port();
    b_core_ = std::make_unique<core::daemon_core>(
        core::core_options{.access = {.uids = {::getuid()}, .gids = {}}, .quotas = {}});
    b_core_->pools().add_pool({.name = "host", .handle_types = {core::handle_type::host_offset}},
                              std::make_unique<backends::host::host_backend>("host", 1 << 20));
    auto s = b_core_->sessions().open_session(
        {.pid = ::getpid(), .uid = ::getuid(), .gid = ::getgid()}, "b", "client");
    ASSERT_TRUE(s.ok());
    b_session_ = s->id;
    config::peering_settings settings{
        .node_name                    = "nodeB",
        .insecure_plaintext_for_tests = true,
        .peers          = {{.name = "nodeA", .address = "127.0.0.1:" + std::to_string(port_)}},
        .hold_lease     = 60s,
        .renew_interval = 50ms};
    b_ = peering::start(*b_core_, settings, no_fabric_probe());
    ASSERT_NE(b_, nullptr);
  }
  void TearDown() override
  {
    if (b_) { b_->stop(); }
    if (b_core_) { b_core_->close_session(b_session_); }
    b_.reset();
    if (a_.core) { stop_a(a_); }
  }

  v1::PeerInfo b_view()
  {
    v1::ListPeersResponse r;
    b_->list_peers(&r);
    return r.peers_size() > 0 ? r.peers(0) : v1::PeerInfo{};
  }
  absl::StatusOr<core::buffer_id> open_on_a()
  {
    v1::OpenBufferRequest request;
    request.set_name("w/fab");
    request.set_peer("nodeA");
    if (!eventually([&] { return b_view().state() == "probe_failed"; })) {
      return absl::UnavailableError("B's link to A never became usable");
    }
    v1::BufferGrant grant;
    if (auto s = b_->open(b_session_, request, &grant); !s.ok()) { return s; }
    return grant.buffer_id();
  }

  absl::StatusOr<v1::ListBuffersResponse> list_on_a(std::string const& prefix = {})
  {
    if (!eventually([&] { return b_view().state() == "probe_failed"; })) {
      return absl::UnavailableError("B's link to A never became usable");
    }
    v1::ListBuffersRequest request;
    request.set_peer("nodeA");
    request.set_name_prefix(prefix);
    v1::ListBuffersResponse reply;
    if (auto s = b_->list(request, &reply); !s.ok()) { return s; }
    return reply;
  }

  node_a a_;
  int port_{};
  std::unique_ptr<core::daemon_core> b_core_;
  core::session_id b_session_{};
  std::unique_ptr<peering> b_;
};

TEST_F(TwoNodes, AfterAStartsAgainBsOldHoldIsDroppedAndItsReleaseEndsNoNewHold)
{
  auto old_hold = open_on_a();
  ASSERT_TRUE(old_hold.ok()) << old_hold.status();
  EXPECT_EQ(a_.core->buffers().remote_holds().size(), 1u);
  EXPECT_EQ(b_view().holds_we_have(), 1u);

  stop_a(a_);
  a_ = start_a(port_);
  ASSERT_NE(a_.peers, nullptr);
  // B's link says Hello to the new daemon and drops the hold of the old.
  ASSERT_TRUE(eventually([&] { return b_view().holds_we_have() == 0; })) << b_view().DebugString();

  auto new_hold = open_on_a();
  ASSERT_TRUE(new_hold.ok()) << new_hold.status();
  ASSERT_EQ(a_.core->buffers().remote_holds().size(), 1u);
  auto const kept_there = a_.core->buffers().remote_holds().begin()->first;

  // The client lets go of the old one: nothing goes to A. Then a third hold
  // opened and closed: its close is sent after whatever the old one's was.
  ASSERT_TRUE(b_core_->buffers().close_buffer(b_session_, *old_hold).ok());
  auto third = open_on_a();
  ASSERT_TRUE(third.ok()) << third.status();
  ASSERT_EQ(a_.core->buffers().remote_holds().size(), 2u);
  ASSERT_TRUE(b_core_->buffers().close_buffer(b_session_, *third).ok());
  ASSERT_TRUE(eventually([&] { return a_.core->buffers().remote_holds().size() == 1; }));
  EXPECT_EQ(a_.core->buffers().remote_holds().begin()->first, kept_there);
  EXPECT_EQ(b_view().holds_we_have(), 1u);
}

TEST_F(TwoNodes, AStoppingBRefusesOpensAndEndsItsHoldsOnA)
{
  auto held = open_on_a();
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(a_.core->buffers().remote_holds().size(), 1u);
  b_->stop();
  EXPECT_TRUE(a_.core->buffers().remote_holds().empty());
  v1::OpenBufferRequest request;
  request.set_name("w/fab");
  request.set_peer("nodeA");
  v1::BufferGrant grant;
  auto s = b_->open(b_session_, request, &grant);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(s.message(), HasSubstr("stopping"));
  EXPECT_TRUE(a_.core->buffers().remote_holds().empty());
}

/// A (fabric-like buffers) and B, each with its peering, over mutual TLS
/// with certificates from scripts/make-test-certs.sh; B's certificate files
/// are its own copies, which the test replaces before B's reload.
class TwoNodesOverTls : public test::certs_suite {
 protected:
  static config::peer_tls_files tls(std::string const& node)
  {
    return {.certificate = certs_ / (node + ".pem"),
            .private_key = certs_ / (node + ".key"),
            .trusted_ca  = certs_ / "ca.pem"};
  }
  /// `from`'s certificate and key become B's files.
  static void give_b(std::string const& from)
  {
    for (std::string ext : {".pem", ".key"}) {
      std::filesystem::copy_file(certs_ / (from + ext),
                                 certs_ / ("b-live" + ext),
                                 std::filesystem::copy_options::overwrite_existing);
    }
  }

  void SetUp() override
  {
    if (HasFatalFailure()) { return; }
    a_core_ = std::make_unique<core::daemon_core>(
        core::core_options{.access = {.uids = {::getuid()}, .gids = {}}, .quotas = {}});
    auto pool = a_core_->pools().add_pool(
        {.name = "fab", .gpu_uuid = "GPU-test", .handle_types = {core::handle_type::fabric}},
        std::make_unique<fabric_like_backend>("fab", 1 << 20));
    auto s = a_core_->sessions().open_session(
        {.pid = ::getpid(), .uid = ::getuid(), .gid = ::getgid()}, "a", "c");
    ASSERT_TRUE(s.ok());
    a_session_ = s->id;
    auto b     = a_core_->buffers().create_buffer(a_session_, "w/fab", pool, 4096, {});
    ASSERT_TRUE(b.ok() && a_core_->buffers().publish_buffer(a_session_, b->id).ok());
    a_ = peering::start(
        *a_core_,
        {.node_name      = "nodeA",
         .listen_address = "127.0.0.1:0",
         .tls            = tls("nodeA"),
         .grants = {{.identity = "CN=rmmd-nodeB", .name_prefixes = {""}, .allow_writers = false}},
         .hold_lease     = 60s,
         .renew_interval = 50ms},
        no_fabric_probe());
    ASSERT_NE(a_, nullptr);

    b_core_ = std::make_unique<core::daemon_core>(
        core::core_options{.access = {.uids = {::getuid()}, .gids = {}}, .quotas = {}});
    b_core_->pools().add_pool({.name = "host", .handle_types = {core::handle_type::host_offset}},
                              std::make_unique<backends::host::host_backend>("host", 1 << 20));
    auto bs = b_core_->sessions().open_session(
        {.pid = ::getpid(), .uid = ::getuid(), .gid = ::getgid()}, "b", "client");
    ASSERT_TRUE(bs.ok());
    b_session_ = bs->id;
    give_b("nodeB");
    b_settings_ = {.node_name      = "nodeB",
                   .tls            = tls("b-live"),
                   .peers          = {{.name     = "nodeA",
                                       .address  = "127.0.0.1:" + std::to_string(a_->listening_port()),
                                       .identity = "CN=rmmd-nodeA",
                                       .tls_server_name = "localhost"}},
                   .hold_lease     = 60s,
                   .renew_interval = 50ms};
    b_          = peering::start(*b_core_, b_settings_, no_fabric_probe());
    ASSERT_NE(b_, nullptr);
  }
  void TearDown() override
  {
    if (b_) { b_->stop(); }
    if (b_core_) { b_core_->close_session(b_session_); }
    b_.reset();
    a_.reset();
    if (a_core_) { a_core_->close_session(a_session_); }
  }

  v1::PeerInfo b_view()
  {
    v1::ListPeersResponse r;
    b_->list_peers(&r);
    return r.peers_size() > 0 ? r.peers(0) : v1::PeerInfo{};
  }

  std::unique_ptr<core::daemon_core> a_core_;
  core::session_id a_session_{};
  std::unique_ptr<peering> a_;
  std::unique_ptr<core::daemon_core> b_core_;
  core::session_id b_session_{};
  config::peering_settings b_settings_;
  std::unique_ptr<peering> b_;
};

TEST_F(TwoNodesOverTls, BsHoldOnAOutlivesItsNewCertificatesAndEndsWhenClosed)
{
  ASSERT_TRUE(eventually([&] { return b_view().state() == "probe_failed"; }))
      << b_view().DebugString();
  v1::OpenBufferRequest request;
  request.set_name("w/fab");
  request.set_peer("nodeA");
  v1::BufferGrant grant;
  auto opened = b_->open(b_session_, request, &grant);
  ASSERT_TRUE(opened.ok()) << opened;
  ASSERT_EQ(a_core_->buffers().remote_holds().size(), 1u);
  auto const hold_on_a = a_core_->buffers().remote_holds().begin()->first;

  // A certificate A does not trust: the link fails at once, the hold stays
  // on both sides (the lease is long).
  give_b("nodeB-other-ca");
  b_->reload(b_settings_);
  ASSERT_TRUE(eventually([&] { return b_view().state() == "unreachable"; }))
      << b_view().DebugString();
  EXPECT_EQ(b_view().holds_we_have(), 1u);
  EXPECT_EQ(a_core_->buffers().remote_holds().size(), 1u);

  // B's good certificate again: a new connection from the same node and
  // incarnation continues the hold; closing it ends it on A.
  give_b("nodeB");
  b_->reload(b_settings_);
  ASSERT_TRUE(eventually([&] { return b_view().state() == "probe_failed"; }))
      << b_view().DebugString();
  EXPECT_EQ(b_view().holds_we_have(), 1u);
  ASSERT_EQ(a_core_->buffers().remote_holds().size(), 1u);
  EXPECT_EQ(a_core_->buffers().remote_holds().begin()->first, hold_on_a);
  ASSERT_TRUE(b_core_->buffers().close_buffer(b_session_, grant.buffer_id()).ok());
  EXPECT_TRUE(eventually([&] { return a_core_->buffers().remote_holds().empty(); }));
  EXPECT_EQ(b_view().holds_we_have(), 0u);
}

TEST_F(TwoNodes, BListsAsBuffersThroughItsGrantAndOpensOneByItsLabels)
{
  auto const pool = a_.core->pools().list().back().id;
  for (auto const& [name, model] : {std::pair{"w/x", "m1"}, std::pair{"secret/y", "m1"}}) {
    auto b = a_.core->buffers().create_buffer(a_.session, name, pool, 4096, {});
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_TRUE(a_.core->buffers()
                    .set_buffer_manifest(
                        a_.session, b->id, core::buffer_manifest{.labels = {{"model", model}}})
                    .ok());
    ASSERT_TRUE(a_.core->buffers().publish_buffer(a_.session, b->id).ok());
  }
  auto listed = list_on_a();
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->buffers_size(), 3) << listed->DebugString();  // w/fab too
  EXPECT_EQ(listed->buffers(0).name(), "secret/y");
  for (auto const& b : listed->buffers()) {
    EXPECT_EQ(b.peer(), "nodeA");
    EXPECT_EQ(b.state(), v1::BUFFER_STATE_PUBLISHED);
    EXPECT_EQ(b.creator_uid(), 0u);  // A's business
    EXPECT_EQ(b.buffer_id(), 0u);
  }
  EXPECT_FALSE(listed->truncated());

  // A narrows its grant to w/: B no longer sees secret/y.
  config::peering_settings narrowed{
      .node_name                    = "nodeA",
      .insecure_plaintext_for_tests = true,
      .grants = {{.identity = "*", .name_prefixes = {"w/"}, .allow_writers = false}}};
  a_.peers->reload(narrowed);
  v1::ListBuffersRequest by_label;
  by_label.set_peer("nodeA");
  auto* label = by_label.add_labels();
  label->set_key("model");
  label->set_value("m1");
  v1::ListBuffersResponse reply;
  ASSERT_TRUE(b_->list(by_label, &reply).ok());
  ASSERT_EQ(reply.buffers_size(), 1) << reply.DebugString();
  EXPECT_EQ(reply.buffers(0).name(), "w/x");
  EXPECT_EQ(reply.buffers(0).labels(0).value(), "m1");

  // What an open by labels then asks: the one name, guarded by the labels.
  v1::OpenBufferRequest open;
  open.set_name(reply.buffers(0).name());
  open.set_peer("nodeA");
  *open.mutable_expect_labels() = by_label.labels();
  v1::BufferGrant grant;
  ASSERT_TRUE(b_->open(b_session_, open, &grant).ok());
  EXPECT_EQ(grant.manifest().labels(0).value(), "m1");
  EXPECT_EQ(a_.core->buffers().remote_holds().size(), 1u);
}

TEST_F(TwoNodes, AListingOfAnUnknownNodeIsNotFoundAndOfAGoneOneUnavailable)
{
  v1::ListBuffersRequest request;
  request.set_peer("nodeZ");
  v1::ListBuffersResponse reply;
  auto unknown = b_->list(request, &reply);
  ASSERT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown.message(),
            "list buffers: no peer 'nodeZ' in peering.peers (see `rmmctl peers`)");

  ASSERT_TRUE(list_on_a().ok());
  stop_a(a_);
  request.set_peer("nodeA");
  absl::Status gone;
  // The first call after A went may be the one that finds it gone.
  ASSERT_TRUE(eventually([&] {
    gone = b_->list(request, &reply);
    return gone.code() == absl::StatusCode::kUnavailable &&
           gone.message().find("is unreachable") != std::string_view::npos;
  })) << gone;
  EXPECT_THAT(gone.message(), HasSubstr("peer 'nodeA' at 127.0.0.1:"));
  EXPECT_THAT(gone.message(), HasSubstr("try again once `rmmctl peers` shows it ready"));
}

TEST(PeerGrants, HelloNeedsAGrantOrAPeersIdentity)
{
  std::vector<config::peer_grant_settings> grants{
      {.identity = "CN=rmmd-nodeB", .name_prefixes = {}, .allow_writers = false}};
  std::vector<std::string> peers{"CN=rmmd-nodeC"};
  EXPECT_TRUE(check_hello(grants, peers, "CN=rmmd-nodeB").ok());
  EXPECT_TRUE(check_hello(grants, peers, "CN=rmmd-nodeC").ok());
  auto refused = check_hello(grants, peers, "CN=stranger");
  ASSERT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(),
              HasSubstr("peer 'CN=stranger' may not peer with this node: no peering.grants entry "
                        "names its identity"));
  EXPECT_EQ(check_hello(grants, peers, "").code(), absl::StatusCode::kPermissionDenied);
  grants.push_back({.identity = "*", .name_prefixes = {"public/"}, .allow_writers = false});
  EXPECT_TRUE(check_hello(grants, {}, "CN=stranger").ok());
  EXPECT_TRUE(check_hello(grants, {}, "").ok());  // plaintext: only "*"
}

TEST(PeerGrants, IdentityAndPrefixDecide)
{
  std::vector<config::peer_grant_settings> grants{
      {.identity = "CN=rmmd-nodeB", .name_prefixes = {"models/"}, .allow_writers = false},
      {.identity = "*", .name_prefixes = {"public/"}, .allow_writers = true}};
  v1::RemoteOpenRequest r;
  r.set_name("models/llama");
  EXPECT_TRUE(check_remote_open(grants, "CN=rmmd-nodeB", r).ok());
  auto denied = check_remote_open(grants, "CN=stranger", r);
  ASSERT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(denied.status().message(),
            "peer 'CN=stranger' may not open buffer 'models/llama' (no grant in peering.grants "
            "names it)");
  r.set_access(v1::BUFFER_ACCESS_READ_WRITE);
  EXPECT_EQ(check_remote_open(grants, "CN=rmmd-nodeB", r).status().code(),
            absl::StatusCode::kPermissionDenied);
  r.set_name("public/x");
  auto rw = check_remote_open(grants, "", r);  // plaintext: only "*"
  ASSERT_TRUE(rw.ok()) << rw.status();
  EXPECT_EQ(rw->how.access, core::buffer_access::read_write);
  r.set_access(static_cast<v1::BufferAccess>(7));
  EXPECT_EQ(check_remote_open(grants, "", r).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace rmmd::peering
