// Several client processes share the host pool of one real daemon and read
// each other's data through it; the ledger is checked through rmmctl.

#include "tests/tools/daemon_process.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

struct held_buffer {
  std::string spec;  // OFFSET:BYTES:SEED
};

TEST(MultiClient, ProcessesShareTheHostPoolAndTheLedgerShowsThem)
{
  daemon_process daemon;
  std::vector<std::string> env{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  constexpr int holders            = 4;
  constexpr int buffers_per_holder = 2;
  constexpr std::size_t bytes      = 1 << 20;

  std::vector<std::unique_ptr<child_process>> procs;
  std::vector<std::string> specs;
  for (int h = 0; h < holders; ++h) {
    auto seed = std::to_string(100 * (h + 1));
    procs.push_back(std::make_unique<child_process>(
        std::vector<std::string>{program_path("rmmd_test_client").string(),
                                 "hold",
                                 std::to_string(bytes),
                                 seed,
                                 std::to_string(buffers_per_holder)},
        env));
  }
  for (auto& p : procs) {
    while (true) {
      auto line = p->read_line();
      ASSERT_TRUE(line) << "a holder exited before it was ready";
      if (*line == "ready") { break; }
      std::istringstream in(*line);
      std::string word, offset, size, seed;
      in >> word >> offset >> size >> seed;
      ASSERT_EQ(word, "buffer") << *line;
      specs.push_back(offset + ":" + size + ":" + seed);
    }
  }
  ASSERT_EQ(specs.size(), holders * buffers_per_holder);

  // Two other processes read every holder's data through their own mapping.
  for (int v = 0; v < 2; ++v) {
    std::vector<std::string> argv{program_path("rmmd_test_client").string(), "verify"};
    argv.insert(argv.end(), specs.begin(), specs.end());
    child_process verifier(argv, env);
    verifier.close_stdin();
    EXPECT_EQ(verifier.read_line(), "verified " + std::to_string(specs.size()));
    EXPECT_EQ(verifier.wait(), 0);
  }

  auto stats = daemon.rmmctl_stats();
  ASSERT_GE(stats.pools_size(), 1);
  ASSERT_EQ(stats.pools(0).pool().backend(), v1::BACKEND_HOST);  // the host pool is pool 0
  EXPECT_EQ(stats.pools(0).in_use_bytes(), holders * buffers_per_holder * bytes);
  EXPECT_EQ(stats.pools(0).allocation_count(), holders * buffers_per_holder);
  EXPECT_GE(stats.pools(0).high_water_bytes(), holders * buffers_per_holder * bytes);
  int holder_sessions = 0;
  for (auto const& s : stats.sessions()) {
    if (s.client_name().rfind("holder-", 0) != 0) { continue; }
    ++holder_sessions;
    EXPECT_EQ(s.bytes(), buffers_per_holder * bytes) << s.DebugString();
    EXPECT_EQ(s.allocation_count(), buffers_per_holder);
    EXPECT_EQ(s.uid(), ::getuid());
    EXPECT_EQ(s.command(), "rmmd_test_clien");  // the kernel keeps 15 characters
    bool known_pid = false;
    for (auto& p : procs) { known_pid = known_pid || p->pid() == s.pid(); }
    EXPECT_TRUE(known_pid) << "session pid " << s.pid() << " is none of the holders";
  }
  EXPECT_EQ(holder_sessions, holders);

  // Holders check their data survived the others, free and exit.
  for (auto& p : procs) {
    p->close_stdin();
    EXPECT_EQ(p->read_line(), "freed");
    EXPECT_EQ(p->wait(), 0);
  }
  auto after = daemon.rmmctl_stats();
  EXPECT_EQ(after.pools(0).in_use_bytes(), 0u);
  EXPECT_EQ(after.pools(0).allocation_count(), 0u);
}

}  // namespace
}  // namespace rmmd::test
