#pragma once

// The session's pools and this process's view of each: the descriptions the
// welcome gave (with `device` mapped to this process's CUDA ordinals by GPU
// UUID, once, at first use), the pool fds, fabric handles, and what is made
// from them once per session: host pools' mappings (page-locked for the
// pinnable ones that ask) and CUDA pools' imports.
//
// After a reconnect (session_channel) the new daemon's pools are another
// generation's: pool ids stay those of the first welcome (matched by name and
// GPU), and each generation has its fds, mappings and imports, made once at
// first use. Those of earlier generations stay until the session ends: the
// memory the session still holds from an earlier daemon lives in them.
//
// Owns: the pool fds, the mappings, the CUDA pool imports and the host
// registrations of every generation; the destructor releases them (no CUDA
// call while the process exits).
//
// Locks: map_mutex_ guards generations_, mappings_, cuda_pools_ and pinned_,
// and is held across a mapping or an import (each made once); it may be
// taken under the channel's call_mutex_ (adopt()), never the other way. The
// first welcome's pool list is written once (devices_mapped_) and read
// without a lock after.

#include <rmmd/session.hpp>

#include "client/detail/session_channel.hpp"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace rmmd::detail {

/// Why host pool `pool_name` cannot be page-locked, in the words both of its
/// refusals start with (the pool's, and a buffer's in it): the caller adds
/// what else to do.
[[nodiscard]] std::string not_pinnable(std::string const& pool_name);

/// Page-locks host memory in the current context, portable and mapped (a
/// whole pool's mapping, or a buffer's), read-only for the GPU where
/// `read_only` (the driver would take write access to a read-only
/// mapping's pages otherwise, and fail); cudaSuccess or why not (cleared).
[[nodiscard]] cudaError_t register_host(void* data, std::size_t bytes, bool read_only) noexcept;

class pool_mappings {
 public:
  /// Takes the pool fds of `welcome`. `import_by_fabric`: CUDA pools are
  /// imported by their fabric handle instead of the fd.
  pool_mappings(session_welcome&& welcome, bool import_by_fabric);
  pool_mappings(pool_mappings const&)            = delete;
  pool_mappings& operator=(pool_mappings const&) = delete;
  /// Destroys the CUDA imports and the host registrations (not while the
  /// process exits), unmaps, closes the fds.
  ~pool_mappings();

  /// The pools, `device` mapped to this process's CUDA ordinals by GPU UUID
  /// (a session that uses no CUDA pool never initialises CUDA).
  [[nodiscard]] std::vector<pool_info> const& pools() noexcept;
  /// The pools as the welcome described them (device: the daemon's ordinal).
  [[nodiscard]] std::vector<pool_info> const& unmapped() const noexcept
  {
    return pools_;
  }

  /// A reconnected session's new daemon, as generation `generation`: takes
  /// its welcome's pool fds. `daemon_pool`: by pool id (ours), the new
  /// daemon's id of that pool, -1 where it serves none such.
  void adopt(std::uint32_t generation,
             session_welcome&& welcome,
             std::vector<std::int64_t> const& daemon_pool);
  /// The generation of the daemon adopted last.
  [[nodiscard]] std::uint32_t latest() const noexcept
  {
    return latest_.load(std::memory_order_acquire);
  }
  /// Pool `pool_id` (ours) as the daemon of `generation` described it, with
  /// our id and this process's device; nullopt where it serves none such.
  [[nodiscard]] std::optional<pool_info> described(std::uint32_t pool_id, std::uint32_t generation);

  /// See session::host_pool_base, pinned_host_pool_base, cuda_pool: the
  /// latest daemon's, or that of `generation`.
  [[nodiscard]] std::byte* host_pool_base(std::uint32_t pool_id)
  {
    return host_pool_base(pool_id, latest());
  }
  [[nodiscard]] std::byte* pinned_host_pool_base(std::uint32_t pool_id)
  {
    return pinned_host_pool_base(pool_id, latest());
  }
  [[nodiscard]] cudaMemPool_t cuda_pool(std::uint32_t pool_id)
  {
    return cuda_pool(pool_id, latest());
  }
  [[nodiscard]] std::byte* host_pool_base(std::uint32_t pool_id, std::uint32_t generation);
  [[nodiscard]] std::byte* pinned_host_pool_base(std::uint32_t pool_id, std::uint32_t generation);
  [[nodiscard]] cudaMemPool_t cuda_pool(std::uint32_t pool_id, std::uint32_t generation);

 private:
  /// One daemon's pools, by our pool id.
  struct generation_pools {
    std::vector<std::optional<pool_info>> pools;  // nullopt: not served by this daemon
    std::vector<int> fds;                         // -1 where the pool has no fd
    std::vector<std::string> fabric_handles;      // empty where none
  };
  /// Generation `generation`'s pool `pool_id`; throws rmmd::logic_error
  /// when that daemon serves none such. Holds map_mutex_.
  std::pair<generation_pools const*, pool_info> pool_locked(std::uint32_t pool_id,
                                                            std::uint32_t generation);
  [[nodiscard]] static std::uint64_t key(std::uint32_t pool_id, std::uint32_t generation) noexcept
  {
    return (std::uint64_t{generation} << 32) | pool_id;
  }

  bool const import_by_fabric_;
  std::vector<pool_info> pools_;  // the first welcome's
  std::once_flag devices_mapped_;
  std::atomic<std::uint32_t> latest_{0};
  std::mutex map_mutex_;
  std::unordered_map<std::uint32_t, generation_pools> generations_;
  // By key(pool id, generation).
  std::unordered_map<std::uint64_t, std::pair<std::byte*, std::size_t>> mappings_;
  std::unordered_map<std::uint64_t, cudaMemPool_t> cuda_pools_;
  std::unordered_set<std::uint64_t> pinned_;  // host pools registered with CUDA
};

}  // namespace rmmd::detail
