#pragma once

// Test support: the real rmmd (harness/daemon_process.hpp: a runtime
// directory of its own, ready once it has sent READY=1 over sd_notify), with
// its stderr inherited, and what tests ask of it: sessions and stats.

#include "harness/daemon_process.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/tools/child_process.hpp"

#include <rmmd/session.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rmmd::test {

class daemon_process : public harness::daemon_process {
 public:
  /// Starts rmmd with `extra_args` (after --runtime-dir), as `user` if given
  /// (see harness::daemon_process::options::user and test_users.hpp); throws
  /// if it is not ready within 30 s.
  explicit daemon_process(std::vector<std::string> extra_args = {}, std::string user = {});
  daemon_process(daemon_process const&)            = delete;
  daemon_process& operator=(daemon_process const&) = delete;
  ~daemon_process();

  [[nodiscard]] rmmd::session open_session(
      std::string client_name          = "test",
      rmmd::call_transport lease_calls = rmmd::call_transport::session_socket) const;

  /// Closes the observer session, SIGTERM, then its exit status (nullopt if
  /// it did not stop in 30 s).
  std::optional<int> stop();

  /// `rmmctl stats --json` against this daemon, parsed back with protobuf's
  /// JSON mapping. Fails the test if rmmctl fails.
  [[nodiscard]] v1::Stats rmmctl_stats() const;
  /// The same through the gRPC API of a session of the test's own.
  [[nodiscard]] v1::Stats stats() const;
  /// stats() without what changes by itself: each session's start time and
  /// the driver's view of each GPU (it counts every process there, and other
  /// suites run beside this one on the GPU host). What a refusal must leave
  /// unchanged, byte for byte.
  [[nodiscard]] std::string ledger() const;

 private:
  mutable std::unique_ptr<rmmd::session> observer_;
};

/// The backend every daemon of this test program starts with when its
/// arguments name neither a backend nor a config file. The suites written
/// for the host backend set "host" (tests/integration/host_backend.cpp):
/// on a GPU host, "auto" gave each of their daemons CUDA pools on every GPU
/// and a fabric probe per GPU, which made a 50 ms test take 14 s there and
/// slowed the GPU suites running beside them. The GPU suites set none.
void set_default_backend(std::string backend);
/// `args` with `--backend B` in front where set_default_backend applies.
[[nodiscard]] std::vector<std::string> with_default_backend(std::vector<std::string> args);

/// Bytes in use in pool `id`.
std::uint64_t in_use(v1::Stats const& stats, std::uint32_t pool_id = 0);

}  // namespace rmmd::test
