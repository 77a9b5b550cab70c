#include "daemon/backends/cuda/spare_memory.hpp"

#include "daemon/backends/cuda/buffer_import.hpp"

#include <algorithm>
#include <iterator>
#include <map>
#include <utility>

namespace rmmd::backends::cuda {

std::shared_ptr<spare_memory> spare_memory::of_device(int device,
                                                      std::chrono::milliseconds keep_for)
{
  if (keep_for <= std::chrono::milliseconds::zero()) { return nullptr; }
  static std::mutex mutex;
  static std::map<int, std::weak_ptr<spare_memory>> made;
  std::lock_guard lock(mutex);
  if (auto existing = made[device].lock()) { return existing; }
  auto fresh   = std::make_shared<spare_memory>(device, keep_for);
  made[device] = fresh;
  return fresh;
}

spare_memory::spare_memory(int device, std::chrono::milliseconds keep_for)
    : device_(device),
      keep_for_(keep_for),
      expirer_([this](std::stop_token stop) { expire(std::move(stop)); })
{
}

spare_memory::~spare_memory()
{
  expirer_.request_stop();
  expirer_.join();
  give_back();
}

void spare_memory::keep(core::shared_allocation memory, uid_t owner)
{
  {
    std::lock_guard lock(mutex_);
    auto const bytes = memory.block.bytes;
    spares_.push_back(
        {.memory = std::move(memory), .owner = owner, .until = clock::now() + keep_for_});
    // Counted before anyone can take it: bytes_ never goes below 0.
    bytes_.fetch_add(bytes, std::memory_order_relaxed);
  }
  changed_.notify_all();
}

std::vector<core::shared_allocation> spare_memory::take(std::size_t bytes,
                                                        uid_t owner,
                                                        std::size_t max_pieces)
{
  std::vector<core::shared_allocation> out;
  std::lock_guard lock(mutex_);
  std::vector<std::size_t> chosen;  // indices into spares_
  for (std::size_t i = 0; i < spares_.size() && chosen.empty(); ++i) {
    if (spares_[i].owner == owner && spares_[i].memory.block.bytes == bytes) {
      chosen.push_back(i);
    }
  }
  if (chosen.empty() && max_pieces > 1) {
    std::vector<std::size_t> mine;
    for (std::size_t i = 0; i < spares_.size(); ++i) {
      if (spares_[i].owner == owner) { mine.push_back(i); }
    }
    std::stable_sort(mine.begin(), mine.end(), [&](std::size_t a, std::size_t b) {
      return spares_[a].memory.block.bytes > spares_[b].memory.block.bytes;
    });
    std::size_t left = bytes;
    for (auto i : mine) {
      auto const size = spares_[i].memory.block.bytes;
      if (size > left) { continue; }
      if (chosen.size() + 1 >= max_pieces && size != left) { continue; }
      chosen.push_back(i);
      left -= size;
      if (left == 0 || chosen.size() == max_pieces) { break; }
    }
  }
  std::size_t taken = 0;
  for (auto i : chosen) {
    taken += spares_[i].memory.block.bytes;
    out.push_back(std::move(spares_[i].memory));
  }
  std::sort(chosen.begin(), chosen.end(), std::greater<>());
  for (auto i : chosen) { spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(i)); }
  bytes_.fetch_sub(taken, std::memory_order_relaxed);
  return out;
}

std::size_t spare_memory::give_back() noexcept
{
  std::vector<spare> all;
  {
    std::lock_guard lock(mutex_);
    all.swap(spares_);
  }
  return release(all);  // after the expiry's batch, if one is under way
}

std::size_t spare_memory::release(std::vector<spare> const& taken) noexcept
{
  std::lock_guard releasing(releasing_);
  std::size_t bytes = 0;
  for (auto const& s : taken) {
    release_own(device_, s.memory);
    bytes += s.memory.block.bytes;
  }
  bytes_.fetch_sub(bytes, std::memory_order_relaxed);
  released_.fetch_add(bytes, std::memory_order_release);
  return bytes;
}

void spare_memory::expire(std::stop_token stop)
{
  std::unique_lock lock(mutex_);
  while (!stop.stop_requested()) {
    if (spares_.empty()) {
      changed_.wait(lock, stop, [&] { return !spares_.empty(); });
      continue;
    }
    auto const first =
        std::min_element(spares_.begin(), spares_.end(), [](auto const& a, auto const& b) {
          return a.until < b.until;
        })->until;
    if (clock::now() < first) {
      // Every keep comes due after those before it, so the first due only
      // moves later (a take): waiting for it is never late.
      changed_.wait_until(lock, stop, first, [] { return false; });
      continue;
    }
    std::vector<spare> due;
    auto const now = clock::now();
    auto kept      = std::partition(
        spares_.begin(), spares_.end(), [&](auto const& s) { return s.until > now; });
    std::move(kept, spares_.end(), std::back_inserter(due));
    spares_.erase(kept, spares_.end());
    lock.unlock();
    release(due);
    lock.lock();
  }
}

}  // namespace rmmd::backends::cuda
