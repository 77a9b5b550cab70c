// examples/share_producer.cpp and share_consumer.cpp as a user runs them,
// against the real daemon, on its host pool (--host): any machine. The same
// on device memory is tests/gpu/share_examples_test.cpp.

#include "tests/tools/daemon_process.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

v1::PoolStats host_pool_stats(v1::Stats const& stats)
{
  for (auto const& p : stats.pools()) {
    if (p.pool().backend() == v1::BACKEND_HOST) { return p; }
  }
  ADD_FAILURE() << "the daemon has no host pool";
  return {};
}

std::vector<std::string> producer_argv(std::string const& name, std::vector<std::string> more)
{
  std::vector<std::string> argv{
      program_path("rmmd_share_producer").string(), "--host", "--name", name, "--bytes", "1048576"};
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

/// Runs the consumer to its end: exit status and what it printed (stderr too).
run_result run_consumer(std::string const& name,
                        std::string const& wait_seconds,
                        std::vector<std::string> const& env)
{
  child_process consumer({program_path("rmmd_share_consumer").string(),
                          "--name",
                          name,
                          "--wait-seconds",
                          wait_seconds},
                         env,
                         {.merge_stderr = true});
  consumer.close_stdin();
  auto out    = consumer.read_all(30s);
  auto status = consumer.wait(30s);
  return {.status = status.value_or(-1), .out = std::move(out)};
}

TEST(ShareExamples, AConsumerStartedFirstWaitsForThePublicationAndReadsEveryByte)
{
  daemon_process daemon;
  std::vector<std::string> env{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  auto const before = host_pool_stats(daemon.stats()).in_use_bytes();

  // The consumer first: its open waits for the producer's publication.
  child_process consumer({program_path("rmmd_share_consumer").string(),
                          "--name",
                          "examples/test/waited",
                          "--wait-seconds",
                          "30"},
                         env,
                         {.merge_stderr = true});
  consumer.close_stdin();
  child_process producer(producer_argv("examples/test/waited", {}), env);
  auto published = producer.read_line(30s);
  ASSERT_TRUE(published) << "the producer said nothing";
  EXPECT_THAT(*published, HasSubstr("published 'examples/test/waited': 1048576 bytes"));

  auto const said = consumer.read_all(30s);
  EXPECT_THAT(said, HasSubstr("opened 'examples/test/waited'")) << said;
  EXPECT_THAT(said, HasSubstr("verified 1048576 bytes: ok")) << said;
  EXPECT_EQ(consumer.wait(30s), 0) << said;

  // The producer still holds it; the consumer's hold is gone.
  auto const held = host_pool_stats(daemon.stats());
  EXPECT_EQ(held.shared_buffers(), 1u);
  EXPECT_GE(held.shared_bytes(), 1048576u);
  EXPECT_EQ(held.shared_holders(), 1u);

  producer.close_stdin();
  auto const closed = producer.read_line(30s);
  EXPECT_TRUE(closed && closed->find("closed 'examples/test/waited'") != std::string::npos);
  EXPECT_EQ(producer.wait(30s), 0);
  EXPECT_TRUE(eventually([&] { return host_pool_stats(daemon.stats()).in_use_bytes() == before; }))
      << "the buffer's memory did not go back after its last holder";
  EXPECT_EQ(host_pool_stats(daemon.stats()).shared_buffers(), 0u);
}

TEST(ShareExamples, APersistentBufferOutlivesItsProducerAndOpensWithoutAWait)
{
  daemon_process daemon;
  std::vector<std::string> env{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  {
    child_process producer(producer_argv("examples/test/kept", {"--persistent"}), env);
    auto published = producer.read_line(30s);
    ASSERT_TRUE(published) << "the producer said nothing";
    EXPECT_THAT(*published, HasSubstr("persistent"));
    producer.close_stdin();
    EXPECT_EQ(producer.wait(30s), 0);
  }
  for (int round = 0; round < 2; ++round) {  // and again: a consumer's close keeps it too
    auto r = run_consumer("examples/test/kept", "0", env);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_THAT(r.out, HasSubstr("verified 1048576 bytes: ok"));
  }
  auto const kept = host_pool_stats(daemon.stats());
  EXPECT_EQ(kept.shared_buffers(), 1u);
  EXPECT_EQ(kept.shared_holders(), 0u);
}

TEST(ShareExamples, AConsumerWithoutAProducerSaysSo)
{
  daemon_process daemon;
  std::vector<std::string> env{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  auto r = run_consumer("examples/test/nobody", "0.2", env);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("no buffer had this name by the end of the wait")) << r.out;
}

}  // namespace
}  // namespace rmmd::test
