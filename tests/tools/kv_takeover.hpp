#pragma once

// The two halves of a KV cache's takeover across rmmd's SIGKILL, in this
// test process (the host and GPU versions of buffers_outlive_daemon_test.cpp
// differ only in the pool and in how the bytes are written and read): an
// engine holds a persistent buffer's write lease when rmmd dies, and a
// standby opens it after the restart.

#include "tests/tools/managed_rmmd.hpp"

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace rmmd::test {

/// A session of `daemon` that does not reconnect (the test says when).
inline rmmd::session kv_session(managed_rmmd const& daemon, char const* client_name)
{
  return rmmd::session(rmmd::session::options{.runtime_dir = daemon.runtime_dir(),
                                              .client_name = client_name,
                                              .reconnect   = std::chrono::milliseconds(0)});
}

/// The engine: creates `name` (persistent, writers allowed, in `options`'
/// pool) and publishes it, waits until the fd store holds it, opens it
/// exclusively for writing, calls `write` on its memory, and SIGKILLs rmmd
/// while it holds the lease; then starts rmmd again. Returns the engine's
/// lease generation (0 where an assertion failed).
inline std::uint64_t engine_writes_kv_and_rmmd_dies(managed_rmmd& daemon,
                                                    std::string const& name,
                                                    std::size_t bytes,
                                                    rmmd::shared_buffer_options options,
                                                    std::function<void(void*)> const& write)
{
  options.persistent    = true;
  options.allow_writers = true;
  auto engine           = kv_session(daemon, "engine");
  rmmd::shared_buffer::create(engine, name, bytes, options).publish();
  EXPECT_TRUE(daemon.wait_for_stored(1, "." + name)) << daemon.log();
  auto kv = rmmd::shared_buffer::open(
      engine, name, {.access = rmmd::buffer_access::read_write, .exclusive = true});
  auto const generation = kv.lease_generation();
  EXPECT_GE(generation, 1u);
  write(kv.data());
  auto killed = daemon.manager().kill_service(SIGKILL);  // the engine holds the lease
  EXPECT_TRUE(killed && WIFSIGNALED(*killed));
  EXPECT_TRUE(daemon.start());
  return generation;
}

/// The standby: its exclusive read-write open of `name` through `standby`,
/// waiting up to 10 s for the grant.
inline rmmd::shared_buffer standby_takes_kv(rmmd::session const& standby, std::string const& name)
{
  return rmmd::shared_buffer::open(standby,
                                   name,
                                   {.wait      = std::chrono::seconds(10),
                                    .access    = rmmd::buffer_access::read_write,
                                    .exclusive = true});
}

}  // namespace rmmd::test
