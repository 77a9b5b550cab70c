#pragma once

#include <rmmd/session.hpp>

#include <cuda_runtime_api.h>
#include <cuda/memory_resource>
#include <cuda/stream>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace rmmd {

/// What a sleep keeps of the memory it releases.
enum class sleep_backup {
  none,  ///< nothing: the contents are gone after the wake (a KV cache)
  host,  ///< a copy in host memory the daemon holds, restored by the wake
};

/// An allocation a restore() brought back, at an address of this process.
struct restored_allocation {
  void* ptr{};
  std::size_t size{};
  std::string tag;
};

/// Sets the tag of the calling thread's stable_memory_resource allocations
/// while it lives (torch_memory_saver's `region(tag)`); nests.
class scoped_stable_tag {
 public:
  explicit scoped_stable_tag(std::string tag);
  scoped_stable_tag(scoped_stable_tag const&)            = delete;
  scoped_stable_tag& operator=(scoped_stable_tag const&) = delete;
  ~scoped_stable_tag();

  /// The calling thread's tag, or empty when no scope sets one.
  [[nodiscard]] static std::string const& current() noexcept;

 private:
  std::string previous_;
};

namespace detail {

/// rmmd::stable_memory_resource's shared state. Its allocations, by address:
/// each a range of virtual addresses this process reserved for the
/// allocation's life, mapped while the allocation is awake.
class stable_memory_resource_impl {
 public:
  stable_memory_resource_impl(session s, pool_info const& pool, std::string default_tag);
  stable_memory_resource_impl(stable_memory_resource_impl const&)            = delete;
  stable_memory_resource_impl& operator=(stable_memory_resource_impl const&) = delete;
  ~stable_memory_resource_impl();

  void* allocate(cuda::stream_ref stream, std::size_t bytes, std::size_t alignment);
  void deallocate(cuda::stream_ref stream,
                  void* ptr,
                  std::size_t bytes,
                  std::size_t alignment) noexcept;
  void* allocate_sync(std::size_t bytes, std::size_t alignment);
  void deallocate_sync(void* ptr, std::size_t bytes, std::size_t alignment) noexcept;
  void* allocate_tagged(std::string const& tag, std::size_t bytes);

  std::size_t sleep(std::vector<std::string> const& tags,
                    sleep_backup backup,
                    std::string const& backup_name,
                    cudaStream_t stream);
  std::size_t wake(std::vector<std::string> const& tags,
                   std::chrono::milliseconds deadline,
                   cudaStream_t stream);
  std::vector<restored_allocation> restore(std::string const& backup_name,
                                           std::chrono::milliseconds deadline,
                                           cudaStream_t stream);
  bool read_backup(void const* ptr, std::size_t bytes, void* out) const;
  void keep_backups(bool keep) noexcept
  {
    std::lock_guard lock(mutex_);
    keep_backups_ = keep;
  }
  [[nodiscard]] bool keeps_backups() const noexcept
  {
    std::lock_guard lock(mutex_);
    return keep_backups_;
  }
  [[nodiscard]] std::string tag_of(void const* ptr) const;
  [[nodiscard]] bool is_awake(void const* ptr) const;

  [[nodiscard]] session const& get_session() const noexcept
  {
    return session_;
  }
  [[nodiscard]] pool_info const& pool() const noexcept
  {
    return pool_;
  }
  [[nodiscard]] std::string const& default_tag() const noexcept
  {
    return default_tag_;
  }

  bool operator==(stable_memory_resource_impl const& other) const noexcept
  {
    return this == &other;
  }

  /// One allocation: its id (the daemon's, with the generation of the daemon
  /// that made it: client/detail/session_ids.hpp), its reserved range, its
  /// mapping.
  struct entry {
    std::uint64_t id{};
    std::uintptr_t address{};
    std::size_t bytes{};  ///< reserved and mapped (the allocation's bytes)
    std::size_t size{};   ///< asked for
    std::string tag;
    /// The imported CUmemGenericAllocationHandles while mapped, one per
    /// piece, mapped one after another from `address`.
    std::vector<std::uint64_t> handles{};
    /// The pieces' bytes while mapped (one: `bytes`).
    std::vector<std::size_t> pieces{};
    bool mapped{false};
    /// Asleep with a host backup under a name: the resource's destructor
    /// leaves it to the daemon, which keeps it under that name once the
    /// session ends (an engine restarted on purpose restores it).
    bool kept{false};
    /// Its host backup mapped here (page-locked where the driver allows),
    /// kept from sleep to sleep where the resource keeps backups; null: none.
    void* backup_data{};
    std::uint64_t backup_serial{};  ///< which of the daemon's backups it maps
    bool backup_pinned{false};
  };

 private:
  /// Wakes `ids` (this resource's), maps them at their reserved addresses,
  /// restores their backups, finishes; all or none. REQUIRES: mutex_ held.
  std::size_t wake_locked(std::vector<std::uint64_t> const& ids,
                          std::chrono::milliseconds deadline,
                          cudaStream_t stream);
  /// Unmaps (if mapped), frees its addresses, and tells the daemon.
  void free_entry(entry& e) noexcept;

  session session_;
  pool_info pool_;
  std::string default_tag_;
  mutable std::mutex mutex_;  // guards entries_; held across a sleep or a wake
  std::map<std::uintptr_t, entry> entries_;
  bool keep_backups_{true};  // guarded by mutex_
};

}  // namespace detail
}  // namespace rmmd
