#pragma once

// What a peer may open here (peering.grants), and the checks of a
// RemoteOpenRequest that need no core: pure functions, fuzzed
// (tests/fuzz/peer_service_fuzz.cpp).

#include "daemon/config/settings.hpp"
#include "daemon/core/types.hpp"
#include "rmmd/v1/peer.pb.h"

#include <absl/status/statusor.h>

#include <string>
#include <vector>

namespace rmmd::peering {

/// A remote open, checked: the buffer's name and how it is opened, its access
/// narrowed to what the grant allows.
struct checked_open {
  std::string name{};
  core::buffer_open_options how{};
};

/// The grant of `identity` (its certificate subject; "" for a plaintext
/// peer, which only "*" matches) for buffer `name`, and the access it may
/// have: PERMISSION_DENIED `peer 'ID' may not open buffer 'NAME' (no grant in
/// peering.grants names it)`; read-write asked where no grant allows writers:
/// PERMISSION_DENIED too. INVALID_ARGUMENT for an access the protocol does not
/// define or a label named twice.
absl::StatusOr<checked_open> check_remote_open(
    std::vector<config::peer_grant_settings> const& grants,
    std::string const& identity,
    v1::RemoteOpenRequest const& request);

/// A remote listing, checked: what it selects, and the name prefixes of
/// every grant that names the caller.
struct checked_list {
  core::buffer_filter filter{};
  std::vector<std::string> granted_prefixes{};

  /// Whether a grant of the caller names buffer `name` (the rule
  /// check_remote_open applies).
  [[nodiscard]] bool granted(std::string const& name) const;
};

/// A ListRemoteBuffers from `identity`: INVALID_ARGUMENT for a label named
/// twice. An identity no grant names may list, and sees nothing.
absl::StatusOr<checked_list> check_remote_list(
    std::vector<config::peer_grant_settings> const& grants,
    std::string const& identity,
    v1::ListRemoteBuffersRequest const& request);

/// Whether `identity` may say Hello here: some peering.grants entry names it
/// (or is "*"), or it is one of `peer_identities` (the non-empty identities
/// of peering.peers). PERMISSION_DENIED in words otherwise.
absl::Status check_hello(std::vector<config::peer_grant_settings> const& grants,
                         std::vector<std::string> const& peer_identities,
                         std::string const& identity);

}  // namespace rmmd::peering
