#pragma once

// rmmd_test_client processes the integration tests start against a daemon's
// runtime directory: a slab client at rest and one that allocates once.

#include "tests/tools/child_process.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {

/// The environment that points a client at the daemon of `runtime_dir`.
inline std::vector<std::string> client_env(std::filesystem::path const& runtime_dir)
{
  return {"RMMD_RUNTIME_DIR=" + runtime_dir.string()};
}

/// A slab client at rest (rmmd_test_client idle-slabs) holding `count` idle
/// slabs of `bytes` in the daemon's host pool, once it says it is ready.
inline std::unique_ptr<child_process> idle_client(std::filesystem::path const& runtime_dir,
                                                  int count,
                                                  std::size_t bytes)
{
  auto c = std::make_unique<child_process>(
      std::vector<std::string>{program_path("rmmd_test_client").string(),
                               "idle-slabs",
                               std::to_string(count),
                               std::to_string(bytes)},
      client_env(runtime_dir));
  EXPECT_EQ(c->read_line().value_or("(nothing)"), "ready");
  return c;
}

/// Another process's allocation of `bytes` from the host pool; its first line
/// says how it went ("allocated MS" or "refused MS MESSAGE").
inline std::unique_ptr<child_process> allocating_client(std::filesystem::path const& runtime_dir,
                                                        std::size_t bytes)
{
  return std::make_unique<child_process>(
      std::vector<std::string>{
          program_path("rmmd_test_client").string(), "allocate", std::to_string(bytes)},
      client_env(runtime_dir));
}

}  // namespace rmmd::test
