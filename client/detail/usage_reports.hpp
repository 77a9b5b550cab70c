#pragma once

// What the session's slab-mode resources tell the daemon and hear from it:
// their carved usage (ReportUsage; the daemon keeps one figure per session
// and pool, so the session sends the sum over its resources of that pool)
// and the watches that answer the daemon's reclaim requests.
//
// Owns: the last report of each resource, by pool; the reclaim watches.
//
// Locks: carved_mutex_ guards carved_ and is held across a report's gRPC
// call, so reports of one session go out in order. watches_mutex_ guards
// watches_ and is held while a watch runs, so that unwatch() waits for it.
// Neither is taken with the other, nor under the channel's call_mutex_.

#include <rmmd/session.hpp>

#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace rmmd::detail {

class session_channel;

class usage_reports {
 public:
  /// `channel` outlives this object.
  explicit usage_reports(session_channel& channel) noexcept : channel_(channel) {}
  usage_reports(usage_reports const&)            = delete;
  usage_reports& operator=(usage_reports const&) = delete;

  /// ReportUsage: replaces the daemon's figures for those pools. Returns the
  /// pools under pressure. Throws as error.hpp says.
  std::vector<std::uint32_t> send(std::vector<carved_usage> const& usage);
  /// What one slab-mode resource (`reporter`) has carved from a pool now,
  /// counted for the daemon of `generation` (its slabs from other daemons
  /// left out); sends the sum of that pool's reporters whose figures were
  /// counted for the daemon the report reaches (after a reconnect, figures
  /// counted for an earlier daemon are left out). Returns the pools under
  /// pressure.
  std::vector<std::uint32_t> report_carved(void const* reporter,
                                           carved_usage const& usage,
                                           std::uint32_t generation);
  /// `reporter` is gone: the others' sum goes to the daemon (best effort).
  void forget_reporter(void const* reporter, std::uint32_t pool_id) noexcept;

  /// See session::watch_reclaims and unwatch_reclaims.
  std::uint64_t watch(std::uint32_t pool_id, std::function<void(std::uint32_t)> on_request);
  void unwatch(std::uint64_t watch_id) noexcept;
  /// Runs the watches of each pool in `reclaims` (the daemon asked for them).
  void run_watches(std::vector<std::uint32_t> const& reclaims) noexcept;

 private:
  /// ReportUsage with what `build` makes for the daemon of the generation
  /// each try reaches.
  std::vector<std::uint32_t> send_built(
      std::function<std::vector<carved_usage>(std::uint32_t generation)> const& build);
  /// Sends the sum of what the resources of `pool_id` carved. Holds carved_mutex_.
  std::vector<std::uint32_t> send_carved_locked(std::uint32_t pool_id);

  session_channel& channel_;
  std::mutex carved_mutex_;
  struct carved_report {
    carved_usage usage;
    std::uint32_t generation{};  // the daemon it was counted for
  };
  std::unordered_map<std::uint32_t, std::unordered_map<void const*, carved_report>> carved_;
  struct reclaim_watch {
    std::uint32_t pool_id{};
    std::function<void(std::uint32_t)> on_request;
  };
  std::mutex watches_mutex_;
  std::uint64_t next_watch_{1};
  std::unordered_map<std::uint64_t, reclaim_watch> watches_;
};

}  // namespace rmmd::detail
