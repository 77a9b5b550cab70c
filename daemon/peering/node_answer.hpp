#pragma once

// What this node's client reads when another node's daemon refused an open
// or could not be reached: the node named once, as the one that answered (or
// did not), in words that cannot be read as this node's daemon being gone.

#include <absl/status/status.h>

#include <string_view>

namespace rmmd::peering {

/// `from_link` (what peer_link::open returned for `node`) as this node's
/// daemon answers its client:
/// - UNAVAILABLE, DEADLINE_EXCEEDED: "node 'N' cannot be reached from this
///   node's rmmd (...)" or "node 'N' did not answer this node's rmmd in
///   time", pointing at `rmmctl peers`, and marked by
///   wire::mark_unreachable_node (the client tells it from its own daemon
///   being gone by that mark, not by these words);
/// - UNAUTHENTICATED (whoever answered is not the peer), INTERNAL, UNKNOWN:
///   "node 'N': <its words>";
/// - any other error, the node's refusal: "node 'N' refused: <its words>".
/// The code stays. REQUIRES: !from_link.ok().
[[nodiscard]] absl::Status node_answer(absl::Status const& from_link, std::string_view node_name);

}  // namespace rmmd::peering
