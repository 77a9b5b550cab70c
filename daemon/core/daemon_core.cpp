// daemon_core: the steps that span the core's parts (a session's end, the
// drain, a reload).

#include "daemon/core/daemon_core.hpp"

#include <malloc.h>

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

namespace rmmd::core {
namespace {

/// Leases a closing session must have held for close_session() to give the
/// heap back to the kernel (malloc_trim costs about a millisecond).
constexpr std::size_t big_session_leases = 10000;

}  // namespace

daemon_core::daemon_core(core_options options)
    : state_(std::move(options)),
      pools_(state_),
      sessions_(state_, pools_),
      leases_(state_),
      buffers_(state_),
      stables_(state_)
{
}

daemon_core::~daemon_core()
{
  close_all_sessions();
  buffers_.free_all();
  stables_.free_all();
}

void daemon_core::close_session(session_id id) noexcept
{
  std::size_t leases = 0;
  std::vector<std::shared_ptr<pool_backend>> retired;   // destroyed without the lock
  buffer_registry::foreign_release foreign;             // told without the lock
  auto const since = std::chrono::steady_clock::now();  // a write lease's takeover starts here
  {
    std::lock_guard lock(state_.mutex);
    auto* s = state_.find_session_locked(id);
    if (s == nullptr) { return; }
    leases = leases_.held_count_locked(id);
    stables_.release_session_locked(*s);
    leases_.release_all_leases_locked(*s);
    foreign           = buffers_.release_all_locked(*s, since);
    auto const tenant = s->tenant;
    if (sessions_.forget_locked(id)) { retired = pools_.retire_tenant_locked(tenant); }
    state_.reclaim.room_changed();  // its leases are back, and its idle slabs gone from the count
  }
  retired.clear();
  foreign.tell();
  // A session that held many leases leaves megabytes of freed tables and
  // batches in the heap, which glibc keeps (50 MiB after a million leases):
  // give them back to the kernel, without the lock.
  if (leases >= big_session_leases) { ::malloc_trim(0); }
}

void daemon_core::close_all_sessions() noexcept
{
  std::vector<session_id> ids;
  {
    std::lock_guard lock(state_.mutex);
    for (auto const& [id, s] : state_.sessions) { ids.push_back(id); }
  }
  for (auto id : ids) { close_session(id); }
}

void daemon_core::stop_new_sessions()
{
  std::lock_guard lock(state_.mutex);
  state_.sessions_closed = true;
  state_.buffers_changed.notify_all();  // waiting opens answer UNAVAILABLE
}

void daemon_core::begin_drain()
{
  std::lock_guard lock(state_.mutex);
  state_.draining = true;
  state_.buffers_changed.notify_all();  // waiting opens answer UNAVAILABLE
  state_.reclaim.room_changed();        // and requests waiting for idle slabs
  for (auto const& pool : state_.pools) {
    for (auto const& [tenant, slot] : pool->tenants.slots()) {
      if (slot.backend) { slot.backend->stop_lending(); }
    }
  }
}

bool daemon_core::draining() const
{
  std::lock_guard lock(state_.mutex);
  return state_.draining || state_.sessions_closed;
}

void daemon_core::reconfigure(core_reload reload)
{
  std::lock_guard lock(state_.mutex);
  state_.options.access = std::move(reload.access);
  state_.options.quotas = std::move(reload.quotas);
  state_.reclaim.set_timeout(reload.reclaim_timeout);
  state_.packed.set_pack_up_to(reload.pack_up_to);
}

}  // namespace rmmd::core
