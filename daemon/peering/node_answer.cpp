#include "daemon/peering/node_answer.hpp"

#include "daemon/wire/status_mapping.hpp"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include <string>

namespace rmmd::peering {

absl::Status node_answer(absl::Status const& from_link, std::string_view node_name)
{
  // peer_link's words name the link ("peer 'N': ..." for an answer,
  // "peer 'N' at ADDRESS is ..." for its own refusals), as its log lines
  // do; a client is told the node once, here.
  std::string const node(node_name);
  std::string detail(from_link.message().data(), from_link.message().size());
  auto const named = absl::StrCat("peer '", node, "'");
  if (absl::StartsWith(detail, absl::StrCat(named, ": "))) {
    detail.erase(0, named.size() + 2);
  } else if (absl::StartsWith(detail, absl::StrCat(named, " "))) {
    detail.replace(0, named.size(), "its daemon");
  }
  auto const code = from_link.code();
  if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded) {
    char const* const what = code == absl::StatusCode::kUnavailable
                                 ? "cannot be reached from this node's rmmd"
                                 : "did not answer this node's rmmd in time";
    char const* const where =
        absl::StrContains(detail, "rmmctl peers") ? "" : " (see `rmmctl peers`)";
    auto const message = absl::StrCat("node '", node, "' ", what, where, ": ", detail);
    return wire::mark_unreachable_node(absl::Status(code, message), node);
  }
  // UNAUTHENTICATED: whoever answered is not the peer (the link checked its
  // certificate); INTERNAL, UNKNOWN: a fault, not a refusal.
  bool const refusal = code != absl::StatusCode::kUnauthenticated &&
                       code != absl::StatusCode::kInternal && code != absl::StatusCode::kUnknown;
  return {code, absl::StrCat("node '", node, refusal ? "' refused: " : "': ", detail)};
}

}  // namespace rmmd::peering
