#pragma once

// The session's pools and this process's view of each: the descriptions the
// welcome gave (with `device` mapped to this process's CUDA ordinals by GPU
// UUID, once, at first use), the pool fds, fabric handles, and what is made
// from them once per session: host pools' mappings (page-locked for the
// pinnable ones that ask) and CUDA pools' imports.
//
// Owns: the pool fds, the mappings, the CUDA pool imports and the host
// registrations; the destructor releases them (no CUDA call while the
// process exits).
//
// Locks: map_mutex_ guards mappings_, cuda_pools_ and pinned_, and is held
// across a mapping or an import (each made once). The pool list is written
// once (devices_mapped_) and read without a lock after.

#include <rmmd/session.hpp>

#include "client/detail/session_channel.hpp"

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace rmmd::detail {

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

  /// See session::host_pool_base, pinned_host_pool_base, cuda_pool.
  [[nodiscard]] std::byte* host_pool_base(std::uint32_t pool_id);
  [[nodiscard]] std::byte* pinned_host_pool_base(std::uint32_t pool_id);
  [[nodiscard]] cudaMemPool_t cuda_pool(std::uint32_t pool_id);

 private:
  bool const import_by_fabric_;
  std::vector<pool_info> pools_;
  std::once_flag devices_mapped_;
  std::vector<int> pool_fds_;                // by pool id, -1 where the pool has no fd
  std::vector<std::string> fabric_handles_;  // by pool id, empty where none
  std::mutex map_mutex_;
  std::unordered_map<std::uint32_t, std::pair<std::byte*, std::size_t>> mappings_;
  std::unordered_map<std::uint32_t, cudaMemPool_t> cuda_pools_;
  std::unordered_set<std::uint32_t> pinned_;  // host pools registered with CUDA
};

}  // namespace rmmd::detail
