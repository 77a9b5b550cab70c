// buffer_registry's side of peering: this node's buffers held by other nodes'
// daemons (remote holds), and other nodes' buffers held by this node's
// sessions (foreign holds). Who a peer is, its leases and its grants live in
// daemon/peering/.

#include "common/buffer_name.hpp"
#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/core/buffer_registry.hpp"
#include "daemon/core/core_entries.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>

namespace rmmd::core {

absl::StatusOr<remote_buffer_grant> buffer_registry::open_remote_buffer(
    std::string_view name, buffer_open_options const& how)
{
  std::lock_guard lock(state_.mutex);
  auto const request =
      absl::StrFormat("open buffer %s from another node", quoted_for_message(name));
  if (auto problem = names::buffer_name_problem(name)) {
    return absl::InvalidArgumentError(absl::StrCat(request, ": ", *problem));
  }
  if (how.exclusive) {
    return absl::InvalidArgumentError(
        absl::StrCat(request,
                     ": a write lease is held by a session of the buffer's own node "
                     "(docs/failover.md); open it exclusively there"));
  }
  if (state_.draining || state_.sessions_closed) {
    return absl::UnavailableError(
        absl::StrCat(request, ": the daemon is draining for shutdown; no new holds"));
  }
  auto n = state_.buffer_names.find(std::string(name));
  if (n == state_.buffer_names.end()) {
    return absl::NotFoundError(absl::StrCat(
        request, ": no buffer has this name on this node (see `rmmctl buffers` there)"));
  }
  auto& b = *state_.buffers.at(n->second);
  if (b.creating || b.state != buffer_state::published) {
    return absl::NotFoundError(absl::StrCat(
        request, ": it is not published yet (its creator is still writing it); open it after"));
  }
  auto const& pool = state_.pools[b.pool]->config;
  if (b.block.fabric_handle.empty()) {
    bool const pool_has_fabric =
        std::find(pool.handle_types.begin(), pool.handle_types.end(), handle_type::fabric) !=
        pool.handle_types.end();
    if (pool_has_fabric && b.block.driver_handle == 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "buffer %s is a pointer of pool '%s' (the daemon runs with "
          "--cuda-shared-buffer-memory=pool), which has no fabric handle of its own; only a "
          "buffer with an allocation of its own in a fabric pool can be opened from another "
          "node",
          quoted_for_message(name),
          pool.name));
    }
    return absl::FailedPreconditionError(absl::StrFormat(
        "buffer %s is in pool '%s', which exports no fabric handles; only a fabric pool's "
        "buffers can be opened from another node",
        quoted_for_message(name),
        pool.name));
  }
  auto const id  = next_remote_hold_++;
  auto const key = remote_holder_key(id);
  if (auto refused = open_refusal_locked(b, key, how, request)) { return *refused; }
  if (how.access == buffer_access::read_write) {
    if (auto refused = plain_writer_refusal_locked(b, key, request)) { return *refused; }
    ++b.writers[key];
  }
  ++b.holders[key];
  remote_holds_.emplace(id, remote_hold_entry{.buffer = b.id, .bytes = b.block.block.bytes});
  return remote_buffer_grant{
      .hold = id, .grant = buffer_grant_locked(b, how.access), .gpu_uuid = pool.gpu_uuid};
}

std::vector<buffer_info> buffer_registry::list_remote_buffers(
    buffer_filter const& filter, std::function<bool(std::string const& name)> const& may_list) const
{
  std::lock_guard lock(state_.mutex);
  std::vector<buffer_info> out;
  for (auto const& [id, b] : state_.buffers) {
    // open_remote_buffer()'s own conditions: a deleted buffer, or one
    // without a fabric handle, could only ever be refused.
    if (b->creating || b->state != buffer_state::published || b->block.fabric_handle.empty()) {
      continue;
    }
    if (filter_selects(filter, *b) && may_list(b->name)) { out.push_back(buffer_info_locked(*b)); }
  }
  std::sort(out.begin(), out.end(), [](auto const& x, auto const& y) { return x.name < y.name; });
  return out;
}

absl::Status buffer_registry::close_remote_hold(remote_hold_id id)
{
  std::lock_guard lock(state_.mutex);
  auto it = remote_holds_.find(id);
  if (it == remote_holds_.end()) {
    return absl::NotFoundError(
        absl::StrFormat("close remote hold %d: no such hold (closed, expired or never made)", id));
  }
  auto const buffer = it->second.buffer;
  remote_holds_.erase(it);
  if (auto b = state_.buffers.find(buffer); b != state_.buffers.end()) {
    drop_hold_locked(*b->second, remote_holder_key(id));
    state_.buffers_changed.notify_all();
  }
  return absl::OkStatus();
}

std::map<remote_hold_id, remote_hold_entry> buffer_registry::remote_holds() const
{
  std::lock_guard lock(state_.mutex);
  return remote_holds_;
}

absl::StatusOr<buffer_id> buffer_registry::add_foreign_hold(session_id session)
{
  std::lock_guard lock(state_.mutex);
  auto found = state_.session_locked(session, "open a buffer of another node");
  if (!found.ok()) { return found.status(); }
  auto const id = next_buffer_++;  // never reused: no buffer of this node can have it
  (*found)->foreign_holds.insert(id);
  return id;
}

void buffer_registry::set_foreign_release_notifier(foreign_release_notifier notify)
{
  std::lock_guard lock(state_.mutex);
  foreign_released_ = std::move(notify);
}

}  // namespace rmmd::core
