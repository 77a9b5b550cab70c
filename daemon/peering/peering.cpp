#include "daemon/peering/peering.hpp"

#include "daemon/log.hpp"
#include "daemon/peering/node_answer.hpp"
#include "daemon/wire/proto_convert.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace rmmd::peering {
namespace {

using namespace std::chrono_literals;

constexpr auto listener_swap_grace = 1s;

std::uint64_t random_incarnation()
{
  std::uint64_t n = 0;
  while (n == 0) {
    if (::getrandom(&n, sizeof(n), 0) != static_cast<ssize_t>(sizeof(n))) {
      n = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    }
  }
  return n;
}

absl::StatusOr<std::string> read_file(std::filesystem::path const& path, char const* what)
{
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrFormat("peering.tls.%s %s: %s", what, path.string(), std::strerror(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().empty()) {
    // Emptied since the config was checked (a copy half done), or a directory.
    return absl::FailedPreconditionError(
        absl::StrFormat("peering.tls.%s %s is empty", what, path.string()));
  }
  return text.str();
}

std::int64_t unix_ms(std::chrono::system_clock::time_point t)
{
  if (t == std::chrono::system_clock::time_point{}) { return 0; }
  return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
}

std::string label_value(std::string const& text)
{
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') { out += '\\'; }
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

/// What the links dial with: the TLS files' contents (nullptr: plaintext).
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(tls_material const* tls)
{
  if (tls == nullptr) { return grpc::InsecureChannelCredentials(); }
  grpc::SslCredentialsOptions options;
  options.pem_root_certs  = tls->trusted_ca;
  options.pem_private_key = tls->private_key;
  options.pem_cert_chain  = tls->certificate_chain;
  return grpc::SslCredentials(options);
}

}  // namespace

absl::StatusOr<tls_material> read_tls(config::peer_tls_files const& files)
{
  auto cert = read_file(files.certificate, "certificate_file");
  if (!cert.ok()) { return cert.status(); }
  auto key = read_file(files.private_key, "private_key_file");
  if (!key.ok()) { return key.status(); }
  auto ca = read_file(files.trusted_ca, "trusted_ca_file");
  if (!ca.ok()) { return ca.status(); }
  return tls_material{.certificate_chain = *std::move(cert),
                      .private_key       = *std::move(key),
                      .trusted_ca        = *std::move(ca)};
}

peering::peering(core::daemon_core& core,
                 config::peering_settings const& settings,
                 probe_exchange probes)
    : core_(core),
      settings_(settings),
      incarnation_(random_incarnation()),
      probes_(std::move(probes)),
      ledger_(core, settings.hold_lease),
      service_(settings.node_name, incarnation_, probes_, ledger_, settings.grants, settings.peers)
{
}

std::unique_ptr<peering> peering::start(core::daemon_core& core,
                                        config::peering_settings const& settings,
                                        probe_exchange probes)
{
  std::unique_ptr<peering> p(new peering(core, settings, std::move(probes)));
  std::optional<tls_material> tls;
  if (settings.insecure_plaintext_for_tests) {
    log::warn(
        "peering: insecure_plaintext_for_tests is set: the peer listener and links speak "
        "plaintext TCP, and anyone who reaches %s may open what the grant \"*\" allows; "
        "never in production",
        settings.listen_address.empty() ? std::string("this node") : settings.listen_address);
  } else {
    auto read = read_tls(*settings.tls);
    if (!read.ok()) {
      log::error("peering: %s", read.status().message());
      return nullptr;
    }
    tls = *std::move(read);
  }
  if (!p->listen(tls ? &*tls : nullptr) || !p->dial(tls ? &*tls : nullptr)) { return nullptr; }
  p->ledger_.start_reaper();
  core.buffers().set_foreign_release_notifier(
      [raw = p.get()](core::buffer_id id) { raw->released(id); });
  log::info(
      "peering: node '%s', %d peer(s) to dial%s; probe: %s",
      settings.node_name,
      settings.peers.size(),
      settings.listen_address.empty()
          ? std::string(", no listener")
          : absl::StrFormat(", listening on %s", settings.listen_address),
      p->probes_.ours.fabric_handle.empty()
          ? p->probes_.ours.problem
          : absl::StrFormat("%d bytes on %s", p->probes_.ours.bytes, p->probes_.ours.gpu_uuid));
  return p;
}

peering::~peering()
{
  stop();
}

bool peering::listen(tls_material const* tls)
{
  if (settings_.listen_address.empty()) { return true; }
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (tls == nullptr) {
    credentials = grpc::InsecureServerCredentials();
  } else {
    grpc::SslServerCredentialsOptions options(
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    options.pem_root_certs = tls->trusted_ca;
    options.pem_key_cert_pairs.push_back({tls->private_key, tls->certificate_chain});
    credentials = grpc::SslServerCredentials(options);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(settings_.listen_address, credentials, &port);
  builder.RegisterService(&service_);
  // Peers ping every keepalive_ms while idle; allow it.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(settings_.keepalive.count() / 2));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(settings_.keepalive.count()));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(settings_.keepalive.count()));
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 50);
  auto server = builder.BuildAndStart();
  if (!server || port == 0) {
    log::error("peering: cannot listen on %s (in use, or not an address of this host)",
               settings_.listen_address);
    return false;
  }
  if (server_) {
    // The old one stops listening and sends GOAWAY at once, so every peer's
    // next connection reaches the new one; calls already on it (a renewal,
    // an open) get a moment to finish instead of failing.
    server_->Shutdown(std::chrono::system_clock::now() + listener_swap_grace);
  }
  server_ = std::move(server);
  port_   = port;
  return true;
}

bool peering::dial(tls_material const* tls)
{
  link_options const options{
      .node_name      = settings_.node_name,
      .incarnation    = incarnation_,
      .probes         = &probes_,
      .credentials    = channel_credentials(tls),
      .keepalive      = settings_.keepalive,
      .renew_interval = settings_.renew_interval,
      .peer_restarted = [this](peer_link const& link, std::vector<std::uint64_t> const& holds) {
        peer_restarted(link, holds);
      }};
  for (auto const& peer : settings_.peers) {
    links_.push_back(std::make_unique<peer_link>(peer, options));
  }
  for (auto& link : links_) { link->start(); }
  return true;
}

void peering::reload(config::peering_settings const& settings)
{
  service_.set_grants(settings.grants);
  settings_.grants = settings.grants;
  if (settings_.insecure_plaintext_for_tests || !settings.tls) { return; }
  auto tls = read_tls(*settings.tls);
  if (!tls.ok()) {
    log::error(
        "peering: reload keeps the old certificates (the listener's and the %d link(s)'): %s",
        links_.size(),
        tls.status().message());
    return;
  }
  settings_.tls = settings.tls;
  if (!settings_.listen_address.empty()) {
    // The new listener binds beside the old one (gRPC sets SO_REUSEPORT),
    // then the old one goes, closing its connections: a peer's channel
    // connects again, to the new one.
    if (listen(&*tls)) {
      log::info("peering: the listener on %s serves the reloaded certificate %s",
                settings_.listen_address,
                settings.tls->certificate.string());
    } else {
      log::error("peering: reload keeps the old listener");
    }
  }
  if (links_.empty()) { return; }
  auto const credentials = channel_credentials(&*tls);
  for (auto& link : links_) { link->use_credentials(credentials); }
  log::info(
      "peering: the %d link(s) now dial with the reloaded certificate %s (key %s, trusted CA %s) "
      "and say Hello again now; their holds stay",
      links_.size(),
      settings.tls->certificate.string(),
      settings.tls->private_key.string(),
      settings.tls->trusted_ca.string());
}

void peering::stop() noexcept
{
  {
    std::lock_guard lock(holds_mutex_);
    if (stopped_) { return; }
    stopped_ = true;
  }
  core_.buffers().set_foreign_release_notifier(nullptr);
  for (auto& link : links_) { link->stop(); }
  ledger_.stop();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
}

void peering::released(core::buffer_id id)
{
  peer_link* link    = nullptr;
  std::uint64_t hold = 0;
  {
    std::lock_guard lock(holds_mutex_);
    // Unknown: its session let go of it before open() recorded it (the
    // session ended right after add_foreign_hold). A tombstone tells open().
    auto [it, made] = foreign_.try_emplace(id, foreign_hold{.released = true});
    if (made) { return; }
    if (it->second.hold == 0) {
      it->second.released = true;  // open() closes it when its answer comes
      return;
    }
    if (!it->second.orphaned) {
      link = it->second.link;
      hold = it->second.hold;
    }
    foreign_.erase(it);
  }
  if (link != nullptr) { link->close(hold); }
}

void peering::peer_restarted(peer_link const& link, std::vector<std::uint64_t> const& holds)
{
  std::lock_guard lock(holds_mutex_);
  for (auto& [id, f] : foreign_) {
    if (f.link != &link || f.hold == 0 || f.orphaned) { continue; }
    if (std::find(holds.begin(), holds.end(), f.hold) == holds.end()) { continue; }
    // Its hold ended with the peer's old daemon: a later release sends nothing.
    f.orphaned = true;
  }
}

absl::Status peering::open(core::session_id session,
                           v1::OpenBufferRequest const& request,
                           v1::BufferGrant* reply)
{
  peer_link* link = nullptr;
  for (auto const& l : links_) {
    if (l->name() == request.peer()) { link = l.get(); }
  }
  if (link == nullptr) {
    return absl::NotFoundError(
        absl::StrFormat("open buffer '%s': no peer '%s' in peering.peers (see `rmmctl peers`)",
                        request.name(),
                        request.peer()));
  }
  auto who = core_.sessions().session_peer(session);
  if (!who.ok()) { return who.status(); }
  {
    std::lock_guard lock(holds_mutex_);
    if (stopped_) {
      return absl::UnavailableError(
          absl::StrFormat("open buffer '%s' on peer '%s': this daemon is stopping",
                          request.name(),
                          request.peer()));
    }
  }
  auto id = core_.buffers().add_foreign_hold(session);
  if (!id.ok()) { return id.status(); }
  bool released_already = false;
  {
    std::lock_guard lock(holds_mutex_);
    auto [it, made] = foreign_.try_emplace(*id, foreign_hold{.link = link});
    if (!made) {
      // A tombstone: released() came first (its session ended).
      released_already = true;
      foreign_.erase(it);
    }
  }
  if (released_already) {
    return absl::CancelledError(
        absl::StrFormat("open buffer '%s' on peer '%s': its session ended meanwhile",
                        request.name(),
                        request.peer()));
  }
  v1::RemoteOpenRequest ask;
  ask.set_name(request.name());
  ask.set_access(request.access());
  *ask.mutable_expect_labels() = request.expect_labels();
  ask.set_holder_session_id(session);
  ask.set_holder_uid(who->uid);
  ask.set_holder_pid(who->pid);
  auto grant = link->open(std::move(ask));
  if (!grant.ok()) {
    // Its id goes (released() marks the entry, which goes after).
    (void)core_.buffers().close_buffer(session, *id);
    std::lock_guard lock(holds_mutex_);
    foreign_.erase(*id);
    return node_answer(grant.status(), request.peer());
  }
  bool kept = false;
  {
    std::lock_guard lock(holds_mutex_);
    auto it = foreign_.find(*id);
    if (it != foreign_.end() && !it->second.released) {
      it->second.hold = grant->hold_id();
      kept            = true;
    } else if (it != foreign_.end()) {
      foreign_.erase(it);
    }
  }
  // Outside holds_mutex_: once stopping, either closes the hold there at once.
  if (kept) {
    link->keep(grant->hold_id(), grant->allocation_bytes());
  } else {
    link->close(grant->hold_id());  // its session ended meanwhile
  }
  reply->set_buffer_id(*id);
  reply->set_size(grant->size());
  reply->set_name(request.name());
  reply->set_state(v1::BUFFER_STATE_PUBLISHED);
  reply->set_access(grant->access());
  auto* vmm = reply->mutable_vmm();
  vmm->set_allocation_bytes(grant->allocation_bytes());
  vmm->set_has_fd(false);
  vmm->set_fabric_handle(grant->fabric_handle());
  if (grant->has_manifest()) { *reply->mutable_manifest() = grant->manifest(); }
  reply->set_peer(request.peer());
  // Only an anchor of the buffer's own GPU keeps its mapping warm.
  if (grant->has_anchor() && grant->anchor().gpu_uuid() == grant->gpu_uuid()) {
    *reply->mutable_peer_anchor() = grant->anchor();
  }
  return absl::OkStatus();
}

absl::Status peering::list(v1::ListBuffersRequest const& request, v1::ListBuffersResponse* reply)
{
  peer_link* link = nullptr;
  for (auto const& l : links_) {
    if (l->name() == request.peer()) { link = l.get(); }
  }
  if (link == nullptr) {
    return absl::NotFoundError(absl::StrFormat(
        "list buffers: no peer '%s' in peering.peers (see `rmmctl peers`)", request.peer()));
  }
  if (auto key = wire::repeated_label_key(request.labels())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "list buffers: the filter names label '%s' twice; name each label once", *key));
  }
  v1::ListRemoteBuffersRequest ask;
  ask.set_name_prefix(request.name_prefix());
  *ask.mutable_labels() = request.labels();
  auto answer           = link->list(std::move(ask));
  if (!answer.ok()) { return answer.status(); }
  for (auto const& e : answer->buffers()) {
    auto* b = reply->add_buffers();
    b->set_name(e.name());
    b->set_size(e.size());
    b->set_state(v1::BUFFER_STATE_PUBLISHED);
    b->set_persistent(e.persistent());
    b->set_created_unix_ms(e.created_unix_ms());
    b->set_allow_writers(e.allow_writers());
    b->set_holders(e.holders());
    *b->mutable_labels() = e.labels();
    b->set_tensor_count(e.tensor_count());
    b->set_peer(request.peer());
  }
  reply->set_truncated(answer->truncated());
  return absl::OkStatus();
}

void peering::list_peers(v1::ListPeersResponse* reply) const
{
  reply->set_node_name(settings_.node_name);
  auto accepted = ledger_.accepted();
  std::vector<bool> shown(accepted.size(), false);
  for (auto const& link : links_) {
    auto const v = link->view();
    auto* p      = reply->add_peers();
    p->set_node_name(v.peer.name);
    p->set_address(v.peer.address);
    p->set_identity(v.identity_seen);
    p->set_direction("dialed");
    p->set_state(std::string(state_name(v.state)));
    p->set_problem(v.problem);
    p->set_probe_ok(v.probe_ok);
    p->set_their_probe_ok(v.their_probe_ok);
    p->set_holds_we_have(static_cast<std::uint32_t>(v.holds));
    p->set_bytes_we_hold(v.bytes);
    p->set_last_contact_unix_ms(unix_ms(v.last_contact));
    // The caller that is this node: by the name it gives itself (several
    // nodes may share one certificate subject), else by the subject alone.
    auto const same_node = [&](accepted_peer const& a) {
      return a.node_name == v.peer.name ||
             (!v.node_name_seen.empty() && a.node_name == v.node_name_seen);
    };
    auto match = accepted.size();
    for (std::size_t i = 0; i < accepted.size() && match == accepted.size(); ++i) {
      if (!shown[i] && same_node(accepted[i])) { match = i; }
    }
    for (std::size_t i = 0; i < accepted.size() && match == accepted.size(); ++i) {
      auto const& a = accepted[i];
      if (!shown[i] && !a.identity.empty() && a.identity == v.identity_seen) { match = i; }
    }
    if (match < accepted.size()) {
      auto const& a = accepted[match];
      shown[match]  = true;
      p->set_direction("both");
      p->set_holds_they_have(static_cast<std::uint32_t>(a.holds));
      p->set_bytes_they_hold(a.bytes);
      p->set_last_contact_unix_ms(std::max(p->last_contact_unix_ms(), unix_ms(a.last_contact)));
    }
  }
  for (std::size_t i = 0; i < accepted.size(); ++i) {
    if (shown[i]) { continue; }
    auto const& a = accepted[i];
    auto* p       = reply->add_peers();
    p->set_node_name(a.node_name);
    p->set_address(a.address);
    p->set_identity(a.identity);
    p->set_direction("accepted");
    auto const ready = a.we_imported_its_probe && a.it_imported_our_probe;
    p->set_state(ready ? "ready" : "probe_failed");
    p->set_problem(!a.we_imported_its_probe
                       ? absl::StrCat("we cannot import its probe: ", a.probe_problem)
                   : !a.it_imported_our_probe
                       ? absl::StrCat("it cannot import our probe",
                                      a.our_probe_problem.empty()
                                          ? std::string(" (or has not said yet: its renewals say)")
                                          : absl::StrCat(": ", a.our_probe_problem))
                       : std::string());
    p->set_probe_ok(a.we_imported_its_probe);
    p->set_their_probe_ok(a.it_imported_our_probe);
    p->set_holds_they_have(static_cast<std::uint32_t>(a.holds));
    p->set_bytes_they_hold(a.bytes);
    p->set_last_contact_unix_ms(unix_ms(a.last_contact));
  }
}

std::string peering::metrics_text() const
{
  v1::ListPeersResponse peers;
  list_peers(&peers);
  std::map<std::string, int> states{
      {"connecting", 0}, {"ready", 0}, {"probe_failed", 0}, {"unreachable", 0}};
  for (auto const& p : peers.peers()) { ++states[p.state()]; }
  std::string out =
      "# HELP rmmd_peers Other nodes' daemons this one peers with, by state.\n"
      "# TYPE rmmd_peers gauge\n";
  for (auto const& [state, n] : states) {
    absl::StrAppendFormat(&out, "rmmd_peers{state=\"%s\"} %d\n", state, n);
  }
  out +=
      "# HELP rmmd_peer_holds Holds across nodes: theirs on our buffers, ours on theirs.\n"
      "# TYPE rmmd_peer_holds gauge\n";
  for (auto const& p : peers.peers()) {
    auto const name = label_value(p.node_name());
    absl::StrAppendFormat(
        &out, "rmmd_peer_holds{peer=\"%s\",direction=\"theirs\"} %d\n", name, p.holds_they_have());
    absl::StrAppendFormat(
        &out, "rmmd_peer_holds{peer=\"%s\",direction=\"ours\"} %d\n", name, p.holds_we_have());
  }
  absl::StrAppendFormat(&out,
                        "# HELP rmmd_peer_hold_expiries_total Other nodes' holds ended here "
                        "because they were not renewed within peering.hold_lease_ms.\n"
                        "# TYPE rmmd_peer_hold_expiries_total counter\n"
                        "rmmd_peer_hold_expiries_total %d\n",
                        ledger_.expiries());
  return out;
}

}  // namespace rmmd::peering
