#pragma once

// Client processes for the tests of buffers that outlive the daemon
// (tests/integration and tests/gpu buffers_outlive_daemon_test.cpp): every
// buffer call from a process of its own (rmmd_share_client, rmmctl), as an
// application that starts after the daemon's restart would make it, so the
// test process itself holds no connection to a daemon that is then killed.

#include "rmmd/v1/rmmd.pb.h"
#include "tests/tools/child_process.hpp"
#include "tests/tools/managed_rmmd.hpp"

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace rmmd::test {

/// rmmd_share_client MODE ARGS... against `daemon`.
inline std::unique_ptr<child_process> share_client(managed_rmmd const& daemon,
                                                   std::vector<std::string> args)
{
  args.insert(args.begin(), program_path("rmmd_share_client").string());
  return std::make_unique<child_process>(
      args, std::vector<std::string>{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()});
}

/// Creates NAME of `bytes` holding `seed`'s pattern and publishes it;
/// `options` as rmmd_share_client produce takes them. Returns the producer
/// once it printed "published" (it holds the buffer until its stdin closes).
inline std::unique_ptr<child_process> start_producer(managed_rmmd const& daemon,
                                                     std::string const& name,
                                                     std::size_t bytes,
                                                     std::uint64_t seed,
                                                     std::vector<std::string> options)
{
  std::vector<std::string> args{"produce", name, std::to_string(bytes), std::to_string(seed)};
  args.insert(args.end(), options.begin(), options.end());
  auto producer = share_client(daemon, args);
  std::string line;
  while (auto l = producer->read_line(60s)) {
    line = *l;
    if (line == "published") { return producer; }
  }
  ADD_FAILURE() << "the producer of " << name << " did not publish; last line: " << line;
  return producer;
}

/// start_producer, then lets it close its hold and exit.
inline void produce(managed_rmmd const& daemon,
                    std::string const& name,
                    std::size_t bytes,
                    std::uint64_t seed,
                    std::vector<std::string> options)
{
  auto producer = start_producer(daemon, name, bytes, seed, std::move(options));
  producer->close_stdin();
  EXPECT_EQ(producer->wait(60s), 0) << producer->read_all(1s);
}

/// Opens NAME in a new process and checks `seed`'s pattern: its
/// "verified ..." line, or what it said instead.
inline std::string consume(managed_rmmd const& daemon,
                           std::string const& name,
                           std::size_t bytes,
                           std::uint64_t seed,
                           std::vector<std::string> options)
{
  std::vector<std::string> args{
      "consume", name, std::to_string(bytes), std::to_string(seed), "--wait-ms", "0"};
  args.insert(args.end(), options.begin(), options.end());
  auto consumer = share_client(daemon, args);
  auto line     = consumer->read_line(60s).value_or("(nothing)");
  consumer->close_stdin();
  auto rest = consumer->read_all(60s);
  consumer->wait(60s);
  return line.starts_with("verified") && rest.find("intact") != std::string::npos
             ? "verified"
             : line + " " + rest;
}

/// rmmctl --runtime-dir DIR ARGS... --json, parsed as T.
template <class T>
T rmmctl_json(managed_rmmd const& daemon, std::vector<std::string> args)
{
  std::vector<std::string> argv{
      program_path("rmmctl").string(), "--runtime-dir", daemon.runtime_dir().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.emplace_back("--json");
  auto r = run(argv);
  EXPECT_EQ(r.status, 0) << r.out;
  T message;
  auto status = google::protobuf::util::JsonStringToMessage(r.out, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << r.out;
  return message;
}

inline v1::Stats stats_of(managed_rmmd const& daemon)
{
  return rmmctl_json<v1::Stats>(daemon, {"stats"});
}

/// The names `rmmctl buffers` lists, in its order.
inline std::vector<std::string> listed(managed_rmmd const& daemon)
{
  std::vector<std::string> names;
  auto const listing = rmmctl_json<v1::ListBuffersResponse>(daemon, {"buffers"});
  for (auto const& b : listing.buffers()) { names.push_back(b.name()); }
  return names;
}

}  // namespace rmmd::test
