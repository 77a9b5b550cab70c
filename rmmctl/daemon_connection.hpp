#pragma once

// How rmmctl reaches the daemon, and how each way of failing becomes one of
// its exit codes (docs/operations.md).

#include "rmmd/v1/rmmd.grpc.pb.h"

#include <rmmd/session.hpp>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace rmmd::ctl {

enum exit_code : int {
  ok          = 0,
  failed      = 1,  ///< the daemon answered with an error, or something unexpected failed
  usage       = 2,  ///< bad command line
  not_running = 3,  ///< no daemon at the runtime directory, or it is shutting down
  denied      = 4,  ///< this user may not do this
};

/// Ends rmmctl: its message goes to stderr, and `code` is the exit status.
class ctl_error : public std::runtime_error {
 public:
  ctl_error(exit_code code, std::string const& message) : std::runtime_error(message), code_(code)
  {
  }
  [[nodiscard]] exit_code code() const noexcept
  {
    return code_;
  }

 private:
  exit_code code_;
};

/// The exit code for a failed call's status, and a ctl_error saying `what`
/// failed and why.
ctl_error call_failed(grpc::Status const& status, std::string_view what);

/// The daemon at one runtime directory. Opens a session only for the
/// commands that need one (everything but health).
class daemon_connection {
 public:
  explicit daemon_connection(std::filesystem::path runtime_dir,
                             std::chrono::milliseconds timeout = std::chrono::seconds(10));

  /// A session of rmmctl's own, opened on first use. Throws ctl_error.
  rmmd::session& session();

  /// Health, without a session. Throws ctl_error.
  v1::HealthResponse health();

 private:
  std::filesystem::path dir_;
  std::chrono::milliseconds timeout_;
  std::optional<rmmd::session> session_;
  std::unique_ptr<v1::Rmmd::Stub> health_stub_;
};

}  // namespace rmmd::ctl
