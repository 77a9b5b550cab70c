#pragma once

// The core's side of buffers that outlive the daemon (docs/operations.md,
// "Restart and upgrade"): whoever keeps a published buffer's memory across a
// restart of rmmd (daemon/restart/buffer_keeper.hpp: systemd's fd store and
// the state file) learns from the core when a buffer with a shareable fd of
// its own is published, and when it is deleted or freed; and at start the
// core takes back, as adopted buffers, what the last daemon kept. The core
// knows nothing of systemd or files.

#include "daemon/core/pool_backend.hpp"
#include "daemon/core/types.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::core {

/// A published buffer with memory of its own, as a keeper records it.
struct kept_buffer {
  buffer_info info{};                                 ///< name, pool, size, owner, access, ...
  std::shared_ptr<buffer_manifest const> manifest{};  ///< null: none
  int fd{-1};              ///< its shareable fd, owned by the backend: the keeper takes a dup
  bool host_memfd{false};  ///< `fd` is a host buffer's memfd
  std::vector<std::byte> fabric_handle{};  ///< its fabric handle's bytes, or empty (none)
  std::size_t allocation_bytes{};          ///< the allocation's bytes (>= info.size)
  std::string gpu_uuid{};                  ///< its pool's GPU; empty for host pools
};

/// Told of buffers to keep and to let go. Both calls come under the core's
/// lock, from any thread: they must return at once (take a dup, queue, wake
/// a thread) and never call the core.
class buffer_keeper {
 public:
  buffer_keeper()                                = default;
  buffer_keeper(buffer_keeper const&)            = delete;
  buffer_keeper& operator=(buffer_keeper const&) = delete;
  virtual ~buffer_keeper()                       = default;

  /// `buffer` was published.
  virtual void keep(kept_buffer const& buffer) noexcept = 0;
  /// Buffer `id` was deleted or freed: it is not to be served after a
  /// restart. Ids the keeper does not keep are ignored.
  virtual void forget(buffer_id id) noexcept = 0;
  /// Returns once what keep() and forget() were told before this call is
  /// kept for good (a crash from then on finds it), or at `deadline`
  /// (false). Called without the core's lock: publish answers only after it,
  /// so that a publish the client heard of survives a SIGKILL right after.
  virtual bool wait_until_kept(std::chrono::steady_clock::time_point /*deadline*/) noexcept
  {
    return true;
  }
};

/// A buffer the last daemon kept, for buffer_registry::adopt_buffer.
struct adopted_buffer_spec {
  std::string name{};
  pool_id pool{};
  std::size_t size{};
  bool persistent{false};
  std::optional<gid_t> gid{};
  bool allow_writers{false};
  uid_t creator_uid{};
  pid_t creator_pid{};
  std::chrono::system_clock::time_point created{};
  std::shared_ptr<buffer_manifest const> manifest{};  ///< as stored (the daemon's labels included)
  /// Its memory: block.bytes the allocation's bytes, fd its shareable fd
  /// (the core's to close through `release`).
  shared_allocation memory{};
  /// Frees `memory` (closes the fd, releases the driver's handle); called
  /// once, under the core's lock, when the buffer goes.
  std::function<void(shared_allocation const&)> release{};
};

}  // namespace rmmd::core
