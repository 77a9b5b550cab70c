#include "daemon/peering/peer_grants.hpp"

#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/wire/proto_convert.hpp"

#include <absl/strings/str_format.h>

#include <algorithm>

namespace rmmd::peering {
namespace {

bool grant_is_for(config::peer_grant_settings const& g, std::string const& identity)
{
  return g.identity == "*" || (!identity.empty() && g.identity == identity);
}

bool grant_names(config::peer_grant_settings const& g,
                 std::string const& identity,
                 std::string const& name)
{
  if (!grant_is_for(g, identity)) { return false; }
  for (auto const& prefix : g.name_prefixes) {
    if (name.starts_with(prefix)) { return true; }
  }
  return false;
}

}  // namespace

absl::StatusOr<checked_open> check_remote_open(
    std::vector<config::peer_grant_settings> const& grants,
    std::string const& identity,
    v1::RemoteOpenRequest const& request)
{
  auto const shown = identity.empty() ? std::string("(plaintext, no certificate)") : identity;
  if (!v1::BufferAccess_IsValid(request.access())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "open buffer %s from another node: access %d is not one the protocol defines",
        core::quoted_for_message(request.name()),
        static_cast<int>(request.access())));
  }
  if (auto key = wire::repeated_label_key(request.expect_labels())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("open buffer %s from another node: expect_labels names %s twice",
                        core::quoted_for_message(request.name()),
                        core::quoted_for_message(*key)));
  }
  bool granted       = false;
  bool allow_writers = false;
  for (auto const& g : grants) {
    if (!grant_names(g, identity, request.name())) { continue; }
    granted = true;
    allow_writers |= g.allow_writers;
  }
  if (!granted) {
    return absl::PermissionDeniedError(
        absl::StrFormat("peer '%s' may not open buffer %s (no grant in peering.grants names it)",
                        shown,
                        core::quoted_for_message(request.name())));
  }
  bool const writing = request.access() == v1::BUFFER_ACCESS_READ_WRITE;
  if (writing && !allow_writers) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "peer '%s' may not open buffer %s for writing (no grant in peering.grants that names it "
        "sets allow_writers); open it for reading",
        shown,
        core::quoted_for_message(request.name())));
  }
  checked_open out{.name = request.name()};
  out.how.access        = writing ? core::buffer_access::read_write : core::buffer_access::read;
  out.how.expect_labels = wire::from_proto(request.expect_labels());
  return out;
}

bool checked_list::granted(std::string const& name) const
{
  return std::any_of(granted_prefixes.begin(), granted_prefixes.end(), [&](auto const& prefix) {
    return name.starts_with(prefix);
  });
}

absl::StatusOr<checked_list> check_remote_list(
    std::vector<config::peer_grant_settings> const& grants,
    std::string const& identity,
    v1::ListRemoteBuffersRequest const& request)
{
  if (auto key = wire::repeated_label_key(request.labels())) {
    return absl::InvalidArgumentError(
        absl::StrFormat("list buffers from another node: the filter names label %s twice; name "
                        "each label once",
                        core::quoted_for_message(*key)));
  }
  checked_list out{.filter = {.name_prefix = request.name_prefix(),
                              .labels      = wire::from_proto(request.labels())}};
  for (auto const& g : grants) {
    if (!grant_is_for(g, identity)) { continue; }
    out.granted_prefixes.insert(
        out.granted_prefixes.end(), g.name_prefixes.begin(), g.name_prefixes.end());
  }
  return out;
}

absl::Status check_hello(std::vector<config::peer_grant_settings> const& grants,
                         std::vector<std::string> const& peer_identities,
                         std::string const& identity)
{
  for (auto const& g : grants) {
    if (g.identity == "*" || (!identity.empty() && g.identity == identity)) {
      return absl::OkStatus();
    }
  }
  if (!identity.empty() && std::find(peer_identities.begin(), peer_identities.end(), identity) !=
                               peer_identities.end()) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "peer '%s' may not peer with this node: no peering.grants entry names its identity (nor "
      "\"*\"), and no peering.peers entry has it as its identity",
      identity.empty() ? std::string("(plaintext, no certificate)") : identity));
}

}  // namespace rmmd::peering
