#pragma once

// Peering (docs/operations.md, "Across nodes"): this daemon's part in the
// NVLink domain. Owns the peer listener (a second gRPC server on TCP with
// mutual TLS, serving RmmdPeer), the ledger of other nodes' holds here, and
// one link per peering.peers entry for this node's clients' opens there.
//
// Thread safety: made, reloaded and stopped from main's thread; open(),
// list_peers() and metrics_text() from any thread.

#include "daemon/config/settings.hpp"
#include "daemon/core/daemon_core.hpp"
#include "daemon/peering/peer_link.hpp"
#include "daemon/peering/peer_service.hpp"
#include "daemon/peering/probe_exchange.hpp"
#include "daemon/peering/remote_hold_ledger.hpp"
#include "daemon/wire/remote_buffers.hpp"

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace rmmd::peering {

/// The TLS files read, or why one cannot be.
struct tls_material {
  std::string certificate_chain{};
  std::string private_key{};
  std::string trusted_ca{};
};
absl::StatusOr<tls_material> read_tls(config::peer_tls_files const& files);

class peering final : public wire::remote_buffers {
 public:
  /// Listens (settings.listen_address) and dials every peer. nullptr after
  /// logging why (a TLS file cannot be read, the address cannot be bound).
  /// REQUIRES: settings.enabled().
  static std::unique_ptr<peering> start(core::daemon_core& core,
                                        config::peering_settings const& settings,
                                        probe_exchange probes);
  /// stop().
  ~peering() override;

  /// The grants, and the TLS files read again: a new listener with them,
  /// and every link dials with them from now on (a new channel, Hello at
  /// once; its holds stay). A file that cannot be read keeps the old
  /// credentials for both; a listener that cannot be made keeps the old
  /// one. Each is said in the log.
  void reload(config::peering_settings const& settings);

  /// Closes this node's holds on every peer, ends every peer's hold here,
  /// and stops the listener.
  void stop() noexcept;

  absl::Status open(core::session_id session,
                    v1::OpenBufferRequest const& request,
                    v1::BufferGrant* reply) override;
  absl::Status list(v1::ListBuffersRequest const& request, v1::ListBuffersResponse* reply) override;
  void list_peers(v1::ListPeersResponse* reply) const override;

  /// rmmd_peers{state}, rmmd_peer_holds{peer,direction},
  /// rmmd_peer_hold_expiries_total, in Prometheus' text format.
  [[nodiscard]] std::string metrics_text() const;

  /// The port the listener bound (0: none).
  [[nodiscard]] int listening_port() const noexcept
  {
    return port_;
  }

 private:
  peering(core::daemon_core& core, config::peering_settings const& settings, probe_exchange probes);
  bool listen(tls_material const* tls);
  bool dial(tls_material const* tls);
  /// A session let go of buffer `id` of another node (the core's foreign
  /// release notifier).
  void released(core::buffer_id id);
  /// `link`'s peer started again: `holds` ended there with its old daemon.
  void peer_restarted(peer_link const& link, std::vector<std::uint64_t> const& holds);

  struct foreign_hold {
    peer_link* link{};     // null: a tombstone (released before open() recorded it)
    std::uint64_t hold{};  // 0 while its open is in flight
    bool released{false};  // let go of while in flight (or a tombstone)
    bool orphaned{false};  // its hold ended with the peer's old daemon: nothing to close
  };

  core::daemon_core& core_;
  config::peering_settings settings_;
  std::uint64_t const incarnation_;
  probe_exchange const probes_;
  remote_hold_ledger ledger_;
  peer_service service_;
  std::unique_ptr<grpc::Server> server_;
  int port_{0};
  std::vector<std::unique_ptr<peer_link>> links_;
  mutable std::mutex holds_mutex_;
  std::map<core::buffer_id, foreign_hold> foreign_;
  bool stopped_{false};
};

}  // namespace rmmd::peering
