#pragma once

// The real rmmd under harness::service_manager, the stand-in for systemd
// that keeps a service's stored fds across its crash and passes them to the
// next start (LISTEN_FDS / LISTEN_FDNAMES): for tests of buffers that
// outlive the daemon. Its stderr goes to a file (log()), its sockets and
// its state file to a directory of its own.

#include "harness/service_manager.hpp"
#include "tests/tools/child_process.hpp"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace rmmd::test {

class managed_rmmd {
 public:
  /// `args`: rmmd's options besides --runtime-dir and --state-file.
  explicit managed_rmmd(std::vector<std::string> args) : args_(std::move(args))
  {
    char tmpl[] = "/tmp/rmmd-kept-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) { throw std::runtime_error("mkdtemp failed"); }
    dir_     = tmpl;
    manager_ = std::make_unique<harness::service_manager>(
        harness::service_manager_options{.notify_socket = dir_ / "notify"});
  }
  managed_rmmd(managed_rmmd const&)            = delete;
  managed_rmmd& operator=(managed_rmmd const&) = delete;
  ~managed_rmmd()
  {
    manager_.reset();  // SIGKILLs the daemon, closes the store
    if (::testing::Test::HasFailure()) { std::cerr << "rmmd's log:\n" << log(); }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  /// Starts rmmd (with the fds the store holds) and waits for READY=1.
  /// `env`: more NAME=value.
  [[nodiscard]] ::testing::AssertionResult start(std::vector<std::string> env = {})
  {
    auto const log_path = log_file();
    // The shell only redirects stderr and execs rmmd: the pid stays the
    // manager's main pid, so LISTEN_PID and NotifyAccess=main hold.
    std::vector<std::string> argv{"/bin/sh",
                                  "-c",
                                  "exec \"$0\" \"$@\" 2>>'" + log_path.string() + "'",
                                  program_path("rmmd").string(),
                                  "--runtime-dir",
                                  runtime_dir().string(),
                                  "--state-file",
                                  state_file().string()};
    argv.insert(argv.end(), args_.begin(), args_.end());
    manager_->start(argv, std::move(env));
    if (!manager_->wait_for("READY=1", harness::steady::now() + std::chrono::seconds(60))) {
      return ::testing::AssertionFailure() << "rmmd did not say READY=1; its log:\n" << log();
    }
    return ::testing::AssertionSuccess();
  }

  harness::service_manager& manager()
  {
    return *manager_;
  }
  [[nodiscard]] std::filesystem::path runtime_dir() const
  {
    return dir_ / "run";
  }
  [[nodiscard]] std::filesystem::path state_file() const
  {
    return dir_ / "buffers.state";
  }
  [[nodiscard]] std::filesystem::path log_file() const
  {
    return dir_ / "rmmd.log";
  }
  /// Everything the daemons wrote to stderr so far.
  [[nodiscard]] std::string log() const
  {
    std::ifstream in(log_file());
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  /// Stored fd names that are buffers' ("rmmd-buffer-...").
  [[nodiscard]] std::vector<std::string> stored_buffers() const
  {
    return stored_with("rmmd-buffer-");
  }
  /// Stored fd names that are sleep backups' ("rmmd-backup-...").
  [[nodiscard]] std::vector<std::string> stored_backups() const
  {
    return stored_with("rmmd-backup-");
  }
  /// Waits until exactly `n` backup fds are stored.
  bool wait_for_stored_backups(std::size_t n)
  {
    return manager_->wait_for_store(
        [&](std::vector<std::string> const& names) {
          return static_cast<std::size_t>(std::count_if(names.begin(), names.end(), [](auto& name) {
                   return name.starts_with("rmmd-backup-");
                 })) == n;
        },
        harness::steady::now() + std::chrono::seconds(20));
  }
  /// Waits until exactly `n` buffer fds are stored, the last ending in
  /// `suffix` if given.
  bool wait_for_stored(std::size_t n, std::string const& suffix = {})
  {
    return manager_->wait_for_store(
        [&](std::vector<std::string> const& names) {
          std::size_t count = 0;
          bool found        = suffix.empty();
          for (auto const& name : names) {
            if (!name.starts_with("rmmd-buffer-")) { continue; }
            ++count;
            found = found || name.ends_with(suffix);
          }
          return count == n && found;
        },
        harness::steady::now() + std::chrono::seconds(20));
  }

 private:
  [[nodiscard]] std::vector<std::string> stored_with(std::string const& prefix) const
  {
    std::vector<std::string> out;
    for (auto& name : manager_->stored_names()) {
      if (name.starts_with(prefix)) { out.push_back(name); }
    }
    return out;
  }

  std::vector<std::string> args_;
  std::filesystem::path dir_;
  std::unique_ptr<harness::service_manager> manager_;
};

}  // namespace rmmd::test
