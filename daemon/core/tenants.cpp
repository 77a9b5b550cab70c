#include "daemon/core/tenants.hpp"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

namespace rmmd::core {

std::string tenant_key::text() const
{
  switch (of) {
    case kind::uid:
      return absl::StrFormat("uid %d", id);
    case kind::gid:
      return absl::StrFormat("gid %d", id);
    case kind::node:
      break;
  }
  return "node";
}

tenant_key tenancy_policy::tenant_of(peer_credentials const& peer) const
{
  if (!isolate) { return {}; }
  if (std::find(shared_gids.begin(), shared_gids.end(), peer.gid) != shared_gids.end()) {
    return {.of = tenant_key::kind::gid, .id = peer.gid};
  }
  return {.of = tenant_key::kind::uid, .id = peer.uid};
}

pool_tenants::pool_tenants(std::unique_ptr<pool_backend> shared) : traits_(shared->traits())
{
  slots_[tenant_key{}].backend = std::move(shared);
}

pool_tenants::pool_tenants(backend_traits traits, backend_maker make)
    : make_(std::move(make)), traits_(traits)
{
}

tenant_slot* pool_tenants::find(tenant_key const& tenant)
{
  auto it = slots_.find(slot_key(tenant));
  return it == slots_.end() ? nullptr : &it->second;
}

tenant_slot const* pool_tenants::find(tenant_key const& tenant) const
{
  auto it = slots_.find(slot_key(tenant));
  return it == slots_.end() ? nullptr : &it->second;
}

pool_backend& pool_tenants::backend(tenant_key const& tenant) const
{
  auto const* slot = find(tenant);
  if (slot == nullptr || !slot->backend) {
    throw std::logic_error("rmmd: no backend for " + tenant.text() + " (a bug in the daemon)");
  }
  return *slot->backend;
}

absl::StatusOr<std::shared_ptr<pool_backend>> pool_tenants::make(tenant_key const& tenant,
                                                                 std::string const& pool) const
{
  try {
    std::shared_ptr<pool_backend> made = make_(tenant);
    if (!made) { throw std::runtime_error("no backend was made"); }
    return made;
  } catch (std::exception const& e) {
    return absl::InternalError(
        absl::StrFormat("cannot make pool '%s' for %s: %s", pool, tenant.text(), e.what()));
  }
}

void pool_tenants::install(tenant_key const& tenant, std::shared_ptr<pool_backend> backend)
{
  auto& slot = slots_[slot_key(tenant)];
  if (!slot.backend) { slot.backend = std::move(backend); }
}

std::shared_ptr<pool_backend> pool_tenants::release_if_unused(tenant_key const& tenant)
{
  if (!per_tenant()) { return nullptr; }
  auto it = slots_.find(tenant);
  if (it == slots_.end() || it->second.in_use != 0 || it->second.buffers != 0) { return nullptr; }
  auto backend = std::move(it->second.backend);
  slots_.erase(it);
  return backend;
}

std::vector<std::shared_ptr<pool_backend>> pool_tenants::others(tenant_key const& tenant) const
{
  std::vector<std::shared_ptr<pool_backend>> out;
  if (!per_tenant()) { return out; }
  for (auto const& [key, slot] : slots_) {
    if (key != tenant && slot.backend) { out.push_back(slot.backend); }
  }
  return out;
}

}  // namespace rmmd::core
