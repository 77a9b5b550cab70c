#pragma once

// How rmmctl reaches the daemon, and how each way of failing becomes one of
// its exit codes (docs/operations.md).

#include "rmmd/v1/rmmd.pb.h"

#include <rmmd/admin.hpp>
#include <rmmd/session.hpp>

#include <chrono>
#include <filesystem>
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

/// The ctl_error for the exception in flight, thrown by a request through
/// the client library (error.hpp): its exit code (permission_error: denied;
/// session_error: not running; anything else: failed) and its message after
/// `what` (empty: the message alone). REQUIRES: called inside a catch block.
ctl_error call_failed(std::string_view what);

/// What `call` (a request through the client library) returns; what it
/// throws becomes call_failed(what).
template <typename Call>
auto ask(std::string_view what, Call&& call) -> decltype(call())
{
  try {
    return call();
  } catch (...) {
    throw call_failed(what);
  }
}

/// The daemon at one runtime directory. Opens a session only for the
/// commands that need one (everything but health).
class daemon_connection {
 public:
  explicit daemon_connection(std::filesystem::path runtime_dir,
                             std::chrono::milliseconds timeout = std::chrono::seconds(10));

  /// A session of rmmctl's own, opened on first use. Throws ctl_error.
  rmmd::session& session();
  /// The daemon's admin calls, through session().
  rmmd::admin admin();

  /// Health, without a session. Throws ctl_error.
  v1::HealthResponse health();

 private:
  std::filesystem::path dir_;
  std::chrono::milliseconds timeout_;
  std::optional<rmmd::session> session_;
};

}  // namespace rmmd::ctl
