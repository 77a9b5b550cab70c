#include "daemon/peering/remote_hold_ledger.hpp"

#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/log.hpp"
#include "daemon/wire/status_mapping.hpp"

#include <absl/strings/str_format.h>
#include <absl/strings/str_join.h>

#include <algorithm>

namespace rmmd::peering {
namespace {

std::string shown(std::string const& identity)
{
  return identity.empty() ? std::string("(plaintext)") : identity;
}

}  // namespace

remote_hold_ledger::remote_hold_ledger(core::daemon_core& core, std::chrono::milliseconds lease)
    : core_(core), lease_(lease)
{
}

remote_hold_ledger::~remote_hold_ledger()
{
  stop();
}

void remote_hold_ledger::hello(std::string const& identity,
                               std::string const& node_name,
                               std::string const& address,
                               std::uint64_t incarnation,
                               bool we_imported_its_probe,
                               std::string const& probe_problem)
{
  std::lock_guard lock(mutex_);
  auto& c = callers_[caller_key{identity, node_name}];
  if (c.incarnation != 0 && c.incarnation != incarnation) {
    std::size_t ended = 0;
    for (auto it = holds_.begin(); it != holds_.end();) {
      auto next = std::next(it);
      if (it->second.identity == identity && it->second.incarnation == c.incarnation) {
        end_locked(it);
        ++ended;
      }
      it = next;
    }
    if (ended > 0) {
      log::info("peer '%s' (node '%s') started again: ended the %d hold(s) of its last daemon",
                shown(identity),
                node_name,
                ended);
    }
  }
  c.address               = address;
  c.incarnation           = incarnation;
  c.we_imported_its_probe = we_imported_its_probe;
  c.probe_problem         = probe_problem;
  c.last_contact          = std::chrono::system_clock::now();
}

absl::StatusOr<remote_hold_ledger::caller_key> remote_hold_ledger::check_incarnation_locked(
    std::string const& identity, std::uint64_t incarnation, char const* what)
{
  std::vector<std::uint64_t> live;
  for (auto it = callers_.lower_bound(caller_key{identity, std::string()});
       it != callers_.end() && it->first.first == identity;
       ++it) {
    if (it->second.incarnation == 0) { continue; }
    if (it->second.incarnation == incarnation) {
      it->second.last_contact = std::chrono::system_clock::now();
      return it->first;
    }
    live.push_back(it->second.incarnation);
  }
  if (live.empty()) {
    return wire::mark_hello_needed(absl::FailedPreconditionError(absl::StrFormat(
        "%s: peer '%s' has not said Hello; call Hello first", what, shown(identity))));
  }
  return wire::mark_hello_needed(absl::FailedPreconditionError(
      absl::StrFormat("%s: incarnation %d of peer '%s' is not the one any of its nodes' last "
                      "Hello gave (%s); call Hello again",
                      what,
                      incarnation,
                      shown(identity),
                      absl::StrJoin(live, ", "))));
}

absl::StatusOr<core::remote_buffer_grant> remote_hold_ledger::open(std::string const& identity,
                                                                   std::uint64_t incarnation,
                                                                   checked_open const& open,
                                                                   remote_holder const& holder)
{
  std::lock_guard lock(mutex_);
  if (stopping_) {
    return absl::UnavailableError("open a buffer from another node: this daemon is stopping");
  }
  if (auto s = check_incarnation_locked(identity, incarnation, "open a buffer from another node");
      !s.ok()) {
    return s.status();
  }
  auto grant = core_.buffers().open_remote_buffer(open.name, open.how);
  if (!grant.ok()) { return grant.status(); }
  holds_.emplace(grant->hold,
                 hold{.identity    = identity,
                      .incarnation = incarnation,
                      .bytes       = grant->grant.block.block.bytes,
                      .renewed     = clock::now(),
                      .holder      = holder,
                      .buffer      = open.name});
  return grant;
}

absl::StatusOr<std::vector<core::buffer_info>> remote_hold_ledger::list(std::string const& identity,
                                                                        std::uint64_t incarnation,
                                                                        checked_list const& list)
{
  {
    std::lock_guard lock(mutex_);
    if (auto s = check_incarnation_locked(identity, incarnation, "list buffers from another node");
        !s.ok()) {
      return s.status();
    }
  }
  return core_.buffers().list_remote_buffers(
      list.filter, [&](std::string const& name) { return list.granted(name); });
}

void remote_hold_ledger::their_verdict(std::string const& identity,
                                       std::uint64_t incarnation,
                                       bool ok,
                                       std::string const& problem)
{
  std::lock_guard lock(mutex_);
  for (auto& [key, c] : callers_) {
    if (key.first == identity && c.incarnation == incarnation) {
      c.it_imported_our_probe = ok;
      c.our_probe_problem     = ok ? std::string() : problem;
    }
  }
}

absl::StatusOr<std::vector<std::uint64_t>> remote_hold_ledger::renew(
    std::string const& identity,
    std::uint64_t incarnation,
    std::vector<std::uint64_t> const& ids,
    clock::time_point now)
{
  std::lock_guard lock(mutex_);
  if (auto s = check_incarnation_locked(identity, incarnation, "renew holds"); !s.ok()) {
    return s.status();
  }
  std::vector<std::uint64_t> unknown;
  for (auto id : ids) {
    auto it = holds_.find(id);
    if (it == holds_.end() || it->second.identity != identity ||
        it->second.incarnation != incarnation) {
      unknown.push_back(id);
      continue;
    }
    it->second.renewed = now;
  }
  return unknown;
}

absl::Status remote_hold_ledger::close(std::string const& identity,
                                       std::uint64_t incarnation,
                                       std::vector<std::uint64_t> const& ids)
{
  std::lock_guard lock(mutex_);
  if (auto s = check_incarnation_locked(identity, incarnation, "close holds"); !s.ok()) {
    return s.status();
  }
  for (auto id : ids) {
    auto it = holds_.find(id);
    if (it == holds_.end() || it->second.identity != identity ||
        it->second.incarnation != incarnation) {
      continue;
    }
    end_locked(it);
  }
  return absl::OkStatus();
}

std::string remote_hold_ledger::node_of_locked(std::string const& identity,
                                               std::uint64_t incarnation) const
{
  for (auto const& [key, c] : callers_) {
    if (key.first == identity && c.incarnation == incarnation) { return key.second; }
  }
  return "?";
}

void remote_hold_ledger::end_locked(std::map<std::uint64_t, hold>::iterator it) noexcept
{
  (void)core_.buffers().close_remote_hold(it->first);  // NOT_FOUND: the core ended it already
  holds_.erase(it);
}

std::size_t remote_hold_ledger::expire(clock::time_point now)
{
  std::lock_guard lock(mutex_);
  std::size_t ended = 0;
  for (auto it = holds_.begin(); it != holds_.end();) {
    auto next = std::next(it);
    auto const since =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.renewed);
    if (since > lease_) {
      auto const node = node_of_locked(it->second.identity, it->second.incarnation);
      log::warn(
          "peer '%s' (node '%s'): hold %d on buffer %s ended: not renewed for %d ms (lease %d "
          "ms); its daemon is gone or cut off",
          shown(it->second.identity),
          node,
          it->first,
          core::quoted_for_message(it->second.buffer),
          since.count(),
          lease_.count());
      end_locked(it);
      ++ended;
      expiries_.fetch_add(1);
    }
    it = next;
  }
  return ended;
}

void remote_hold_ledger::start_reaper()
{
  auto const period =
      std::max<std::chrono::milliseconds>(lease_ / 4, std::chrono::milliseconds(50));
  reaper_ = std::thread([this, period] {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      stop_wake_.wait_for(lock, period);
      if (stopping_) { break; }
      lock.unlock();
      expire(clock::now());
      lock.lock();
    }
  });
}

void remote_hold_ledger::stop() noexcept
{
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  stop_wake_.notify_all();
  if (reaper_.joinable()) { reaper_.join(); }
  std::lock_guard lock(mutex_);
  while (!holds_.empty()) { end_locked(holds_.begin()); }
}

std::vector<accepted_peer> remote_hold_ledger::accepted() const
{
  std::lock_guard lock(mutex_);
  std::vector<accepted_peer> out;
  for (auto const& [key, c] : callers_) {
    auto const& identity = key.first;
    accepted_peer p{.identity              = identity,
                    .node_name             = key.second,
                    .address               = c.address,
                    .incarnation           = c.incarnation,
                    .we_imported_its_probe = c.we_imported_its_probe,
                    .probe_problem         = c.probe_problem,
                    .it_imported_our_probe = c.it_imported_our_probe,
                    .our_probe_problem     = c.our_probe_problem,
                    .last_contact          = c.last_contact};
    for (auto const& [id, h] : holds_) {
      if (h.identity == identity && h.incarnation == c.incarnation) {
        ++p.holds;
        p.bytes += h.bytes;
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace rmmd::peering
