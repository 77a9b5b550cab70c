// examples/share_producer.cpp and share_consumer.cpp on device memory: the
// producer writes its buffer with an asynchronous copy right before
// publish(stream), and consumers started before it read every byte on their
// own streams. The host-pool runs are tests/examples/share_examples_test.cpp.

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

TEST(ShareExamplesGpu, ConsumersStartedFirstReadWhatTheProducerCopiedBeforePublishing)
{
  REQUIRE_GPUS(1);
  daemon_process daemon({"--cuda-pool-bytes", "1GiB"});
  std::vector<std::string> env{"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()};
  std::vector<std::unique_ptr<child_process>> consumers;
  for (int i = 0; i < 3; ++i) {
    consumers.push_back(std::make_unique<child_process>(
        std::vector<std::string>{program_path("rmmd_share_consumer").string(),
                                 "--name",
                                 "examples/test/gpu",
                                 "--wait-seconds",
                                 "60"},
        env,
        spawn_options{.merge_stderr = true}));
    consumers.back()->close_stdin();
  }
  child_process producer(
      {program_path("rmmd_share_producer").string(), "--name", "examples/test/gpu"}, env);
  auto published = producer.read_line(60s);
  ASSERT_TRUE(published) << "the producer said nothing";
  EXPECT_THAT(*published, HasSubstr("published 'examples/test/gpu': 67108864 bytes"));
  for (auto& c : consumers) {
    auto const said = c->read_all(60s);
    EXPECT_THAT(said, HasSubstr("(device memory)")) << said;
    EXPECT_THAT(said, HasSubstr("verified 67108864 bytes: ok")) << said;
    EXPECT_EQ(c->wait(30s), 0) << said;
  }
  producer.close_stdin();
  EXPECT_EQ(producer.wait(30s), 0);
  EXPECT_TRUE(eventually([&] {
    auto const stats = daemon.stats();
    for (auto const& p : stats.pools()) {
      if (p.shared_buffers() != 0) { return false; }
    }
    return true;
  })) << "the buffer was not freed after its last holder";
}

}  // namespace
}  // namespace rmmd::test
