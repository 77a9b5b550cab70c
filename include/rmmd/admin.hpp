#pragma once

// rmmd::admin: what the node's daemon says about itself (stats, sessions,
// pools, shared buffers, peers, health) and the operator's calls (trim,
// delete a buffer), through a session. rmmctl, rmmd_bench and the C ABI's
// *_json functions are built on it.
//
// Listings come as JSON: protobuf's JSON mapping of the daemon's reply
// (proto/rmmd/v1/rmmd.proto; field names as in the .proto, every field
// printed, zeros and empty lists too, 64-bit integers as strings), on one
// line. It is the text `rmmctl --json` prints and docs/protocol.md
// describes, and it follows the wire's compatibility rules: a reader must
// ignore fields it does not know. Calls whose caller wants numbers (health,
// trim, a round trip) return small structs as well.
//
// Thread safety: every member may be called from any thread. Errors: each
// call throws as error.hpp says (permission_error where the caller may not,
// session_error when the daemon is gone, ...), its message naming the call.

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd {

/// Whether the daemon takes sessions.
enum class serving_status {
  unspecified,  ///< a value this library does not know
  serving,      ///< taking sessions and allocations
  draining,     ///< shutting down: no new sessions; live ones finish until the deadline
};

/// The daemon's Health reply.
struct daemon_health {
  serving_status status{};
  std::string version{};  ///< the daemon's, e.g. "0.1.0"
  std::int64_t started_unix_ms{};
  std::uint64_t uptime_seconds{};
  std::uint32_t pool_count{};
  std::uint32_t session_count{};
  int pid{};
  /// host:port of the Prometheus endpoint (http://<it>/metrics); empty when off.
  std::string metrics_address{};
};

/// What trimming one pool gave back.
struct pool_trim {
  std::uint32_t pool_id{};
  std::string name{};
  /// Bytes the pool gave back to the driver (host pools give pages back on
  /// every free already: 0).
  std::uint64_t released_bytes{};
  /// The backend's reserved bytes before and after, where it reports them.
  std::optional<std::uint64_t> reserved_bytes_before{};
  std::optional<std::uint64_t> reserved_bytes_after{};
};

/// The daemon's side of opening a buffer (admin::probe_open).
struct open_probe {
  std::size_t bytes{};                ///< the buffer's size
  std::chrono::nanoseconds answer{};  ///< the open's round trip (the close not counted)
};

/// Which sessions a listing names.
struct session_listing {
  /// The `top` sessions holding the most bytes (then the most allocations,
  /// then the oldest), most first; the reply's unlisted_session_* figures
  /// sum up the rest (0: none listed, the counts alone). Unset: every
  /// session, by id.
  std::optional<std::uint32_t> top{};
};

/// A copyable handle over a session (copies share it); the session stays
/// open while an admin made from it lives.
class admin {
 public:
  explicit admin(session s) noexcept;

  /// The session it asks through (rmmctl leaves its own out of listings).
  [[nodiscard]] session const& get_session() const noexcept
  {
    return session_;
  }

  /// rmmd.v1.Stats: every pool with its usage, and the sessions `which` names.
  [[nodiscard]] std::string stats_json(session_listing which = {}) const;
  /// rmmd.v1.ListSessionsResponse: the sessions `which` names.
  [[nodiscard]] std::string sessions_json(session_listing which = {}) const;
  /// rmmd.v1.ListPoolsResponse: every pool's configuration, usage and driver figures.
  [[nodiscard]] std::string pools_json() const;
  /// rmmd.v1.ListBuffersResponse: the shared buffers `filter` selects (its
  /// peer: another node's, as shared_buffer::list says), in the daemon's order.
  [[nodiscard]] std::string buffers_json(buffer_filter const& filter = {}) const;
  /// rmmd.v1.DescribeBufferResponse: one buffer's figures and manifest.
  /// Throws not_found_error when there is none the caller may see.
  [[nodiscard]] std::string buffer_json(std::string_view name) const;
  /// rmmd.v1.ListPeersResponse: other nodes' daemons this one peers with;
  /// none from a daemon that peers with none (or has no peering).
  [[nodiscard]] std::string peers_json() const;

  /// The daemon's health, asked through the session.
  [[nodiscard]] daemon_health health() const;
  /// rmmd.v1.HealthResponse, asked through the session.
  [[nodiscard]] std::string health_json() const;
  /// rmmd.v1.HealthResponse of the daemon at `runtime_dir`, asked without a
  /// session (Health needs none: it answers a uid that may not open one, and
  /// a daemon that is draining). Throws session_error when nothing answers
  /// within `timeout`.
  [[nodiscard]] static std::string health_json(std::filesystem::path const& runtime_dir,
                                               std::chrono::milliseconds timeout);

  /// Gives memory the pools hold but do not lend back to the driver (root
  /// or the daemon's uid). `pool_ids` empty: every pool. An unknown id is
  /// rmmd::logic_error and nothing is trimmed. What each pool gave back;
  /// trim_json: rmmd.v1.TrimResponse.
  std::vector<pool_trim> trim(std::vector<std::uint32_t> const& pool_ids = {}) const;
  std::string trim_json(std::vector<std::uint32_t> const& pool_ids = {}) const;

  /// Takes buffer `name`'s name away now (shared_buffer::remove); its
  /// memory goes back after its last holder closes it. How many sessions
  /// hold it still.
  std::size_t delete_buffer(std::string_view name) const;

  /// rmmd.v1.ListSleepersResponse: who sleeps (docs/sleep.md), per session
  /// and per backup name kept after its session ended, with the node's wake
  /// counters.
  [[nodiscard]] std::string sleepers_json() const;
  /// Frees the host backups kept under `backup_name` (this uid's; any for
  /// root); the bytes freed. not_found_error when none are kept under it.
  std::size_t drop_backups(std::string_view backup_name) const;

  /// One round trip on the session socket that changes nothing: the daemon
  /// has answered every call this session sent before it. How long it took.
  /// Throws precondition_error when the session's calls go over gRPC
  /// (session::options::lease_calls).
  std::chrono::nanoseconds ping() const;

  /// The daemon's side of opening buffer `name` for reading (of node `peer`,
  /// as shared_buffer::open's NODE:NAME; empty: this node's): asks for its
  /// grant as an open does, then closes it at once, importing and mapping
  /// nothing. Throws as an open would when the daemon refuses.
  open_probe probe_open(std::string_view name, std::string_view peer = {}) const;

 private:
  session session_;
};

}  // namespace rmmd
