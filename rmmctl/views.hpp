#pragma once

// What rmmctl prints: a readable table per command, or protobuf's JSON mapping
// of the daemon's reply (field names as in the .proto).

#include "rmmd/v1/rmmd.pb.h"

#include <chrono>
#include <cstdint>
#include <string>

namespace rmmd::ctl {

/// "1.50 GiB", "256 B": sizes as people read them.
std::string human_bytes(std::uint64_t bytes);

/// "3d 04h", "1h 02m", "5m 07s", "42s".
std::string human_duration(std::chrono::seconds duration);

/// The pools and sessions of `stats` as two aligned tables; a line under the
/// sessions says how many more there are (session_count) and what they hold.
std::string format_stats(v1::Stats const& stats);
/// Every pool with its configuration and usage.
std::string format_pools(v1::ListPoolsResponse const& pools);
/// The live sessions; `now_unix_ms` gives their age.
std::string format_sessions(v1::ListSessionsResponse const& sessions, std::int64_t now_unix_ms);
/// What each pool gave back.
std::string format_trim(v1::TrimResponse const& trim);
/// The named shared buffers, in the order given (sort_buffers); `now_unix_ms`
/// gives their age.
std::string format_buffers(v1::ListBuffersResponse const& buffers, std::int64_t now_unix_ms);
/// Node `peer`'s buffers (rmmctl buffers --peer): what that node tells of
/// them, each named NODE:NAME as a client opens it.
std::string format_peer_buffers(v1::ListBuffersResponse const& buffers,
                                std::string const& peer,
                                std::int64_t now_unix_ms);
/// Orders the buffers by name (then id: a deleted buffer still held keeps its
/// name beside a new buffer that took it).
void sort_buffers(v1::ListBuffersResponse* buffers);
/// One buffer: its figures, its labels and its manifest's tensor table.
std::string format_buffer(v1::DescribeBufferResponse const& buffer, std::int64_t now_unix_ms);
/// What deleting buffer `name` did: "deleted 'x'; its memory goes back when
/// its 2 holders close it".
std::string format_delete(std::string const& name, v1::DeleteBufferResponse const& response);
/// The daemon's peers: this node's name, then one row per peer (state, the
/// fabric probe both ways, holds and bytes each way, last contact, problem);
/// a line saying that peering is off where there are none.
std::string format_peers(v1::ListPeersResponse const& peers, std::int64_t now_unix_ms);
/// One "key  value" line per figure.
std::string format_health(v1::HealthResponse const& health);

/// `rmmctl sleepers`: one row per sleeper, then the wake counters.
std::string format_sleepers(v1::ListSleepersResponse const& sleepers, std::int64_t now_unix_ms);

/// `json`, protobuf's JSON mapping of a `Message` (what rmmd::admin returns),
/// as that message; fields it does not know are skipped. Throws
/// std::runtime_error when it does not parse.
void from_json(std::string const& json, google::protobuf::Message* out);
template <typename Message>
Message parse_json(std::string const& json)
{
  Message out;
  from_json(json, &out);
  return out;
}

/// protobuf's JSON mapping of `message`, every field printed (defaults too);
/// indented, or on one line with `one_line` (JSON Lines for --watch).
std::string to_json(google::protobuf::Message const& message, bool one_line = false);

}  // namespace rmmd::ctl
