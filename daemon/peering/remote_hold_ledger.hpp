#pragma once

// The serving node's ledger of other nodes' holds on its buffers: who each
// peer is (its certificate subject, its daemon's incarnation from Hello),
// its holds in the core, and when each was last renewed. A reaper thread
// ends holds not renewed within the lease: the ledger never keeps a hold
// for a node that is gone.
//
// Thread safety: every member may be called from any thread; one mutex
// guards the ledger and is held across the core's calls (the core never
// calls back).

#include "daemon/core/daemon_core.hpp"
#include "daemon/peering/peer_grants.hpp"

#include <absl/status/statusor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace rmmd::peering {

/// Who holds it on the calling node: shown, not trusted.
struct remote_holder {
  std::uint64_t session{};
  std::uint32_t uid{};
  std::int32_t pid{};
};

/// A peer that said Hello, as ListPeers shows it.
struct accepted_peer {
  std::string identity{};
  std::string node_name{};
  std::string address{};  ///< where its calls come from
  std::uint64_t incarnation{};
  bool we_imported_its_probe{false};
  std::string probe_problem{};
  /// It imported our probe (what its renewals say; false until one does).
  bool it_imported_our_probe{false};
  std::string our_probe_problem{};
  std::size_t holds{};
  std::size_t bytes{};
  std::chrono::system_clock::time_point last_contact{};
};

class remote_hold_ledger {
 public:
  using clock = std::chrono::steady_clock;

  remote_hold_ledger(core::daemon_core& core, std::chrono::milliseconds lease);
  remote_hold_ledger(remote_hold_ledger const&)            = delete;
  remote_hold_ledger& operator=(remote_hold_ledger const&) = delete;
  /// stop().
  ~remote_hold_ledger();

  [[nodiscard]] std::chrono::milliseconds lease() const noexcept
  {
    return lease_;
  }

  /// A Hello from `identity` on node `node_name`: its incarnation and our
  /// verdict on its probe. A caller is (identity, node name): nodes may share
  /// one certificate (a DaemonSet's Secret), so only a new incarnation from
  /// the same identity and node name ends the holds of its old one (that
  /// daemon is gone); other nodes' holds under the identity stay.
  void hello(std::string const& identity,
             std::string const& node_name,
             std::string const& address,
             std::uint64_t incarnation,
             bool we_imported_its_probe,
             std::string const& probe_problem);

  /// A hold of `open.name` for `identity`. FAILED_PRECONDITION when
  /// `incarnation` is not the live one of any node under `identity` (the one
  /// its last Hello gave); otherwise what core::daemon_core::open_remote_buffer
  /// answers.
  absl::StatusOr<core::remote_buffer_grant> open(std::string const& identity,
                                                 std::uint64_t incarnation,
                                                 checked_open const& open,
                                                 remote_holder const& holder);

  /// The buffers `identity`'s caller at `incarnation` could open here
  /// (core::daemon_core::list_remote_buffers, through `list`'s grants).
  /// FAILED_PRECONDITION as open(). Holds nothing.
  absl::StatusOr<std::vector<core::buffer_info>> list(std::string const& identity,
                                                      std::uint64_t incarnation,
                                                      checked_list const& list);

  /// Renews `ids` of `identity`'s incarnation as of `now`; returns those it
  /// does not hold (ended already). FAILED_PRECONDITION as open().
  /// What the caller under `identity` with `incarnation` says of our probe
  /// (its renewals carry it). Nothing for an unknown caller.
  void their_verdict(std::string const& identity,
                     std::uint64_t incarnation,
                     bool ok,
                     std::string const& problem);

  absl::StatusOr<std::vector<std::uint64_t>> renew(std::string const& identity,
                                                   std::uint64_t incarnation,
                                                   std::vector<std::uint64_t> const& ids,
                                                   clock::time_point now = clock::now());

  /// Ends `ids` of `identity`'s incarnation (others' and unknown ones are
  /// ignored). FAILED_PRECONDITION as open().
  absl::Status close(std::string const& identity,
                     std::uint64_t incarnation,
                     std::vector<std::uint64_t> const& ids);

  /// Ends every hold last renewed more than the lease before `now`, each
  /// said in a log line naming the peer and the time since; returns how many.
  std::size_t expire(clock::time_point now);

  /// Starts the reaper: expire() every lease/4 (at least every 50 ms).
  void start_reaper();

  /// Stops the reaper and ends every hold (shutdown).
  void stop() noexcept;

  [[nodiscard]] std::vector<accepted_peer> accepted() const;
  /// Holds ended for want of renewal, since start.
  [[nodiscard]] std::uint64_t expiries() const noexcept
  {
    return expiries_.load();
  }

 private:
  struct hold {
    std::string identity{};
    std::uint64_t incarnation{};
    std::size_t bytes{};
    clock::time_point renewed{};
    remote_holder holder{};
    std::string buffer{};
  };
  struct caller {
    std::string address{};
    std::uint64_t incarnation{};
    bool we_imported_its_probe{false};
    std::string probe_problem{};
    bool it_imported_our_probe{false};
    std::string our_probe_problem{};
    std::chrono::system_clock::time_point last_contact{};
  };

  /// (identity, node name): one daemon, whatever certificate it shares.
  using caller_key = std::pair<std::string, std::string>;

  /// The caller under `identity` whose live incarnation is `incarnation`;
  /// FAILED_PRECONDITION when none.
  absl::StatusOr<caller_key> check_incarnation_locked(std::string const& identity,
                                                      std::uint64_t incarnation,
                                                      char const* what);
  /// The node name of `identity`'s caller at `incarnation` ("?": none now).
  [[nodiscard]] std::string node_of_locked(std::string const& identity,
                                           std::uint64_t incarnation) const;
  void end_locked(std::map<std::uint64_t, hold>::iterator it) noexcept;

  core::daemon_core& core_;
  std::chrono::milliseconds const lease_;
  mutable std::mutex mutex_;
  std::condition_variable stop_wake_;
  bool stopping_{false};
  std::map<caller_key, caller> callers_;
  std::map<std::uint64_t, hold> holds_;  // by the core's remote hold id
  std::atomic<std::uint64_t> expiries_{0};
  std::thread reaper_;
};

}  // namespace rmmd::peering
