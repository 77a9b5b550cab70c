// Read-only opens of device buffers between real processes: a consumer that
// opened for reading and writes (cudaMemset, then a copy) gets a CUDA error in
// its own process only, while another consumer, a later one and the creator
// still read the original bytes; a read-write consumer of a buffer that
// allows writers writes; the daemon's rmmd.gpu_uuid label reaches a
// consumer's manifest. Imported by posix fd and by fabric handle (the latter
// needs an IMEX channel; without one those cases skip, saying so). On pool
// pointers (--cuda-shared-buffer-memory=pool) a read open is the API's
// contract only: the last case shows that a write goes through there.
// tests/integration/buffer_manifest_test.cpp has the host pool's SIGSEGV.

#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"

#include <rmmd/shared_buffer.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::StartsWith;

constexpr std::size_t bytes = std::size_t{16} << 20;

enum class import_by { posix_fd, fabric };

class ReadOnlyDeviceBuffers : public ::testing::TestWithParam<import_by> {
 protected:
  void SetUp() override
  {
    REQUIRE_GPUS(1);
    start("own");
  }

  void start(char const* memory)
  {
    daemon_   = std::make_unique<daemon_process>(std::vector<std::string>{
          "--cuda-pool-bytes", "4GiB", "--cuda-shared-buffer-memory", memory});
    env_      = {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()};
    auto s    = daemon_->open_session();
    auto pool = s.device_pool(0);
    if (GetParam() == import_by::fabric && !pool.has_fabric_handle) {
      GTEST_SKIP() << "the daemon's pool exports no fabric handle: no IMEX channel "
                      "(/dev/nvidia-caps-imex-channels/channel0) on this host";
    }
  }

  std::unique_ptr<child_process> client(std::vector<std::string> args)
  {
    std::vector<std::string> argv{program_path("rmmd_share_client").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    if (GetParam() == import_by::fabric) { argv.push_back("--fabric"); }
    return std::make_unique<child_process>(argv, env_);
  }

  static void expect_line(child_process& p, std::string const& prefix)
  {
    auto line = p.read_line(60s);
    ASSERT_TRUE(line) << "the client exited before saying " << prefix;
    ASSERT_THAT(*line, StartsWith(prefix));
  }

  /// A producer of SEED's pattern, published, with a manifest.
  std::unique_ptr<child_process> produce(std::string const& name,
                                         std::vector<std::string> more = {})
  {
    std::vector<std::string> args{
        "produce", name, std::to_string(bytes), "5", "--tensors", "4", "--label", "model=pattern"};
    args.insert(args.end(), more.begin(), more.end());
    auto p = client(args);
    expect_line(*p, "created");
    expect_line(*p, "published");
    return p;
  }

  std::unique_ptr<daemon_process> daemon_;
  std::vector<std::string> env_;
};

TEST_P(ReadOnlyDeviceBuffers, AReaderThatWritesGetsACudaErrorAndEveryOtherHolderReadsTheOriginal)
{
  auto producer = produce("ro/w");
  auto reader   = client({"consume", "ro/w", std::to_string(bytes), "5"});
  expect_line(*reader, "verified " + std::to_string(bytes));

  auto writer = client({"write", "ro/w", std::to_string(bytes), "6"});
  auto said   = writer->read_line(60s);
  ASSERT_TRUE(said) << "the writer said nothing";
  EXPECT_THAT(*said, StartsWith("cuda-error "));  // cudaErrorIllegalAddress, or as CUDA names it
  EXPECT_EQ(writer->wait(60s), 3);

  // The other holders: the reader from its import, a new reader, the creator.
  reader->close_stdin();
  EXPECT_EQ(reader->read_line(60s), "intact");
  EXPECT_EQ(reader->wait(60s), 0);
  auto later = client({"consume", "ro/w", std::to_string(bytes), "5"});
  expect_line(*later, "verified");
  later->close_stdin();
  EXPECT_EQ(later->read_line(60s), "intact");
  EXPECT_EQ(later->wait(60s), 0);
  producer->close_stdin();
  EXPECT_EQ(producer->read_line(60s), "intact");
  EXPECT_EQ(producer->wait(60s), 0);
}

TEST_P(ReadOnlyDeviceBuffers, AReadWriteConsumerOfABufferThatAllowsWritersWrites)
{
  auto producer = produce("rw/w", {"--allow-writers"});
  auto writer   = client({"write", "rw/w", std::to_string(bytes), "6", "--writable"});
  expect_line(*writer, "written");
  auto reader = client({"consume", "rw/w", std::to_string(bytes), "6"});
  expect_line(*reader, "verified");
  reader->close_stdin();
  EXPECT_EQ(reader->read_line(60s), "intact");
  EXPECT_EQ(reader->wait(60s), 0);
  writer->close_stdin();
  EXPECT_EQ(writer->read_line(60s), "intact");
  EXPECT_EQ(writer->wait(60s), 0);
  producer->close_stdin();
  EXPECT_EQ(producer->read_line(60s), "corrupted");  // the writer's pattern, not its own
  EXPECT_EQ(producer->wait(60s), 0);
}

TEST_P(ReadOnlyDeviceBuffers, AConsumersManifestCarriesTheGpusUuid)
{
  auto producer = produce("ro/m");
  auto shower   = client({"show", "ro/m"});
  expect_line(*shower, "access read");
  expect_line(*shower, "tensor t0 float32");
  for (int i = 1; i < 4; ++i) { expect_line(*shower, "tensor t" + std::to_string(i)); }
  expect_line(*shower, "label model=pattern");
  expect_line(*shower, "label rmmd.gpu_uuid=GPU-");
  expect_line(*shower, "end");
  shower->close_stdin();
  EXPECT_EQ(shower->wait(60s), 0);
  producer->close_stdin();
  EXPECT_EQ(producer->wait(60s), 0);
}

TEST_P(ReadOnlyDeviceBuffers, OnPoolPointersAReadOpenIsTheContractOnly)
{
  if (GetParam() == import_by::fabric) {
    GTEST_SKIP() << "pool pointers are imported through the pool, whatever the handle";
  }
  start("pool");
  auto producer = produce("pp/w");
  auto writer   = client({"write", "pp/w", std::to_string(bytes), "6"});
  expect_line(*writer, "written");  // no hardware protection on a pool pointer
  writer->close_stdin();
  EXPECT_EQ(writer->read_line(60s), "intact");
  EXPECT_EQ(writer->wait(60s), 0);
  producer->close_stdin();
  EXPECT_EQ(producer->wait(60s), 0);
}

INSTANTIATE_TEST_SUITE_P(Imports,
                         ReadOnlyDeviceBuffers,
                         ::testing::Values(import_by::posix_fd, import_by::fabric),
                         [](auto const& info) {
                           return info.param == import_by::fabric ? "Fabric" : "PosixFd";
                         });

}  // namespace
}  // namespace rmmd::test
