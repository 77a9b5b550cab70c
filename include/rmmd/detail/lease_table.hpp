#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace rmmd::detail {

/// Which daemon allocation each pointer a resource handed out belongs to.
/// Thread-safe.
class lease_table {
 public:
  void add(void* ptr, std::uint64_t allocation_id)
  {
    std::lock_guard lock(mutex_);
    ids_.emplace(ptr, allocation_id);
  }

  /// Removes `ptr` and returns its allocation id; nullopt (and a line on
  /// stderr) if this table never had it.
  std::optional<std::uint64_t> take(void* ptr) noexcept;

  /// take() for a pointer that may be in another table: nullopt, silently,
  /// if this one does not have it.
  std::optional<std::uint64_t> take_if_held(void* ptr) noexcept
  {
    std::lock_guard lock(mutex_);
    auto it = ids_.find(ptr);
    if (it == ids_.end()) { return std::nullopt; }
    auto id = it->second;
    ids_.erase(it);
    return id;
  }

  /// Removes and returns every entry.
  std::vector<std::pair<void*, std::uint64_t>> take_all() noexcept
  {
    std::lock_guard lock(mutex_);
    std::vector<std::pair<void*, std::uint64_t>> all(ids_.begin(), ids_.end());
    ids_.clear();
    return all;
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, std::uint64_t> ids_;
};

}  // namespace rmmd::detail
