#pragma once

// A real core with one 1 MiB host pool and one open session of this
// process's credentials: the fixture of the tests that drive the wire layer
// and the session protocol without a socket.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

namespace rmmd::test {

class host_core_fixture : public ::testing::Test {
 protected:
  /// `client_name`: how the session names itself (stats show it).
  explicit host_core_fixture(std::string client_name) : client_name_(std::move(client_name)) {}

  void SetUp() override
  {
    core_ = std::make_unique<core::daemon_core>(
        core::core_options{.access = {.uids = {::getuid()}, .gids = {}}, .quotas = {}});
    core_->pools().add_pool({.name = "host", .handle_types = {core::handle_type::host_offset}},
                            std::make_unique<backends::host::host_backend>("host", 1 << 20));
    auto grant = core_->sessions().open_session(
        {.pid = ::getpid(), .uid = ::getuid(), .gid = ::getgid(), .supplementary_gids = {}},
        "test",
        client_name_);
    ASSERT_TRUE(grant.ok()) << grant.status();
    session_ = grant->id;
  }

  void TearDown() override
  {
    if (core_) { core_->close_session(session_); }
  }

  std::unique_ptr<core::daemon_core> core_;
  core::session_id session_{};

 private:
  std::string client_name_;
};

}  // namespace rmmd::test
