#include "daemon/peering/peer_link.hpp"

#include "daemon/log.hpp"
#include "daemon/peering/peer_service.hpp"
#include "daemon/version.hpp"
#include "daemon/wire/status_mapping.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>
#include <utility>

namespace rmmd::peering {
namespace {

using namespace std::chrono_literals;

constexpr auto call_deadline  = 10s;
constexpr auto close_deadline = 1s;
constexpr auto first_backoff  = 200ms;
constexpr auto most_backoff   = 10s;
/// How many Hellos one client call may send when the peer asks for one.
constexpr int hellos_per_call = 2;

absl::Status from_grpc(grpc::Status const& s, std::string const& peer)
{
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("peer '", peer, "': ", s.error_message()));
}

/// The peer's refusal of a call whose incarnation no Hello of ours there
/// gave (remote_hold_ledger::check_incarnation_locked): its daemon started
/// again since our last Hello, or it never had one from this link. A peer
/// of this version says so in ErrorDetails.hello_needed; one before it only
/// in words ("call Hello first", "call Hello again").
bool asks_for_hello(grpc::Status const& s)
{
  if (s.error_code() != grpc::StatusCode::FAILED_PRECONDITION) { return false; }
  return wire::hello_needed(s) ||
         (s.error_details().empty() && s.error_message().find("call Hello") != std::string::npos);
}

/// Why a dial failed, in words: gRPC's own for TLS problems are terse. The
/// cases are told apart by gRPC's message, the only place it says which.
std::string dial_problem(grpc::Status const& s)
{
  auto const said = s.error_message();
  auto const has  = [&](std::string_view text) { return said.find(text) != std::string::npos; };
  if (has("Ssl handshake failed") || has("certificate verify failed")) {
    return absl::StrCat("the TLS handshake failed, its certificate does not verify here (",
                        said,
                        "): does it chain to this node's peering.tls.trusted_ca_file, is it "
                        "unexpired, and does it name the address dialed (or "
                        "peers.tls_server_name)?");
  }
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE && has("Socket closed")) {
    // With TLS 1.3 the client's certificate is judged after our side of the
    // handshake is done: a refusal reaches us as the connection closing.
    return absl::StrCat("it closed the connection during the TLS handshake (",
                        said,
                        "): most likely it refuses this node's certificate; does ours chain to "
                        "its peering.tls.trusted_ca_file, and is it unexpired?");
  }
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::StrCat("cannot reach it (",
                        said,
                        "): is its rmmd running with peering.listen_address there, and do both "
                        "certificates chain to the other's trusted CA?");
  }
  return absl::StrCat(said, " (", static_cast<int>(s.error_code()), ")");
}

/// The certificate subject the call's server presented ("" : none).
std::string subject_of(grpc::ClientContext const& call)
{
  auto auth = call.auth_context();
  if (!auth) { return {}; }
  auto values = auth->FindPropertyValues("x509_subject");
  if (values.empty()) { return {}; }
  return std::string(values.front().data(), values.front().size());
}

}  // namespace

std::string_view state_name(link_state state) noexcept
{
  switch (state) {
    case link_state::connecting:
      return "connecting";
    case link_state::ready:
      return "ready";
    case link_state::probe_failed:
      return "probe_failed";
    case link_state::unreachable:
      return "unreachable";
  }
  return "unknown";
}

peer_link::peer_link(config::peer_node_settings peer, link_options const& options)
    : peer_(std::move(peer)), options_(options), stub_(make_stub(options_.credentials))
{
}

std::shared_ptr<v1::RmmdPeer::Stub> peer_link::make_stub(
    std::shared_ptr<grpc::ChannelCredentials> const& credentials) const
{
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(options_.keepalive.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(options_.keepalive.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Redial quickly once the peer is back: the link's own loop paces Hello.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(most_backoff / 1ms));
  // A channel of its own connections: one made with new credentials never
  // reuses a connection that the old certificate opened.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (!peer_.tls_server_name.empty()) {
    args.SetString(GRPC_SSL_TARGET_NAME_OVERRIDE_ARG, peer_.tls_server_name);
  }
  return v1::RmmdPeer::NewStub(grpc::CreateCustomChannel(peer_.address, credentials, args));
}

void peer_link::use_credentials(std::shared_ptr<grpc::ChannelCredentials> credentials)
{
  auto fresh = make_stub(credentials);
  std::shared_ptr<v1::RmmdPeer::Stub> old;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) { return; }
    old     = std::exchange(stub_, std::move(fresh));
    redial_ = true;
  }
  wake_.notify_all();
  // `old` goes here, or with the last call still on it.
}

peer_link::~peer_link()
{
  stop();
}

void peer_link::start()
{
  thread_ = std::thread([this] { run(); });
}

peer_link::link_call peer_link::new_call(std::chrono::milliseconds deadline) const
{
  link_call call;
  {
    std::lock_guard lock(mutex_);
    call.stub = stub_;
  }
  call.context = std::make_unique<grpc::ClientContext>();
  call.context->set_deadline(std::chrono::system_clock::now() + deadline);
  return call;
}

void peer_link::set_state(link_state state, std::string problem)
{
  std::lock_guard lock(mutex_);
  if (state != state_ || problem != problem_) {
    auto const text = problem.empty() ? std::string() : absl::StrCat(": ", problem);
    if (state == link_state::ready) {
      log::info("peer '%s' at %s: ready", peer_.name, peer_.address);
    } else if (state != link_state::connecting) {
      log::warn("peer '%s' at %s: %s%s", peer_.name, peer_.address, state_name(state), text);
    }
  }
  state_   = state;
  problem_ = std::move(problem);
}

std::string peer_link::identity_problem(grpc::ClientContext const& call) const
{
  if (peer_.identity.empty()) { return {}; }
  auto const subject = subject_of(call);
  if (subject == peer_.identity) { return {}; }
  return absl::StrFormat(
      "its certificate names '%s', but peering.peers names identity '%s' for it; refused (fix "
      "the identity or its certificate)",
      subject.empty() ? std::string("(none)") : subject,
      peer_.identity);
}

bool peer_link::hello(std::string* why)
{
  auto const failed = [&](std::string problem) {
    if (why != nullptr) { *why = problem; }
    set_state(link_state::unreachable, std::move(problem));
    return false;
  };
  v1::PeerHello request;
  request.set_node_name(options_.node_name);
  request.set_incarnation(options_.incarnation);
  to_proto(options_.probes->ours, request.mutable_probe());
  request.set_version(std::string(daemon_version()));
  v1::PeerWelcome welcome;
  auto const call = new_call(std::chrono::duration_cast<std::chrono::milliseconds>(call_deadline));
  auto const& c   = call.context;
  auto s          = call.stub->Hello(c.get(), request, &welcome);
  if (!s.ok()) { return failed(dial_problem(s)); }
  auto const subject = subject_of(*c);
  if (auto problem = identity_problem(*c); !problem.empty()) { return failed(std::move(problem)); }
  if (welcome.incarnation() == 0) {
    return failed("its Welcome carries incarnation 0; a daemon sends a random nonzero one");
  }
  if (welcome.node_name() != peer_.name) {
    log::warn(
        "peer '%s' at %s calls itself '%s' (its peering.node_name); clients here still "
        "name it '%s'",
        peer_.name,
        peer_.address,
        welcome.node_name(),
        peer_.name);
  }
  probe_verdict ours_of_theirs;
  auto theirs = from_proto(welcome.probe());
  if (theirs.fabric_handle.empty()) {
    ours_of_theirs = {.ok      = false,
                      .problem = absl::StrCat("it exports no probe: ", theirs.problem)};
  } else {
    ours_of_theirs = options_.probes->import(theirs);
  }
  std::vector<std::uint64_t> dropped;
  {
    std::lock_guard lock(mutex_);
    if (peer_incarnation_ != 0 && peer_incarnation_ != welcome.incarnation()) {
      // Its daemon started again: the holds there ended with the old one,
      // and their ids mean nothing to the new one.
      for (auto const& [id, bytes] : holds_) {
        log::warn(
            "peer '%s' started again (incarnation %d, was %d): its hold %d ended with its "
            "old daemon; dropped here",
            peer_.name,
            welcome.incarnation(),
            peer_incarnation_,
            id);
        dropped.push_back(id);
      }
      holds_.clear();
      to_close_.clear();
    }
    peer_incarnation_ = welcome.incarnation();
    identity_seen_    = subject;
    node_name_seen_   = welcome.node_name();
    probe_ok_         = ours_of_theirs.ok;
    probe_problem_    = ours_of_theirs.problem;
    their_probe_ok_   = welcome.your_probe().ok();
    last_contact_     = std::chrono::system_clock::now();
  }
  if (!dropped.empty() && options_.peer_restarted) { options_.peer_restarted(*this, dropped); }
  if (ours_of_theirs.ok && welcome.your_probe().ok()) {
    set_state(link_state::ready, {});
  } else {
    std::string problem;
    if (!ours_of_theirs.ok) {
      problem = absl::StrCat("we cannot import its probe: ", ours_of_theirs.problem);
    }
    if (!welcome.your_probe().ok()) {
      absl::StrAppend(&problem,
                      problem.empty() ? "" : "; ",
                      "it cannot import ours: ",
                      welcome.your_probe().problem());
    }
    set_state(link_state::probe_failed, problem);
  }
  return true;
}

bool peer_link::renew_and_close()
{
  std::vector<std::uint64_t> ids;
  std::vector<std::uint64_t> closing;
  {
    std::lock_guard lock(mutex_);
    for (auto const& [id, bytes] : holds_) { ids.push_back(id); }
    closing.swap(to_close_);
  }
  if (!closing.empty()) {
    v1::CloseHoldsRequest request;
    request.set_incarnation(options_.incarnation);
    for (auto id : closing) { request.add_hold_ids(id); }
    v1::CloseHoldsResponse reply;
    auto const call =
        new_call(std::chrono::duration_cast<std::chrono::milliseconds>(call_deadline));
    if (auto s = call.stub->CloseHolds(call.context.get(), request, &reply); !s.ok()) {
      log::warn(
          "peer '%s': CloseHolds of %d hold(s) failed (%s); they end when their lease "
          "runs out",
          peer_.name,
          closing.size(),
          s.error_message());
      return s.error_code() != grpc::StatusCode::UNAVAILABLE &&
             s.error_code() != grpc::StatusCode::FAILED_PRECONDITION;
    }
  }
  v1::RenewHoldsRequest request;
  request.set_incarnation(options_.incarnation);
  for (auto id : ids) { request.add_hold_ids(id); }
  {
    std::lock_guard lock(mutex_);
    request.mutable_your_probe()->set_ok(probe_ok_);
    request.mutable_your_probe()->set_problem(probe_problem_);
  }
  v1::RenewHoldsResponse reply;
  auto const call = new_call(std::chrono::duration_cast<std::chrono::milliseconds>(call_deadline));
  auto const& c   = call.context;
  auto s          = call.stub->RenewHolds(c.get(), request, &reply);
  if (s.ok()) {
    if (auto problem = identity_problem(*c); !problem.empty()) {
      set_state(link_state::unreachable, std::move(problem));
      return false;
    }
  }
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      log::warn("peer '%s': %s; saying hello again", peer_.name, s.error_message());
    } else {
      set_state(link_state::unreachable, dial_problem(s));
    }
    return false;
  }
  std::lock_guard lock(mutex_);
  last_contact_ = std::chrono::system_clock::now();
  for (auto id : reply.unknown_hold_ids()) {
    if (holds_.erase(id) > 0) {
      log::warn("peer '%s': hold %d ended there (expired, or its buffer is gone); dropped here",
                peer_.name,
                id);
    }
  }
  return true;
}

void peer_link::run()
{
  auto backoff = std::chrono::milliseconds(first_backoff);
  bool ready   = false;
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (redial_) {
      // New credentials (Hello on the new channel), or a client's call
      // found the peer gone or started again: Hello now, whatever the state.
      redial_ = false;
      ready   = false;
      backoff = first_backoff;
    }
    lock.unlock();
    if (!ready) {
      ready = hello();
      if (ready) { backoff = first_backoff; }
    } else {
      ready = renew_and_close();
    }
    lock.lock();
    if (stopping_) { break; }
    auto const wait = ready ? options_.renew_interval : backoff;
    if (!ready) { backoff = std::min<std::chrono::milliseconds>(backoff * 2, most_backoff); }
    // A queued close, new credentials or hello_soon() wakes it early.
    wake_.wait_for(
        lock, wait, [&] { return stopping_ || redial_ || (ready && !to_close_.empty()); });
  }
}

void peer_link::stop() noexcept
{
  {
    std::lock_guard lock(mutex_);
    if (stopping_) { return; }
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) { thread_.join(); }
  std::vector<std::uint64_t> ids;
  {
    std::lock_guard lock(mutex_);
    for (auto const& [id, bytes] : holds_) { ids.push_back(id); }
    ids.insert(ids.end(), to_close_.begin(), to_close_.end());
    holds_.clear();
    to_close_.clear();
  }
  close_now(ids, "at shutdown");
}

void peer_link::close_now(std::vector<std::uint64_t> const& ids, char const* when) const
{
  if (ids.empty()) { return; }
  v1::CloseHoldsRequest request;
  request.set_incarnation(options_.incarnation);
  for (auto id : ids) { request.add_hold_ids(id); }
  v1::CloseHoldsResponse reply;
  auto const call = new_call(std::chrono::duration_cast<std::chrono::milliseconds>(close_deadline));
  if (auto s = call.stub->CloseHolds(call.context.get(), request, &reply); !s.ok()) {
    log::warn("peer '%s': closing %d hold(s) %s failed (%s); they end when their lease runs out",
              peer_.name,
              request.hold_ids_size(),
              when,
              s.error_message());
  }
}

void peer_link::hello_soon()
{
  {
    std::lock_guard lock(mutex_);
    redial_ = true;
  }
  wake_.notify_all();
}

absl::Status peer_link::restarted_unavailable(std::string const& hello_failure)
{
  // Its refusal ("call Hello first") is about a link of ours, not the
  // caller's request: the caller hears that the peer cannot be reached, as
  // for any peer that is down, and may try again once the link's thread
  // has said Hello.
  hello_soon();
  return absl::UnavailableError(
      absl::StrFormat("peer '%s' at %s started again and our Hello %s; try again once `rmmctl "
                      "peers` shows it ready",
                      peer_.name,
                      peer_.address,
                      hello_failure.empty() ? std::string("did not take (it asked again)")
                                            : absl::StrCat("failed: ", hello_failure)));
}

template <typename Call>
absl::Status peer_link::client_call(char const* stopping_words, Call&& call)
{
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      return absl::UnavailableError(
          absl::StrFormat("peer '%s': this daemon is stopping%s", peer_.name, stopping_words));
    }
    if (state_ != link_state::ready && state_ != link_state::probe_failed) {
      return absl::UnavailableError(
          absl::StrFormat("peer '%s' at %s is %s%s; try again once `rmmctl peers` shows it ready",
                          peer_.name,
                          peer_.address,
                          state_name(state_),
                          problem_.empty() ? "" : absl::StrCat(": ", problem_)));
    }
  }
  auto const deadline = std::chrono::duration_cast<std::chrono::milliseconds>(call_deadline);
  auto made           = new_call(deadline);
  auto s              = call(*made.stub, *made.context);
  // The peer's daemon started again since this link's last renewal (the
  // link's thread finds out only at its next one): Hello now, on this
  // thread, as that thread would, and the call once more. hello() drops
  // the holds the old daemon had, as it does there. A daemon that restarts
  // again meanwhile may ask once more.
  for (int hellos = 0; asks_for_hello(s) && hellos < hellos_per_call; ++hellos) {
    std::string why;
    if (!hello(&why)) { return restarted_unavailable(why); }
    made = new_call(deadline);
    s    = call(*made.stub, *made.context);
  }
  if (asks_for_hello(s)) { return restarted_unavailable({}); }
  auto const& c = made.context;
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
      set_state(link_state::unreachable, dial_problem(s));
      hello_soon();
    }
    return from_grpc(s, peer_.name);
  }
  if (auto problem = identity_problem(*c); !problem.empty()) {
    // Whoever answered is not the peer: its answer (a hold id, names)
    // means nothing to us.
    set_state(link_state::unreachable, problem);
    hello_soon();
    return absl::UnauthenticatedError(absl::StrCat("peer '", peer_.name, "': ", problem));
  }
  std::lock_guard lock(mutex_);
  last_contact_ = std::chrono::system_clock::now();
  return absl::OkStatus();
}

absl::StatusOr<v1::RemoteGrant> peer_link::open(v1::RemoteOpenRequest request)
{
  request.set_incarnation(options_.incarnation);
  v1::RemoteGrant grant;
  auto s = client_call("; no new holds on other nodes",
                       [&](v1::RmmdPeer::Stub& stub, grpc::ClientContext& c) {
                         return stub.OpenRemoteBuffer(&c, request, &grant);
                       });
  if (!s.ok()) { return s; }
  return grant;
}

void peer_link::keep(std::uint64_t hold_id, std::uint64_t bytes)
{
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      holds_[hold_id] = bytes;
      return;
    }
  }
  // stop() has sent its CloseHolds already: this one goes now.
  close_now({hold_id}, "opened while stopping");
}

void peer_link::close(std::uint64_t hold_id)
{
  {
    std::lock_guard lock(mutex_);
    holds_.erase(hold_id);
    if (!stopping_) {
      to_close_.push_back(hold_id);
      wake_.notify_all();
      return;
    }
  }
  close_now({hold_id}, "after shutdown began");  // the link's thread is gone
}

link_view peer_link::view() const
{
  std::lock_guard lock(mutex_);
  link_view v{.peer           = peer_,
              .state          = state_,
              .problem        = problem_,
              .identity_seen  = identity_seen_,
              .node_name_seen = node_name_seen_,
              .probe_ok       = probe_ok_,
              .their_probe_ok = their_probe_ok_,
              .last_contact   = last_contact_};
  for (auto const& [id, bytes] : holds_) {
    ++v.holds;
    v.bytes += bytes;
  }
  return v;
}

absl::StatusOr<v1::ListRemoteBuffersResponse> peer_link::list(v1::ListRemoteBuffersRequest request)
{
  // open()'s readiness rule: a listing is only worth what a later open of
  // one of its names can do.
  request.set_incarnation(options_.incarnation);
  v1::ListRemoteBuffersResponse reply;
  auto s = client_call("", [&](v1::RmmdPeer::Stub& stub, grpc::ClientContext& c) {
    return stub.ListRemoteBuffers(&c, request, &reply);
  });
  if (!s.ok()) { return s; }
  return reply;
}

}  // namespace rmmd::peering
