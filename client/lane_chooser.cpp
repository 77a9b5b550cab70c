#include "client/lane_chooser.hpp"

namespace rmmd::detail {
namespace {

constexpr std::uint64_t key_mask = (std::uint64_t{1} << 56) - 1;

std::size_t slot_of(std::uint64_t key, std::size_t slots) noexcept
{
  // Thread keys are aligned addresses a few pages apart: mix them.
  return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 58) % slots;
}

/// The lane of a thread the full table has no slot for.
std::size_t hashed_lane(std::uint64_t key, std::size_t lanes) noexcept
{
  return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 32) % lanes;
}

}  // namespace

std::size_t lane_chooser::pick_slow(std::uintptr_t me) noexcept
{
  auto solo = solo_.load(std::memory_order_acquire);
  if (solo == nobody) {
    // The first thread: it carves alone, in lane 0, until another comes.
    if (solo_.compare_exchange_strong(solo, me, std::memory_order_acq_rel)) { return 0; }
    // Another thread was first: `solo` is now what it wrote.
  }
  if (solo == me) { return 0; }
  if (lanes_ == 1) { return 0; }
  if (solo != many) { spread(solo); }
  return lane_of(me, true);
}

void lane_chooser::spread(std::uintptr_t solo) noexcept
{
  std::lock_guard lock(spread_mutex_);
  if (solo_.load(std::memory_order_relaxed) == many) { return; }
  // The thread that carved alone keeps lane 0, so its pointers and its
  // next allocations stay where they were; it finds itself in the table
  // once it sees `many`.
  auto const key = std::uint64_t{solo} & key_mask;
  threads_[slot_of(key, slots)].store(key << 8, std::memory_order_relaxed);
  next_lane_.store(1, std::memory_order_relaxed);
  solo_.store(many, std::memory_order_release);
}

std::size_t lane_chooser::find(std::uintptr_t thread) const noexcept
{
  auto const key = std::uint64_t{thread} & key_mask;
  auto const h   = slot_of(key, slots);
  for (std::size_t probe = 0; probe < slots; ++probe) {
    auto const word = threads_[(h + probe) % slots].load(std::memory_order_acquire);
    if (word == 0) { return 0; }
    if (word >> 8 == key) { return static_cast<std::size_t>(word & 0xff); }
  }
  return hashed_lane(key, lanes_);  // a full table
}

std::size_t lane_chooser::lane_of(std::uintptr_t thread, bool assign) noexcept
{
  auto const key = std::uint64_t{thread} & key_mask;
  auto const h   = slot_of(key, slots);
  for (std::size_t probe = 0; probe < slots; ++probe) {
    auto& slot = threads_[(h + probe) % slots];
    auto word  = slot.load(std::memory_order_acquire);
    if (word == 0) {
      if (!assign) { return 0; }
      auto const lane = next_lane_.fetch_add(1, std::memory_order_relaxed) % lanes_;
      if (slot.compare_exchange_strong(word, key << 8 | lane, std::memory_order_acq_rel)) {
        return lane;
      }
      // Another thread took the slot meanwhile: `word` is what it wrote.
    }
    if (word >> 8 == key) { return static_cast<std::size_t>(word & 0xff); }
  }
  // 64 threads seen: the rest share lanes by hash.
  return hashed_lane(key, lanes_);
}

std::size_t lane_chooser::hint() const noexcept
{
  auto const me = this_thread();
  if (solo_.load(std::memory_order_relaxed) != many) { return 0; }
  return find(me);
}

std::size_t lane_chooser::threads_seen() const noexcept
{
  if (solo_.load(std::memory_order_acquire) != many) {
    return solo_.load(std::memory_order_relaxed) == nobody ? 0 : 1;
  }
  std::size_t n = 0;
  for (auto const& slot : threads_) { n += slot.load(std::memory_order_relaxed) != 0 ? 1 : 0; }
  return n;
}

}  // namespace rmmd::detail
