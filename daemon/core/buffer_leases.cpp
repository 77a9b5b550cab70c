// buffer_registry: a shared buffer's write lease (docs/failover.md). At most
// one session holds it; exclusive opens wait in line for it, first come
// first served, and the daemon hands it to the first in line when its holder
// closes the exclusive open or its session ends, in the same critical
// section that drops the holder's holds: a grant is always ordered after
// the old holder's session socket closed (the session layer closes it before
// it ends the session) and after the daemon forgot every mapping of it.
// Plain read-write opens and the lease keep out of each other's way: a
// lease waits for other sessions' plain writers to close, and a plain
// read-write open is refused while another session holds or waits for the
// lease. A standby open (docs/failover.md, "A standby that is ready")
// stands in line holding the buffer, so that its process maps it before
// the grant; the grant then adds no hold, and wait_buffer_lease() finds it.

#include "daemon/core/buffer_registry.hpp"

#include "daemon/core/core_entries.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

#include <algorithm>

namespace rmmd::core {
namespace {

using steady = std::chrono::steady_clock;

std::int64_t milliseconds_since(steady::time_point start)
{
  return std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - start).count();
}

}  // namespace

bool buffer_registry::no_other_writer_locked(buffer_entry const& b, session_id session)
{
  return std::all_of(b.writers.begin(), b.writers.end(), [&](auto const& w) {
    return w.first == session || w.second == 0;
  });
}

std::uint64_t buffer_registry::next_generation_locked(buffer_entry& b) const noexcept
{
  // Within one daemon the generations of a buffer count up by one; a daemon
  // that adopted the buffer after a restart starts above every generation of
  // the daemons before it (their count is in the state file it read).
  ++b.lease.grants;
  return (static_cast<std::uint64_t>(state_.restart.restarts) << 32) + b.lease.grants;
}

std::uint64_t buffer_registry::grant_lease_locked(buffer_entry& b, session_entry& s, bool add_hold)
{
  b.lease.holder     = s.id;
  b.lease.generation = next_generation_locked(b);
  b.lease.granted    = std::chrono::system_clock::now();
  if (add_hold) {
    ++b.holders[s.id];
    ++s.holds[b.id];
  }
  state_.stats.lease_granted();
  return b.lease.generation;
}

void buffer_registry::grant_to_next_locked(buffer_entry& b, steady::time_point since) noexcept
{
  auto& lease = b.lease;
  while (lease.holder == 0 && !lease.waiters.empty() &&
         no_other_writer_locked(b, lease.waiters.front().session)) {
    auto const next = lease.waiters.front();
    lease.waiters.pop_front();
    auto* s = state_.find_session_locked(next.session);
    if (s == nullptr) { continue; }  // a session's end takes its waits out of line first
    if (auto w = s->lease_waits.find(b.id); w != s->lease_waits.end() && --w->second == 0) {
      s->lease_waits.erase(w);
    }
    auto const generation = grant_lease_locked(b, *s, !next.standby);
    // A standby's grant is found by its session (wait_buffer_lease); a
    // waiting open takes its ticket's.
    if (!next.standby) { lease.granted_tickets.emplace(next.ticket, generation); }
    state_.stats.lease_taken_over(steady::now() - since);
    state_.buffers_changed.notify_all();
  }
}

void buffer_registry::settle_lease_locked(buffer_entry& b,
                                          session_id holder,
                                          hold_kind kind,
                                          std::size_t remaining) noexcept
{
  auto& lease       = b.lease;
  bool holds_lease  = lease.holder == holder;
  auto w            = b.writers.find(holder);
  auto const forget = [&] {
    b.writers.erase(w);
    w = b.writers.end();
  };
  if (kind == hold_kind::lease && holds_lease) {
    lease.holder = 0;
    holds_lease  = false;
  } else if (kind == hold_kind::lease && leave_standby_locked(b, holder)) {
    // A standby closed before its grant: out of line, nothing more.
  } else if (kind == hold_kind::read_write && w != b.writers.end()) {
    if (--w->second == 0) { forget(); }
  }
  // What is left must cover the lease and the plain writes: a session's
  // last open ends its lease, whichever open that was.
  if (holds_lease && remaining == 0) {
    lease.holder = 0;
    holds_lease  = false;
  }
  if (remaining == 0) { leave_standby_locked(b, holder); }
  auto const most = remaining - (holds_lease ? 1 : 0);
  if (w != b.writers.end() && w->second > most) {
    if (most == 0) {
      forget();
    } else {
      w->second = most;
    }
  }
}

bool buffer_registry::leave_line_locked(buffer_entry& b, std::uint64_t ticket) noexcept
{
  auto& line = b.lease.waiters;
  auto it =
      std::find_if(line.begin(), line.end(), [&](auto const& w) { return w.ticket == ticket; });
  if (it == line.end()) { return false; }
  if (auto* s = state_.find_session_locked(it->session)) {
    if (auto w = s->lease_waits.find(b.id); w != s->lease_waits.end() && --w->second == 0) {
      s->lease_waits.erase(w);
    }
  }
  line.erase(it);
  // The one that left may have been first in line before a session whose
  // own plain write open kept the lease from the one that left.
  grant_to_next_locked(b, steady::now());
  return true;
}

bool buffer_registry::may_write_locked(buffer_entry const& b, session_id session) const
{
  if (b.lease.holder == session) { return true; }
  if (auto w = b.writers.find(session); w != b.writers.end() && w->second > 0) { return true; }
  return std::any_of(b.lease.waiters.begin(), b.lease.waiters.end(), [&](auto const& w) {
    return w.standby && w.session == session;
  });
}

bool buffer_registry::leave_standby_locked(buffer_entry& b, session_id session) noexcept
{
  auto const& line = b.lease.waiters;
  auto it          = std::find_if(
      line.begin(), line.end(), [&](auto const& w) { return w.standby && w.session == session; });
  if (it == line.end()) { return false; }
  // leave_line_locked grants to the next in line where this one was first.
  return leave_line_locked(b, it->ticket);
}

void buffer_registry::end_line_locked(buffer_entry& b) noexcept
{
  for (auto const& w : b.lease.waiters) {
    if (auto* s = state_.find_session_locked(w.session)) { s->lease_waits.erase(b.id); }
  }
  if (b.lease.waiters.empty()) { return; }
  b.lease.waiters.clear();
  state_.buffers_changed.notify_all();
}

void buffer_registry::leave_all_lines_locked(session_entry& s) noexcept
{
  auto const waits = std::move(s.lease_waits);
  s.lease_waits.clear();
  for (auto const& [id, count] : waits) {
    auto it = state_.buffers.find(id);
    if (it == state_.buffers.end()) { continue; }
    auto& b = *it->second;
    std::erase_if(b.lease.waiters, [&](auto const& w) { return w.session == s.id; });
    grant_to_next_locked(b, steady::now());
  }
}

std::string buffer_registry::lease_busy_locked(buffer_entry const& b, session_id session) const
{
  auto const& lease = b.lease;
  std::string out;
  if (lease.holder != 0) {
    auto const* h = state_.find_session_locked(lease.holder);
    out           = absl::StrFormat(
        "its write lease is held by session %d (pid %d, uid %d), "
                  "generation %d",
        lease.holder,
        h != nullptr ? h->peer.pid : 0,
        h != nullptr ? h->peer.uid : 0,
        lease.generation);
  } else {
    auto const writers = std::count_if(b.writers.begin(), b.writers.end(), [&](auto const& w) {
      return w.first != session && w.second > 0;
    });
    out                = absl::StrFormat(
        "%d other holder(s) have it open for writing without the lease (plain read-write opens, "
                       "or its creator's create), and a lease waits until they close it",
        writers);
  }
  auto const mine = std::find_if(lease.waiters.begin(), lease.waiters.end(), [&](auto const& w) {
    return w.session == session;
  });
  if (auto const ahead = mine - lease.waiters.begin(); ahead > 0) {
    absl::StrAppendFormat(&out, "; %d exclusive open(s) wait in line before this one", ahead);
  }
  return out;
}

std::optional<absl::Status> buffer_registry::plain_writer_refusal_locked(
    buffer_entry const& b, session_id session, std::string_view request) const
{
  auto const& lease = b.lease;
  if (lease.holder != 0 && lease.holder != session) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s for writing: %s; while a session holds the lease, others open it for "
                        "reading only (open it exclusively, with a wait, to write after it)",
                        std::string(request),
                        lease_busy_locked(b, session)));
  }
  auto const others = std::count_if(lease.waiters.begin(), lease.waiters.end(), [&](auto const& w) {
    return w.session != session;
  });
  if (others > 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s for writing: %d exclusive open(s) wait for its write lease, which a plain read-write "
        "open would keep from them; open it exclusively, or for reading",
        std::string(request),
        others));
  }
  return std::nullopt;
}

absl::StatusOr<buffer_grant> buffer_registry::open_exclusive_locked(
    std::unique_lock<std::mutex>& lock,
    buffer_entry& b,
    session_entry& s,
    steady::time_point wait_until,
    std::string const& request,
    bool standby)
{
  b.lease.asked = true;
  if (b.lease.holder == s.id) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s exclusively: this session holds its write lease already (generation %d); one lease "
        "per session: use the open that has it",
        request,
        b.lease.generation));
  }
  auto const& line = b.lease.waiters;
  if (std::any_of(line.begin(), line.end(), [&](auto const& w) {
        return w.session == s.id && (standby || w.standby);
      })) {
    return absl::FailedPreconditionError(absl::StrCat(
        request,
        " exclusively: this session stands in line for its write lease already (a standby open, "
        "or a waiting exclusive open); one lease per session: wait with the open in line"));
  }
  if (b.lease.holder == 0 && b.lease.waiters.empty() && no_other_writer_locked(b, s.id)) {
    auto const generation  = grant_lease_locked(b, s);
    auto grant             = buffer_grant_locked(b, buffer_access::read_write);
    grant.lease_generation = generation;
    return grant;
  }
  if (standby) {
    if (state_.draining || state_.sessions_closed) {
      return absl::UnavailableError(absl::StrCat(
          request, " as a standby: the daemon is draining for shutdown; no new places in line"));
    }
    return stand_in_line_locked(b, s);
  }
  if (steady::now() >= wait_until) {
    return absl::DeadlineExceededError(
        absl::StrFormat("%s exclusively: %s; nothing changed: open it with a wait to wait in line "
                        "for the lease",
                        request,
                        lease_busy_locked(b, s.id)));
  }
  if (state_.draining || state_.sessions_closed) {
    return absl::UnavailableError(absl::StrCat(
        request, " exclusively: the daemon is draining for shutdown; no new waits for a lease"));
  }
  auto const ticket = next_ticket_++;
  b.lease.waiters.push_back(
      lease_waiter{.ticket = ticket, .session = s.id, .since = std::chrono::system_clock::now()});
  ++s.lease_waits[b.id];
  state_.stats.lease_waited();
  return wait_for_lease_locked(lock, b.id, s.id, ticket, wait_until, request);
}

buffer_grant buffer_registry::stand_in_line_locked(buffer_entry& b, session_entry& s)
{
  b.lease.waiters.push_back(lease_waiter{.ticket  = next_ticket_++,
                                         .session = s.id,
                                         .since   = std::chrono::system_clock::now(),
                                         .standby = true});
  ++s.lease_waits[b.id];
  ++b.holders[s.id];
  ++s.holds[b.id];
  state_.stats.lease_waited();
  return buffer_grant_locked(b, buffer_access::read_write);  // lease_generation 0: in line
}

absl::StatusOr<std::uint64_t> buffer_registry::wait_buffer_lease(session_id session,
                                                                 buffer_id id,
                                                                 steady::time_point wait_until)
{
  std::unique_lock lock(state_.mutex);
  auto const request = absl::StrFormat("wait for the write lease of buffer %d", id);
  auto const started = steady::now();
  while (true) {
    auto found = state_.session_locked(session, request);
    if (!found.ok()) {
      return absl::UnauthenticatedError(
          absl::StrCat(request, ": the session closed (or never was); open a new session"));
    }
    auto& s = **found;
    auto it = state_.buffers.find(id);
    if (it == state_.buffers.end() || !s.holds.contains(id) || it->second->creating) {
      return absl::NotFoundError(absl::StrCat(
          request, ": this session does not hold it (never opened, or closed already)"));
    }
    auto& b = *it->second;
    if (b.lease.holder == session) { return b.lease.generation; }
    auto const& line   = b.lease.waiters;
    bool const in_line = std::any_of(
        line.begin(), line.end(), [&](auto const& w) { return w.standby && w.session == session; });
    if (!in_line) {
      if (b.state == buffer_state::deleted) {
        return absl::NotFoundError(
            absl::StrCat(request,
                         ": the buffer was deleted while this session stood in line for its "
                         "write lease (see `rmmctl buffers`)"));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          request,
          ": this session has no standby open of it in line (open it with exclusive and standby)"));
    }
    if (steady::now() >= wait_until) {
      state_.stats.lease_wait_timed_out();
      return absl::DeadlineExceededError(absl::StrFormat(
          "%s: waited %d ms, in vain: %s; nothing changed: the standby stays in line (wait "
          "again, or close it to leave)",
          request,
          milliseconds_since(started),
          lease_busy_locked(b, session)));
    }
    if (state_.draining || state_.sessions_closed) {
      return absl::UnavailableError(absl::StrCat(
          request, ": the daemon is draining for shutdown; it stopped the wait for the lease"));
    }
    ++waiting_opens_;
    state_.buffers_changed.wait_until(lock, wait_until);
    --waiting_opens_;
  }
}

absl::StatusOr<buffer_grant> buffer_registry::wait_for_lease_locked(
    std::unique_lock<std::mutex>& lock,
    buffer_id id,
    session_id session,
    std::uint64_t ticket,
    steady::time_point wait_until,
    std::string const& request)
{
  auto const started = steady::now();
  while (true) {
    ++waiting_opens_;
    state_.buffers_changed.wait_until(lock, wait_until);
    --waiting_opens_;
    auto it    = state_.buffers.find(id);
    auto* b    = it == state_.buffers.end() ? nullptr : it->second.get();
    auto* s    = state_.find_session_locked(session);
    bool found = false;
    std::uint64_t generation{};
    if (b != nullptr) {
      if (auto g = b->lease.granted_tickets.find(ticket); g != b->lease.granted_tickets.end()) {
        found      = true;
        generation = g->second;
        b->lease.granted_tickets.erase(g);
      }
    }
    if (s == nullptr) {
      // Its end took the wait out of line, or let go of what it was granted.
      return absl::UnauthenticatedError(absl::StrCat(
          request, ": the session closed while it waited for the write lease; open a new session"));
    }
    if (found) {
      auto grant             = buffer_grant_locked(*b, buffer_access::read_write);
      grant.lease_generation = generation;
      return grant;
    }
    bool const in_line =
        b != nullptr && std::any_of(b->lease.waiters.begin(),
                                    b->lease.waiters.end(),
                                    [&](auto const& w) { return w.ticket == ticket; });
    if (!in_line) {
      return absl::NotFoundError(absl::StrCat(
          request,
          ": the buffer was deleted while this session waited for its write lease (see `rmmctl "
          "buffers`)"));
    }
    if (steady::now() >= wait_until) {
      auto busy = lease_busy_locked(*b, session);
      leave_line_locked(*b, ticket);
      state_.stats.lease_wait_timed_out();
      return absl::DeadlineExceededError(
          absl::StrFormat("%s exclusively: waited %d ms for the write lease, in vain: %s; "
                          "nothing changed: open it again with a longer wait, or end the holder",
                          request,
                          milliseconds_since(started),
                          busy));
    }
    if (state_.draining || state_.sessions_closed) {
      leave_line_locked(*b, ticket);
      return absl::UnavailableError(absl::StrCat(
          request,
          " exclusively: the daemon is draining for shutdown; it stopped the wait for the lease"));
    }
  }
}

std::optional<buffer_lease_info> buffer_registry::lease_info_locked(buffer_entry const& b) const
{
  auto const& lease = b.lease;
  if (!lease.asked && lease.generation == 0) { return std::nullopt; }
  buffer_lease_info out{.generation = lease.generation, .holder = lease.holder};
  if (auto const* h = lease.holder != 0 ? state_.find_session_locked(lease.holder) : nullptr) {
    out.holder_pid = h->peer.pid;
    out.holder_uid = h->peer.uid;
    out.granted    = lease.granted;
  }
  for (auto const& w : lease.waiters) {
    auto const* s = state_.find_session_locked(w.session);
    out.waiters.push_back(lease_waiter_info{.session = w.session,
                                            .pid     = s != nullptr ? s->peer.pid : 0,
                                            .uid     = s != nullptr ? s->peer.uid : 0,
                                            .since   = w.since});
  }
  out.plain_writers = static_cast<std::size_t>(
      std::count_if(b.writers.begin(), b.writers.end(), [&](auto const& w) {
        return w.first != lease.holder && w.second > 0;
      }));
  return out;
}

lease_totals buffer_registry::leases() const
{
  std::lock_guard lock(state_.mutex);
  auto out = state_.stats.leases();
  for (auto const& [id, b] : state_.buffers) {
    if (b->lease.holder != 0) { ++out.held; }
    out.waiters += b->lease.waiters.size();
  }
  return out;
}

}  // namespace rmmd::core
