#pragma once

// Test support for the operations tests: the real rmmd with its log on a pipe
// and its sd_notify messages on a socket the test owns, so a test waits for
// what the daemon says (READY=1, a reload, STOPPING=1) instead of guessing.

#include "harness/notify_socket.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/tools/child_process.hpp"

#include <rmmd/session.hpp>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rmmd::test {

class logged_daemon {
 public:
  /// Starts rmmd --runtime-dir DIR `args...` and waits for READY=1; throws
  /// if it exits or is not ready within 30 s.
  explicit logged_daemon(std::vector<std::string> args);
  logged_daemon(logged_daemon const&)            = delete;
  logged_daemon& operator=(logged_daemon const&) = delete;
  ~logged_daemon();

  [[nodiscard]] std::filesystem::path const& runtime_dir() const noexcept
  {
    return dir_;
  }
  [[nodiscard]] child_process& process() noexcept
  {
    return *daemon_;
  }
  [[nodiscard]] rmmd::session open_session(std::string client_name = "test") const;

  /// The next log line holding `text` (lines before it are kept in log());
  /// nullopt if the daemon's output ends or `timeout` passes first.
  std::optional<std::string> wait_log(std::string_view text,
                                      std::chrono::milliseconds timeout = std::chrono::seconds(20));
  /// The next sd_notify message holding `text`; nullopt after `timeout`.
  std::optional<std::string> wait_notify(
      std::string_view text, std::chrono::milliseconds timeout = std::chrono::seconds(20));
  /// Every log line read so far.
  [[nodiscard]] std::string const& log() const noexcept
  {
    return log_;
  }

 private:
  std::filesystem::path dir_;
  std::unique_ptr<harness::notify_socket> notify_;
  std::unique_ptr<child_process> daemon_;
  std::string log_;
};

/// The daemon's stats through `s`'s own gRPC channel.
v1::Stats stats_of(rmmd::session const& s);

/// A scratch directory removed at the end of the scope.
class scratch_dir {
 public:
  scratch_dir();
  scratch_dir(scratch_dir const&)            = delete;
  scratch_dir& operator=(scratch_dir const&) = delete;
  ~scratch_dir();
  [[nodiscard]] std::filesystem::path const& path() const noexcept
  {
    return path_;
  }
  /// Writes `text` to `name` in the directory (replacing it) and returns its path.
  std::filesystem::path write(std::string const& name, std::string const& text) const;

 private:
  std::filesystem::path path_;
};

}  // namespace rmmd::test
