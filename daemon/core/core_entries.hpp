#pragma once

// What the core keeps per pool, per session and per shared buffer: the
// core's and its parts' own, never an adapter's. Guarded by the core's mutex
// (core_state.hpp); REQUIRES: whoever reads or writes an entry holds it.

#include "daemon/core/pool_backend.hpp"
#include "daemon/core/tenants.hpp"
#include "daemon/core/types.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace rmmd::core {

/// How long a pool counts as under pressure after an allocation failed there.
inline constexpr auto pressure_window = std::chrono::seconds(2);

struct pool_entry {
  explicit pool_entry(pool_tenants backends) : tenants(std::move(backends)) {}

  pool_config config;
  pool_tenants tenants;  // its backends: one per tenant, or one for everyone
  std::size_t capacity{};
  std::size_t in_use{};  // leases, packed blocks and shared buffers, of every tenant
  std::size_t live{};    // leases
  std::chrono::steady_clock::time_point pressure_until{};

  /// Counts `bytes` more lent to (sign +1) or given back by (-1) `tenant`,
  /// in the pool and in the tenant's backend.
  void count(tenant_key const& tenant, std::size_t bytes, int sign) noexcept
  {
    auto apply = [&](std::size_t& counter) {
      counter = sign > 0 ? counter + bytes : counter - bytes;
    };
    apply(in_use);
    if (auto* slot = tenants.find(tenant)) {
      apply(slot->in_use);
      slot->high_water = std::max(slot->high_water, slot->in_use);
    }
  }

  /// Bytes the pool could still lend.
  [[nodiscard]] std::size_t room() const noexcept
  {
    return capacity - std::min(capacity, in_use);
  }
};

struct session_entry {
  session_id id{};
  std::string token_hex;
  peer_credentials peer;
  tenant_key tenant;  // whose backends serve it
  std::string command;
  std::string client_name;
  std::uint32_t reconnects{};  // a client reconnecting: how many times, and its earlier session
  session_id previous_session{};
  std::size_t bytes{};  // leases and packed blocks
  std::size_t count{};  // leases
  std::chrono::system_clock::time_point started;
  std::map<pool_id, std::size_t> pool_bytes;  // what it holds, per pool
  std::map<pool_id, carved_usage> carved;     // what it says it carved, per pool
  std::size_t shared_bytes{};                 // buffers it created and holds (charged with `bytes`)
  std::map<buffer_id, std::size_t> holds;     // buffers it holds: opens (and its create) not closed
  std::set<buffer_id> foreign_holds;          // buffers of other nodes it holds (peering)
  std::map<buffer_id, std::size_t> lease_waits;  // its exclusive opens waiting in line, per buffer

  /// What it holds in `pool` now.
  [[nodiscard]] std::size_t held_in(pool_id pool) const
  {
    auto it = pool_bytes.find(pool);
    return it == pool_bytes.end() ? 0 : it->second;
  }
};

/// The live sessions, by id.
using session_map = std::map<session_id, std::unique_ptr<session_entry>>;

/// The key of remote hold `id` among a buffer's holders: outside the range
/// of session ids, which count up from 1.
inline constexpr session_id remote_holder_key(remote_hold_id id) noexcept
{
  return (session_id{1} << 63) | id;
}

/// A remote hold: the buffer it holds and its allocation's bytes.
struct remote_hold_entry {
  buffer_id buffer{};
  std::size_t bytes{};
};

/// An exclusive open waiting in line for a buffer's write lease.
struct lease_waiter {
  std::uint64_t ticket{};  // the waiting call's, unique in the daemon
  session_id session{};
  std::chrono::system_clock::time_point since{};
  // A standby open: it holds the buffer already (its open was answered at
  // once), and its grant adds no hold; no call waits on its ticket, the
  // session's wait_buffer_lease() finds it holding the lease.
  bool standby{false};
};

/// A buffer's write lease (docs/failover.md): at most one session holds it;
/// exclusive opens wait in line for it, and each grant takes the next
/// generation.
struct buffer_lease {
  session_id holder{};         // 0: nobody holds it
  std::uint64_t generation{};  // the latest grant's; 0: never granted
  std::uint64_t grants{};      // grants while this daemon runs (the generation's low 32 bits)
  std::chrono::system_clock::time_point granted{};
  std::deque<lease_waiter> waiters;  // first come, first served
  // Tickets granted from the line whose waiting call has not taken the
  // grant yet, with the generation each got.
  std::map<std::uint64_t, std::uint64_t> granted_tickets;
  bool asked{false};  // an exclusive open came: rmmctl shows the lease from then on
};

/// A descriptor the core owns (closed with its owner); -1: none.
class owned_descriptor {
 public:
  owned_descriptor()                                   = default;
  owned_descriptor(owned_descriptor const&)            = delete;
  owned_descriptor& operator=(owned_descriptor const&) = delete;
  ~owned_descriptor()
  {
    reset(-1);
  }
  [[nodiscard]] int get() const noexcept
  {
    return fd_;
  }
  void reset(int fd) noexcept
  {
    if (fd_ >= 0) { ::close(fd_); }
    fd_ = fd;
  }

 private:
  int fd_{-1};
};

struct buffer_entry {
  buffer_id id{};
  std::string name;
  pool_id pool{};
  std::size_t size{};       // asked for
  std::size_t charge{};     // charged to the pool and the uid (while creating: the estimate)
  shared_allocation block;  // empty while `creating`
  bool creating{true};      // the backend is allocating, without the lock
  buffer_state state{buffer_state::writing};
  bool persistent{false};
  std::optional<gid_t> gid;
  tenant_key tenant;  // the creator's: its memory came from that tenant's backend
  session_id creator{};
  uid_t creator_uid{};
  pid_t creator_pid{};
  bool creator_charged{true};  // the creating session is open and counts the bytes
  // session -> its opens (its create counts one); other nodes' holds are
  // here too, each under remote_holder_key(its id).
  std::map<session_id, std::size_t> holders;
  // Of those, the plain read-write opens (the creator's create counts one),
  // by holder: a write lease is granted only while no other holder has one.
  std::map<session_id, std::size_t> writers;
  buffer_lease lease;
  std::chrono::system_clock::time_point created;
  bool allow_writers{false};
  // A host buffer's own memfd opened again read-only, made for the first
  // session that asks for its fd with read opens alone (buffer_fd): a reader
  // cannot mprotect its PROT_READ mapping of it into a writable one.
  owned_descriptor read_only_fd;
  // Its manifest with the daemon's labels; null: none. Replaced whole, never
  // changed in place, so a grant or a description shares it without a copy.
  std::shared_ptr<buffer_manifest const> manifest;
  // Adopted from the daemon before a restart (buffer_registry::adopt_buffer):
  // frees `block`, which no tenant's backend made. Empty otherwise.
  std::function<void(shared_allocation const&)> release;
};

/// An address-stable allocation's life (stable_registry.hpp): awake (its
/// physical memory exists), going to sleep (its backup taken, the client
/// copying), asleep (its memory given back; its backup, if any, kept),
/// waking (charged, its new memory being made without the core's lock).
enum class stable_state : std::uint8_t { awake, going_to_sleep, asleep, waking };

/// A sleeping allocation's copy in host memory: an allocation of its own in
/// a host pool (a memfd), charged to that pool and to the owner's uid.
struct stable_backup {
  std::uint64_t serial{};  // stable_grant::backup_serial
  pool_id pool{};
  tenant_key tenant;  // whose host backend made it
  shared_allocation memory;
  // Adopted from the daemon before a restart (stable_registry::adopt_backup):
  // frees `memory`, which no tenant's backend made, and its charge is in no
  // tenant's slot. Empty otherwise.
  std::function<void(shared_allocation const&)> release;
};

struct stable_entry {
  stable_id id{};
  session_id session{};  // 0: kept under backup_name after its session ended
  uid_t uid{};
  gid_t gid{};  // its session's primary gid (the tenant an adopted backup is charged to)
  pid_t pid{};
  std::string command;
  tenant_key tenant;  // whose backend makes its memory
  pool_id pool{};
  std::string tag;
  std::size_t size{};   // asked for
  std::size_t bytes{};  // its allocation's (what the pool is charged while awake)
  stable_state state{stable_state::awake};
  stable_memory memory;  // while not asleep
  std::optional<stable_backup> backup;
  std::string backup_name;
  bool kept{false};  // the backup keeper holds its backup (backup_keeper.hpp)
  std::chrono::system_clock::time_point asleep_since;
};

/// Whether `filter` selects `b`: its name prefix, and every label with its
/// value in b's manifest.
inline bool filter_selects(buffer_filter const& filter, buffer_entry const& b)
{
  if (!b.name.starts_with(filter.name_prefix)) { return false; }
  if (filter.labels.empty()) { return true; }
  if (!b.manifest) { return false; }
  auto const& labels = b.manifest->labels;
  return std::all_of(filter.labels.begin(), filter.labels.end(), [&](auto const& want) {
    auto have = labels.find(want.first);
    return have != labels.end() && have->second == want.second;
  });
}

/// A session's report for one pool, held against what it holds there now
/// (it may have given slabs back since it last reported).
struct idle_slabs {
  std::size_t idle{};
  std::size_t reclaimable{};
};

inline idle_slabs idle_of(carved_usage const& c, std::size_t held)
{
  auto const slabs  = std::min(c.slab_bytes, held);
  auto const carved = std::min(c.bytes, slabs);
  auto const idle   = slabs - carved;
  return {.idle = idle, .reclaimable = std::min(c.reclaimable_bytes, idle)};
}

}  // namespace rmmd::core
