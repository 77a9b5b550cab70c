// examples/share_producer.cpp and share_consumer.cpp as a user runs them,
// against the real daemon, on its host pool (--host): any machine. The same
// on device memory is tests/gpu/share_examples_test.cpp.

#include "tests/tools/daemon_process.hpp"

#include <rmmd/shared_buffer.hpp>

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

/// Runs rmmd_manifest_reader with `args` to its end (stderr too).
run_result run_reader(std::vector<std::string> args, std::vector<std::string> const& env)
{
  std::vector<std::string> argv{program_path("rmmd_manifest_reader").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  child_process reader(argv, env, {.merge_stderr = true});
  reader.close_stdin();
  auto out    = reader.read_all(30s);
  auto status = reader.wait(30s);
  return {.status = status.value_or(-1), .out = std::move(out)};
}

TEST(ShareExamples, TheManifestReaderListsByLabelAndPrintsATensorTable)
{
  daemon_process daemon;
  std::vector<std::string> env{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  auto s    = daemon.open_session();
  auto pool = host_pool_stats(daemon.stats()).pool().name();
  auto made = shared_buffer::create(s, "examples/gpt", 1 << 20, {.pool = pool});
  made.set_manifest({.tensors = {{.name    = "wte",
                                  .type    = dtype::float16,
                                  .shape   = {256, 512},
                                  .aliases = {"lm_head.weight"}},
                                 {.name        = "h.0.attn.T",
                                  .type        = dtype::float32,
                                  .shape       = {64, 32},
                                  .byte_offset = 262144,
                                  .strides     = {1, 64}}},
                     .labels  = {{"model", "gpt2"}, {"revision", "abc"}}});
  made.publish();
  auto other = shared_buffer::create(s, "examples/other", 4096, {.pool = pool});
  other.publish();

  auto listed = run_reader({"--label", "model=gpt2"}, env);
  EXPECT_EQ(listed.status, 0) << listed.out;
  EXPECT_THAT(listed.out, HasSubstr("examples/gpt"));
  EXPECT_THAT(listed.out, HasSubstr("2 tensors"));
  EXPECT_THAT(listed.out, HasSubstr("revision = abc"));
  EXPECT_THAT(listed.out, ::testing::Not(HasSubstr("examples/other")));

  auto shown = run_reader(
      {"--prefix", "examples/", "--open", "examples/gpt", "--expect", "revision=abc"}, env);
  EXPECT_EQ(shown.status, 0) << shown.out;
  EXPECT_THAT(shown.out, HasSubstr("examples/other"));
  EXPECT_THAT(shown.out, HasSubstr("opened read-only"));
  EXPECT_THAT(shown.out, HasSubstr("(256, 512)"));
  EXPECT_THAT(shown.out, HasSubstr("also lm_head.weight"));
  EXPECT_THAT(shown.out, HasSubstr("strided"));

  auto guarded = run_reader({"--open", "examples/gpt", "--expect", "revision=def"}, env);
  EXPECT_EQ(guarded.status, 1);
  EXPECT_THAT(guarded.out, HasSubstr("label 'revision' is 'abc', expected 'def'"));
}

}  // namespace
}  // namespace rmmd::test
