// Producer half of rmmd's named shared buffers (docs/sharing.md): make a
// buffer, write it on a CUDA stream, publish it, and keep it while consumer
// processes (share_consumer) open it by name and read it without a copy.
//
//   rmmd_share_producer [--name NAME] [--bytes N] [--host] [--persistent]
//                       [--gid GID] [--seconds S]
//
//   --name NAME    the buffer's name (default examples/share)
//   --bytes N      its size, a multiple of 4 (default 64 MiB)
//   --host         in the daemon's host pool instead of this GPU's pool
//                  (works without a GPU)
//   --persistent   the buffer outlives this process, until
//                  `rmmctl buffers delete NAME` or the daemon stops
//   --gid GID      members of this group may open it too (default: only
//                  this uid, and root)
//   --seconds S    keep it for S seconds; default: until stdin closes
//
// It also ends at SIGINT or SIGTERM. The daemon is found as every client
// finds it: $RMMD_RUNTIME_DIR, else /run/rmmd.

#include "share_pattern.hpp"

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <rmm/cuda_stream.hpp>

#include <cuda_runtime_api.h>

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct arguments {
  std::string name{"examples/share"};
  std::size_t bytes{std::size_t{64} << 20};
  bool host{false};
  bool persistent{false};
  std::optional<gid_t> gid;
  double seconds{0};  // 0: until stdin closes
};

bool parse(int argc, char** argv, arguments& a)
{
  for (int i = 1; i < argc; ++i) {
    std::string const arg = argv[i];
    bool const has_value  = i + 1 < argc;
    if (arg == "--host") {
      a.host = true;
    } else if (arg == "--persistent") {
      a.persistent = true;
    } else if (arg == "--name" && has_value) {
      a.name = argv[++i];
    } else if (arg == "--bytes" && has_value) {
      a.bytes = std::strtoull(argv[++i], nullptr, 0);
    } else if (arg == "--gid" && has_value) {
      a.gid = static_cast<gid_t>(std::strtoul(argv[++i], nullptr, 0));
    } else if (arg == "--seconds" && has_value) {
      a.seconds = std::strtod(argv[++i], nullptr);
    } else {
      return false;
    }
  }
  return a.bytes > 0 && a.bytes % sizeof(std::uint32_t) == 0 && a.seconds >= 0;
}

void check(cudaError_t e, char const* what)
{
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e));
  }
}

volatile sig_atomic_t stop_requested = 0;
extern "C" void request_stop(int)
{
  stop_requested = 1;
}

/// Returns when stdin closes (or `seconds` pass, if > 0), or at SIGINT or
/// SIGTERM. The signals are blocked except inside ppoll, so none is missed.
void hold(double seconds)
{
  struct sigaction sa {};
  sa.sa_handler = request_stop;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigset_t blocked, during_wait;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  sigprocmask(SIG_BLOCK, &blocked, &during_wait);
  sigdelset(&during_wait, SIGINT);
  sigdelset(&during_wait, SIGTERM);

  auto const deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  pollfd in{STDIN_FILENO, POLLIN, 0};
  while (stop_requested == 0) {
    timespec left{};
    if (seconds > 0) {
      auto const ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
      if (ns <= 0) { return; }
      left = {static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    }
    // With --seconds, stdin is not watched (it may be /dev/null).
    int const rc = ppoll(&in, seconds > 0 ? 0 : 1, seconds > 0 ? &left : nullptr, &during_wait);
    if (rc < 0 && errno != EINTR) { return; }
    if (rc > 0) {
      char discard[256];
      if (read(STDIN_FILENO, discard, sizeof(discard)) <= 0) { return; }  // EOF: stdin closed
    }
  }
}

}  // namespace

int main(int argc, char** argv)
{
  arguments args;
  if (!parse(argc, argv, args)) {
    std::fprintf(stderr,
                 "usage: %s [--name NAME] [--bytes N (a multiple of 4)] [--host] [--persistent] "
                 "[--gid GID] [--seconds S]\n",
                 argv[0]);
    return 2;
  }
  try {
    rmmd::session session(rmmd::session::options{.client_name = "share-producer"});

    // 1. Create: the buffer is this process's alone until it is published.
    //    It lives in a pool of the daemon, so it outlives this process if
    //    a consumer still holds it (or if it is persistent).
    rmmd::shared_buffer_options options{.persistent = args.persistent, .gid = args.gid};
    if (args.host) {
      options.pool = session.host_pool().name;  // shared memory (a memfd)
    } else {
      int gpus = 0;
      if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
        std::fprintf(stderr, "share_producer: no GPU here; use --host for the host pool\n");
        return 2;
      }
      // options.pool stays empty: the pool of the current device (cudaSetDevice).
    }
    // The stream the buffer is written on (device pools); declared before the
    // buffer, it outlives it: the buffer's close uses it.
    std::optional<rmm::cuda_stream> stream;
    auto buffer = rmmd::shared_buffer::create(session, args.name, args.bytes, options);

    // 2. Write, then 3. publish.
    std::vector<std::uint32_t> pattern(args.bytes / sizeof(std::uint32_t));
    share_example::fill(pattern);
    if (buffer.is_host()) {
      // Host memory: the CPU writes it, and the writes are done when
      // publish() is called.
      std::memcpy(buffer.data(), pattern.data(), args.bytes);
      buffer.publish();
    } else {
      // Device memory: queue the writes on a stream (a copy here; a kernel
      // would do the same), and publish on that stream. publish(stream)
      // returns at once: a CUDA host function tells the daemon once the
      // stream has passed the copy, so no consumer can open the buffer
      // before every byte is written.
      stream.emplace(rmm::cuda_stream::flags::non_blocking);
      check(cudaMemcpyAsync(
                buffer.data(), pattern.data(), args.bytes, cudaMemcpyHostToDevice, stream->value()),
            "cudaMemcpyAsync");
      buffer.publish(*stream);
      stream->synchronize();  // only so that the line below tells the truth
    }
    std::printf("share_producer: published '%s': %zu bytes in pool '%s'%s%s\n",
                buffer.name().c_str(),
                buffer.size(),
                buffer.pool().name.c_str(),
                args.persistent ? ", persistent" : "",
                args.seconds > 0 ? "" : "; holding it until stdin closes");
    std::fflush(stdout);

    // 4. Hold it: while this process (or any consumer) holds the buffer, it
    //    stays. Consumers that opened it keep it after this process exits.
    hold(args.seconds);

    // 5. Let go. The destructor would do the same: close on the buffer's
    //    stream (the one given to publish). A persistent buffer stays.
    buffer.close();
    std::printf("share_producer: closed '%s'%s\n",
                args.name.c_str(),
                args.persistent ? " (it stays: rmmctl buffers delete NAME removes it)" : "");
  } catch (std::exception const& e) {
    // rmmd::already_exists_error, for one, when the name is taken.
    std::fprintf(stderr, "share_producer: %s\n", e.what());
    return 1;
  }
  return 0;
}
