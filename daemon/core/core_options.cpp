#include "daemon/core/core_options.hpp"

#include <algorithm>

namespace rmmd::core {

bool access_policy::allows(peer_credentials const& peer) const
{
  auto has = [](auto const& list, auto v) {
    return std::find(list.begin(), list.end(), v) != list.end();
  };
  if (has(uids, peer.uid) || has(gids, peer.gid)) { return true; }
  return std::any_of(peer.supplementary_gids.begin(), peer.supplementary_gids.end(), [&](gid_t g) {
    return has(gids, g);
  });
}

std::size_t quota_limits::limit_for_uid(uid_t uid) const
{
  auto it = per_uid_overrides.find(uid);
  return it == per_uid_overrides.end() ? per_uid_bytes : it->second;
}

}  // namespace rmmd::core
