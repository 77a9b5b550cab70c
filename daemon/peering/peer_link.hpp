#pragma once

// The asking node's side of one peering.peers entry: a gRPC channel (mutual
// TLS) to that node's daemon, Hello with the probes both ways, its state,
// and the holds this node's clients have there. One thread per link dials
// (again, with bounded backoff, whenever a call finds it gone), renews every
// hold each renew interval (one RenewHolds, which also tells whether the
// peer is alive), and sends the CloseHolds queued by close().
//
// Thread safety: every public member may be called from any thread; one
// mutex guards the state and the stub, never held across an RPC: a call
// takes its own reference to the stub, so a call in flight when
// use_credentials() swaps the channel finishes (or fails) on the old one.

#include "daemon/config/settings.hpp"
#include "daemon/peering/probe_exchange.hpp"
#include "rmmd/v1/peer.grpc.pb.h"

#include <absl/status/statusor.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rmmd::peering {

enum class link_state : std::uint8_t { connecting, ready, probe_failed, unreachable };

std::string_view state_name(link_state state) noexcept;

class peer_link;

/// What every link of this daemon shares.
struct link_options {
  std::string node_name{};  ///< ours
  std::uint64_t incarnation{};
  probe_exchange const* probes{};
  std::shared_ptr<grpc::ChannelCredentials> credentials{};  ///< at start; see use_credentials()
  std::chrono::milliseconds keepalive{};
  std::chrono::milliseconds renew_interval{};
  /// The peer's daemon started again (a Hello answered with a new
  /// incarnation): the link dropped `holds` (ids of the old daemon, which
  /// ended with it). Called on the link's thread, without its mutex.
  std::function<void(peer_link const& link, std::vector<std::uint64_t> const& holds)>
      peer_restarted{};
};

/// One link as ListPeers shows it.
struct link_view {
  config::peer_node_settings peer{};
  link_state state{link_state::connecting};
  std::string problem{};
  std::string identity_seen{};
  std::string node_name_seen{};
  bool probe_ok{false};
  bool their_probe_ok{false};
  std::size_t holds{};
  std::size_t bytes{};
  std::chrono::system_clock::time_point last_contact{};
};

class peer_link {
 public:
  peer_link(config::peer_node_settings peer, link_options const& options);
  peer_link(peer_link const&)            = delete;
  peer_link& operator=(peer_link const&) = delete;
  /// stop().
  ~peer_link();

  void start();
  /// Stops the thread and closes every hold there (one CloseHolds, with a
  /// short deadline: a peer that is gone lets them expire).
  void stop() noexcept;

  /// OpenRemoteBuffer there. UNAVAILABLE (with the state and its problem)
  /// unless the link is ready or probe_failed (the buffer may still be
  /// opened; whether a client can import it is what the probe says), once
  /// stopping, and when the peer asks for a Hello (its daemon started
  /// again) that this link cannot give it within the call. UNAUTHENTICATED when the answer came
  /// from a certificate other than peer.identity. Otherwise the peer's answer, its message prefixed
  /// with the peer's name.
  absl::StatusOr<v1::RemoteGrant> open(v1::RemoteOpenRequest request);

  /// A hold opened by open() that this node now counts (renews it). Once
  /// stopping, closes it there at once instead (stop() has sent its close).
  void keep(std::uint64_t hold_id, std::uint64_t bytes);

  /// Dials with `credentials` from now on (the TLS files read again): a new
  /// channel to the same address, and Hello on it at once, not at the next
  /// backoff or renewal. The holds and our incarnation stay: the peer keys
  /// holds by (identity, node name) and incarnation, so the new connection
  /// continues them. A peer that refuses the new certificate, or whose
  /// certificate fails the identity check, leaves the link unreachable with
  /// the reason. Nothing once stopping.
  void use_credentials(std::shared_ptr<grpc::ChannelCredentials> credentials);
  /// Queues a CloseHolds of `hold_id` for the link's thread (once stopping,
  /// sends it at once).
  void close(std::uint64_t hold_id);

  [[nodiscard]] link_view view() const;
  [[nodiscard]] std::string const& name() const noexcept
  {
    return peer_.name;
  }

  /// ListRemoteBuffers there: UNAVAILABLE and UNAUTHENTICATED as open();
  /// otherwise the peer's answer, its message prefixed with the peer's name.
  absl::StatusOr<v1::ListRemoteBuffersResponse> list(v1::ListRemoteBuffersRequest request);

 private:
  void run();
  /// Hello; sets the state. Returns whether the peer answered; when not,
  /// says why in `why` (when given). On the link's thread, and on a
  /// client's (client_call) when the peer asks.
  bool hello(std::string* why = nullptr);
  /// RenewHolds and the queued CloseHolds. Returns false when the peer must
  /// be dialed again.
  bool renew_and_close();
  void set_state(link_state state, std::string problem);
  /// UNAVAILABLE for a client call the peer refused for want of a Hello
  /// that this call could not give it: `hello_failure`, hello()'s reason
  /// (empty: the peer asked again after a Hello it took). Has the link's
  /// thread say Hello now rather than at its next renewal.
  [[nodiscard]] absl::Status restarted_unavailable(std::string const& hello_failure);
  /// The link's thread says Hello now (a client's call found the peer gone).
  void hello_soon();
  /// "" when the call's certificate subject is peer.identity (or that is
  /// empty); otherwise the problem, in words.
  [[nodiscard]] std::string identity_problem(grpc::ClientContext const& call) const;
  /// CloseHolds of `ids` now, with a short deadline (stop, and keep() after).
  void close_now(std::vector<std::uint64_t> const& ids, char const* when) const;
  /// One call on the current stub: the stub (and its channel) outlives the
  /// call's context, which gRPC tears down through the channel, however
  /// use_credentials() swaps stub_ meanwhile (members go in reverse order).
  struct link_call {
    std::shared_ptr<v1::RmmdPeer::Stub> stub;
    std::unique_ptr<grpc::ClientContext> context;
  };
  [[nodiscard]] link_call new_call(std::chrono::milliseconds deadline) const;
  /// A stub on a new channel to peer.address with `credentials`.
  [[nodiscard]] std::shared_ptr<v1::RmmdPeer::Stub> make_stub(
      std::shared_ptr<grpc::ChannelCredentials> const& credentials) const;
  /// One call a client asked for (open, list): UNAVAILABLE once stopping
  /// (`stopping_words` after "this daemon is stopping") and unless the link
  /// is ready or probe_failed; `call(stub, context)` on the current stub;
  /// a failed or wrongly answered call marks the link unreachable. A peer
  /// that asks for Hello (its daemon started again) gets one from this
  /// thread, and the call is made once more.
  template <typename Call>
  absl::Status client_call(char const* stopping_words, Call&& call);

  config::peer_node_settings const peer_;
  link_options const options_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::shared_ptr<v1::RmmdPeer::Stub> stub_;  // holds its channel
  bool redial_{false};  // new credentials, or a client's call found the link down: Hello now
  bool stopping_{false};
  link_state state_{link_state::connecting};
  std::string problem_;
  std::string identity_seen_;
  std::string node_name_seen_;
  std::uint64_t peer_incarnation_{0};  // its daemon's, from its last Welcome
  bool probe_ok_{false};
  std::string probe_problem_;  // why we could not import its probe
  bool their_probe_ok_{false};
  std::chrono::system_clock::time_point last_contact_{};
  std::map<std::uint64_t, std::uint64_t> holds_;  // hold id there -> bytes
  std::vector<std::uint64_t> to_close_;
  std::thread thread_;
};

}  // namespace rmmd::peering
