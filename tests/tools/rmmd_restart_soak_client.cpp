// The client processes of the restart soak (tests/gpu/restart_soak_test.cpp),
// started with posix_spawn against $RMMD_RUNTIME_DIR.
//
//   rmmd_restart_soak_client publish NAME BYTES SEED POOL
//       creates the persistent buffer NAME of BYTES in POOL, writes SEED's
//       pattern (tests/tools/pattern.hpp) with a kernel, publishes it on its
//       stream, prints "published ID" and exits 0 once the daemon has it.
//   rmmd_restart_soak_client check NAME BYTES SEED
//       opens NAME (read-only, no wait) in a session of its own and checks
//       every word on the GPU: "intact BYTES METHOD" and exit 0, "mismatch at
//       WORD" and exit 1, or "error: MESSAGE" and exit 3.
//   rmmd_restart_soak_client loop MODE [NAME BYTES SEED]
//       runs until its stdin closes, in a session that reconnects (60 s),
//       one iteration after another; each allocates, writes a pattern,
//       checks it and frees, through MODE's resource:
//         direct  ipc_memory_resource, direct mode, 256 KiB to 8 MiB
//         packed  ipc_memory_resource, direct mode, 16 allocations of 4 to
//                 64 KiB at once (carved from the daemon's packed blocks)
//         slab    ipc_memory_resource, slab mode (8 MiB slabs), 8 allocations
//                 of 4 KiB to 4 MiB at once; every 8th iteration trims, so
//                 the next leases a slab again
//         host    host_memory_resource on the first host pool, 4 KiB to 1 MiB,
//                 written and checked by the CPU
//         buffer  holds NAME (BYTES, SEED's pattern) open for the whole run and
//                 checks every word of it each iteration, after a call that
//                 lists it (so the session meets each new daemon)
//       Prints "ready" once its resource works. For each line "report" on
//       stdin it prints "progress ITERATIONS RECONNECTS ERRORS"; every error
//       is printed as "error ITERATION: MESSAGE" when it happens (an
//       exception, a pattern that did not hold, a reconnect that did not
//       hold the buffer again). At the end of stdin it finishes its
//       iteration, frees what it holds, prints "done ITERATIONS RECONNECTS
//       ERRORS" and exits 0 if there was no error, else 1.
//   rmmd_restart_soak_client memory
//       prints "memory USED TOTAL": the bytes of GPU 0 in use, as
//       cudaMemGetInfo says in this fresh process, and its size.

#include "tests/tools/device_pattern.hpp"
#include "tests/tools/pattern.hpp"

#include <rmmd/host_memory_resource.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <vector>

namespace {

using namespace std::chrono_literals;
using rmmd::test::device_fill;
using rmmd::test::device_first_mismatch;

constexpr std::size_t KiB = std::size_t{1} << 10;
constexpr std::size_t MiB = std::size_t{1} << 20;

/// Prints one line whole, from any thread.
void say(char const* format, auto... args)
{
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::printf(format, args...);
  std::fflush(stdout);
}

cudaStream_t new_stream()
{
  cudaStream_t stream{};
  if (auto err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); err != cudaSuccess) {
    throw std::runtime_error(std::string("cudaStreamCreate: ") + cudaGetErrorName(err));
  }
  return stream;
}

int publish(std::string const& name, std::size_t bytes, std::uint64_t seed, std::string const& pool)
{
  rmmd::session s(rmmd::session::options{.client_name = "soak-publisher", .reconnect = 0ms});
  auto buffer = rmmd::shared_buffer::create(
      s, name, bytes, rmmd::shared_buffer_options{.pool = pool, .persistent = true});
  auto const stream = new_stream();
  device_fill(buffer.data(), bytes, seed, stream);
  // Checked before it is published: what the soak compares against is right.
  if (auto at = device_first_mismatch(buffer.data(), bytes, seed, stream); at >= 0) {
    say("mismatch at %ld\n", at);
    return 1;
  }
  buffer.publish(cuda::stream_ref{stream});
  buffer.close(cuda::stream_ref{stream});
  // The publication is sent by a host function when the stream reaches it:
  // wait until the daemon lists it published.
  auto const deadline = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < deadline) {
    for (auto const& b : rmmd::shared_buffer::list(s, {.name_prefix = name})) {
      if (b.name == name && b.published) {
        say("published %llu\n", static_cast<unsigned long long>(b.id));
        return 0;
      }
    }
    std::this_thread::sleep_for(2ms);
  }
  say("error: %s is not listed as published after 60 s\n", name.c_str());
  return 1;
}

int check(std::string const& name, std::size_t bytes, std::uint64_t seed)
{
  rmmd::session s(rmmd::session::options{.client_name = "soak-checker", .reconnect = 0ms});
  auto buffer = rmmd::shared_buffer::open(s, name);
  if (buffer.size() != bytes) {
    say("error: %s holds %zu bytes, not %zu\n", name.c_str(), buffer.size(), bytes);
    return 3;
  }
  auto const stream = new_stream();
  buffer.set_stream(cuda::stream_ref{stream});
  if (auto at = device_first_mismatch(buffer.data(), bytes, seed, stream); at >= 0) {
    say("mismatch at %ld\n", at);
    return 1;
  }
  say("intact %zu %s\n", bytes, rmmd::test::device_pattern_method().c_str());
  return 0;
}

int memory()
{
  std::size_t free = 0, total = 0;
  if (auto err = cudaMemGetInfo(&free, &total); err != cudaSuccess) {
    say("error: cudaMemGetInfo: %s\n", cudaGetErrorName(err));
    return 3;
  }
  say("memory %zu %zu\n", total - free, total);
  return 0;
}

// ---- loop: one iteration of each mode

struct loop_state {
  std::atomic<std::uint64_t> iterations{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<bool> stop{false};

  void error(std::string const& what)
  {
    errors.fetch_add(1);
    say("error %llu: %s\n", static_cast<unsigned long long>(iterations.load()), what.c_str());
  }
};

/// Allocations of `sizes` from `mr` at once, each written with a seed of its
/// own and checked on the GPU, then freed.
void device_round(rmmd::ipc_memory_resource& mr,
                  cudaStream_t stream,
                  std::vector<std::size_t> const& sizes,
                  std::uint64_t seed,
                  loop_state& st)
{
  cuda::stream_ref const ref{stream};
  std::vector<void*> held;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    held.push_back(mr.allocate(ref, sizes[i], 256));
    device_fill(held.back(), sizes[i], seed + i, stream);
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (auto at = device_first_mismatch(held[i], sizes[i], seed + i, stream); at >= 0) {
      st.error("allocation of " + std::to_string(sizes[i]) + " bytes: mismatch at word " +
               std::to_string(at));
    }
  }
  for (std::size_t i = 0; i < sizes.size(); ++i) { mr.deallocate(ref, held[i], sizes[i], 256); }
}

std::vector<std::size_t> random_sizes(std::mt19937_64& rng,
                                      std::size_t count,
                                      std::size_t low,
                                      std::size_t high)
{
  std::uniform_int_distribution<std::size_t> pick(low / 8, high / 8);
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < count; ++i) { sizes.push_back(pick(rng) * 8); }
  return sizes;
}

void run_loop(std::string_view mode,
              rmmd::session const& s,
              std::string const& name,
              std::size_t bytes,
              std::uint64_t seed,
              loop_state& st)
{
  std::mt19937_64 rng(seed);
  auto const stream = mode == "host" ? cudaStream_t{} : new_stream();  // host: no CUDA at all
  std::function<void(std::uint64_t)> iteration;
  std::optional<rmmd::ipc_memory_resource> device_mr;
  std::optional<rmmd::host_memory_resource> host_mr;
  rmmd::shared_buffer held;
  if (mode == "direct" || mode == "packed") {
    device_mr.emplace(s, 0, rmmd::ipc_resource_options{.mode = rmmd::allocation_mode::direct});
    auto const [count, low, high] = mode == "direct"
                                        ? std::tuple{std::size_t{1}, 256 * KiB, 8 * MiB}
                                        : std::tuple{std::size_t{16}, 4 * KiB, 64 * KiB};
    iteration                     = [&, count, low, high](std::uint64_t i) {
      device_round(*device_mr, stream, random_sizes(rng, count, low, high), seed + i * 64, st);
    };
  } else if (mode == "slab") {
    device_mr.emplace(
        s,
        0,
        rmmd::ipc_resource_options{
            .mode = rmmd::allocation_mode::slab, .slab_bytes = 8 * MiB, .idle_trim = 1s});
    iteration = [&](std::uint64_t i) {
      device_round(*device_mr, stream, random_sizes(rng, 8, 4 * KiB, 4 * MiB), seed + i * 64, st);
      if (i % 8 == 7) { device_mr->trim(); }
    };
  } else if (mode == "host") {
    host_mr.emplace(s);
    iteration = [&](std::uint64_t i) {
      auto const size = random_sizes(rng, 1, 4 * KiB, MiB)[0];
      void* p         = host_mr->allocate_sync(size, 256);
      rmmd::test::fill(p, size, seed + i);
      if (auto at = rmmd::test::first_mismatch(p, size, seed + i); at >= 0) {
        st.error("host allocation of " + std::to_string(size) + " bytes: mismatch at word " +
                 std::to_string(at));
      }
      host_mr->deallocate_sync(p, size, 256);
    };
  } else if (mode == "buffer") {
    held = rmmd::shared_buffer::open(s, name);
    held.set_stream(cuda::stream_ref{stream});
    iteration = [&](std::uint64_t) {
      auto const listed = rmmd::shared_buffer::list(s, {.name_prefix = name});
      if (listed.empty() || listed.front().name != name) {
        st.error("the daemon does not list " + name);
      }
      if (auto at = device_first_mismatch(held.data(), bytes, seed, stream); at >= 0) {
        st.error(name + ": mismatch at word " + std::to_string(at));
      }
    };
  } else {
    throw std::invalid_argument("unknown mode " + std::string(mode));
  }
  iteration(0);  // it works before it says so
  st.iterations.store(1);
  say("ready\n");
  while (!st.stop.load()) {
    try {
      iteration(st.iterations.load());
    } catch (std::exception const& e) {
      st.error(e.what());
    }
    st.iterations.fetch_add(1);
    std::this_thread::sleep_for(2ms);  // room for the others on the daemon
  }
  if (device_mr) { device_mr->trim(); }
  held.close();
  if (stream != cudaStream_t{}) {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
}

int loop(std::string_view mode, std::string const& name, std::size_t bytes, std::uint64_t seed)
{
  loop_state st;
  rmmd::session s(rmmd::session::options{
      .client_name  = "soak-" + std::string(mode),
      .reconnect    = 60s,
      .on_reconnect = [&](rmmd::reconnect_info const& info) {
        if (mode == "buffer" && (info.buffers_held_again != 1 || info.buffers_unknown != 0)) {
          st.error("reconnect " + std::to_string(info.reconnects) + " held " +
                   std::to_string(info.buffers_held_again) + " buffer(s) again, " +
                   std::to_string(info.buffers_unknown) + " unknown");
        }
      }});
  std::thread input([&] {
    for (std::string line; std::getline(std::cin, line);) {
      if (line == "report") {
        say("progress %llu %u %llu\n",
            static_cast<unsigned long long>(st.iterations.load()),
            s.reconnects(),
            static_cast<unsigned long long>(st.errors.load()));
      }
    }
    st.stop.store(true);
  });
  try {
    run_loop(mode, s, name, bytes, seed, st);
  } catch (std::exception const& e) {
    st.error(std::string("setting up: ") + e.what());
  }
  input.join();
  say("done %llu %u %llu\n",
      static_cast<unsigned long long>(st.iterations.load()),
      s.reconnects(),
      static_cast<unsigned long long>(st.errors.load()));
  return st.errors.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv)
{
  try {
    std::string_view const what = argc >= 2 ? argv[1] : "";
    if (argc == 6 && what == "publish") {
      return publish(argv[2], std::stoull(argv[3]), std::stoull(argv[4]), argv[5]);
    }
    if (argc == 5 && what == "check") {
      return check(argv[2], std::stoull(argv[3]), std::stoull(argv[4]));
    }
    if (argc == 3 && what == "loop") { return loop(argv[2], {}, 0, 1); }
    if (argc == 6 && what == "loop") {
      return loop(argv[2], argv[3], std::stoull(argv[4]), std::stoull(argv[5]));
    }
    if (argc == 2 && what == "memory") { return memory(); }
  } catch (std::exception const& e) {
    say("error: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr,
               "usage: rmmd_restart_soak_client publish NAME BYTES SEED POOL | check NAME BYTES "
               "SEED | loop direct|packed|slab|host | loop buffer NAME BYTES SEED | memory\n");
  return 2;
}
