#pragma once

// Test support: the real rmmd, started as a separate process in a runtime
// directory of its own, ready once it has sent READY=1 over sd_notify (a
// NOTIFY_SOCKET the test owns, as systemd would).

#include "rmmd/v1/rmmd.pb.h"
#include "tests/tools/child_process.hpp"

#include <rmmd/session.hpp>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {

class daemon_process {
 public:
  /// Starts rmmd with `extra_args` (after --runtime-dir); throws if it is not
  /// ready within the deadline.
  explicit daemon_process(std::vector<std::string> extra_args = {});
  daemon_process(daemon_process const&)            = delete;
  daemon_process& operator=(daemon_process const&) = delete;
  ~daemon_process();

  [[nodiscard]] std::filesystem::path const& runtime_dir() const noexcept
  {
    return dir_;
  }
  [[nodiscard]] rmmd::session open_session(std::string client_name = "test") const;

  /// SIGTERM, then its exit status (nullopt if it did not stop in time).
  std::optional<int> stop();
  [[nodiscard]] child_process& process() noexcept
  {
    return *daemon_;
  }

  /// `rmmctl stats --json` against this daemon, parsed back with protobuf's
  /// JSON mapping. Fails the test if rmmctl fails.
  [[nodiscard]] v1::Stats rmmctl_stats() const;
  /// The same through the gRPC API of a session of the test's own.
  [[nodiscard]] v1::Stats stats() const;

 private:
  std::filesystem::path dir_;
  std::unique_ptr<child_process> daemon_;
  mutable std::unique_ptr<rmmd::session> observer_;
};

/// Bytes in use in pool `id`.
std::uint64_t in_use(v1::Stats const& stats, std::uint32_t pool_id = 0);

}  // namespace rmmd::test
