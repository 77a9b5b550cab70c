// Consumer half of rmmd's named shared buffers (docs/sharing.md): open a
// buffer that share_producer published, by name, waiting for it if need be;
// check what the producer wrote, on this process's own stream; let it go.
//
//   rmmd_share_consumer [--name NAME] [--wait-seconds S]
//
//   --name NAME        the buffer's name (default examples/share)
//   --wait-seconds S   wait up to S seconds for it to be created and
//                      published (default 30; 0: fail at once if it is not)
//
// Start it before or after the producer: the daemon answers a waiting open
// as soon as the buffer is published. Exit status 0 when every byte is
// what the producer wrote, 1 otherwise.

#include "share_pattern.hpp"

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <rmm/cuda_stream.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, char const* what)
{
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e));
  }
}

}  // namespace

int main(int argc, char** argv)
{
  std::string name = "examples/share";
  double wait_s    = 30;
  for (int i = 1; i < argc; ++i) {
    std::string const arg = argv[i];
    if (arg == "--name" && i + 1 < argc) {
      name = argv[++i];
    } else if (arg == "--wait-seconds" && i + 1 < argc) {
      wait_s = std::strtod(argv[++i], nullptr);
    } else {
      std::fprintf(stderr, "usage: %s [--name NAME] [--wait-seconds S]\n", argv[0]);
      return 2;
    }
  }
  try {
    rmmd::session session(rmmd::session::options{.client_name = "share-consumer"});

    // 1. Open by name. With a wait, the daemon holds the call until the
    //    buffer is published (or the wait ends: then rmmd::not_found_error,
    //    or rmmd::logic_error if it exists but is not published yet). From
    //    here this session is a holder: the memory stays until it closes,
    //    whatever the producer does.
    auto const t0 = std::chrono::steady_clock::now();
    auto buffer   = rmmd::shared_buffer::open(
        session, name, std::chrono::milliseconds(static_cast<long long>(wait_s * 1000)));
    auto const opened_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    auto const& pool = buffer.pool();
    std::printf("share_consumer: opened '%s' after %.3f ms: %zu bytes in pool '%s' (%s)\n",
                buffer.name().c_str(),
                opened_ms,
                buffer.size(),
                pool.name.c_str(),
                buffer.is_host() ? "host memory" : "device memory");

    // 2. Read it. buffer.data() is this process's address of the producer's
    //    bytes: no copy was made to open it. "Read-only" is a contract:
    //    CUDA cannot map an imported range read-only, so do not write.
    auto const words = buffer.size() / sizeof(std::uint32_t);
    std::size_t mismatch;
    if (buffer.is_host()) {
      // Host pools: plain shared memory, mapped once per session.
      mismatch = share_example::first_mismatch(buffer.span<std::uint32_t const>());
      buffer.close();  // nothing of the GPU's to wait for
    } else {
      // Device memory: use it on this process's own stream, here a copy to
      // the host to check it (a kernel would read it the same way).
      rmm::cuda_stream stream(rmm::cuda_stream::flags::non_blocking);
      std::vector<std::uint32_t> copy(words);
      check(cudaMemcpyAsync(copy.data(),
                            buffer.data(),
                            words * sizeof(std::uint32_t),
                            cudaMemcpyDeviceToHost,
                            stream.value()),
            "cudaMemcpyAsync");
      stream.synchronize();
      mismatch = share_example::first_mismatch(copy);
      // 3. Close in stream order: this process's mapping goes after the work
      //    queued on `stream`, and the daemon hears of it once the stream
      //    has got there. close() returns without waiting for the GPU.
      buffer.close(stream);
    }

    if (mismatch != words) {
      std::printf("share_consumer: FAILED: word %zu of '%s' is not what the producer wrote\n",
                  mismatch,
                  name.c_str());
      return 1;
    }
    std::printf("share_consumer: verified %zu bytes: ok\n", words * sizeof(std::uint32_t));
  } catch (rmmd::not_found_error const& e) {
    std::fprintf(stderr, "share_consumer: %s\n(is share_producer running?)\n", e.what());
    return 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "share_consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
