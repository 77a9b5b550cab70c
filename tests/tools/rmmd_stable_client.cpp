// The client processes of the sleep/wake GPU tests
// (tests/gpu/stable_memory_test.cpp), started with posix_spawn against
// $RMMD_RUNTIME_DIR, on GPU 0.
//
//   rmmd_stable_client sleep NAME BYTES SEED
//       allocates BYTES of address-stable memory tagged "weights", writes
//       SEED's pattern (tests/tools/pattern.hpp), sleeps with a host backup
//       named NAME, prints "asleep" and waits for its stdin to close (the
//       test SIGKILLs it there), then exits 0.
//   rmmd_stable_client restore NAME BYTES SEED
//       restores the backups kept under NAME, checks that there is one
//       allocation of BYTES tagged "weights" holding SEED's pattern, frees
//       it: "intact" and exit 0, "mismatch ..." and exit 1, "error: MESSAGE"
//       and exit 3.
//   rmmd_stable_client sleep-across-restart NAME BYTES SEED
//       with a session that reconnects: allocates BYTES tagged "weights"
//       (SEED's pattern) and 64 MiB tagged "kv" (SEED+1's), sleeps
//       "weights" with a host backup named NAME, prints "asleep" and reads
//       a line from stdin (the test restarts rmmd meanwhile). Then: a wake of
//       the old daemon's allocation must be refused (rmmd::precondition_error),
//       restore(NAME) must bring one allocation of BYTES holding SEED's
//       pattern, and "kv", still mapped from the old daemon, SEED+1's; frees
//       everything: "intact" and exit 0, else "mismatch ..." and exit 1.
//   rmmd_stable_client lease BYTES
//       leases BYTES of the CUDA pool (ipc_memory_resource, direct mode),
//       writes to it, prints "served" and holds it until its stdin closes,
//       then frees it and exits 0 ("error: MESSAGE" and exit 3 on a refusal).
//   rmmd_stable_client stable BYTES
//       allocates BYTES of address-stable memory tagged "taken", writes to
//       it and reads it back ("mismatch ..." and exit 1), prints "served"
//       and holds it until its stdin closes, then frees it and exits 0
//       ("error: MESSAGE" and exit 3 on a refusal).

#include "tests/tools/device_pattern.hpp"

#include <rmmd/error.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/session.hpp>
#include <rmmd/stable_memory_resource.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

namespace {

using namespace std::chrono_literals;

void wait_for_stdin_to_close()
{
  std::string line;
  while (std::getline(std::cin, line)) {}
}

int sleep_engine(std::string const& name, std::size_t bytes, std::uint64_t seed)
{
  rmmd::session s(rmmd::session::options{.client_name = "stable-sleeper", .reconnect = 0ms});
  rmmd::stable_memory_resource mr(s, 0, "weights");
  void* p = mr.allocate_sync(bytes, 256);
  rmmd::test::device_fill(p, bytes, seed, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) { throw std::runtime_error("fill failed"); }
  mr.sleep({}, rmmd::sleep_backup::host, name);
  std::cout << "asleep" << std::endl;
  wait_for_stdin_to_close();
  return 0;
}

int restore_engine(std::string const& name, std::size_t bytes, std::uint64_t seed)
{
  rmmd::session s(rmmd::session::options{.client_name = "stable-restorer", .reconnect = 0ms});
  rmmd::stable_memory_resource mr(s, 0, "weights");
  auto restored = mr.restore(name, 10s);
  if (restored.size() != 1 || restored[0].size != bytes || restored[0].tag != "weights") {
    std::cout << "mismatch: " << restored.size() << " allocations restored" << std::endl;
    return 1;
  }
  auto const word = rmmd::test::device_first_mismatch(restored[0].ptr, bytes, seed, nullptr);
  mr.deallocate_sync(restored[0].ptr, bytes, 256);
  if (word >= 0) {
    std::cout << "mismatch at word " << word << std::endl;
    return 1;
  }
  std::cout << "intact" << std::endl;
  return 0;
}

int sleep_across_restart(std::string const& name, std::size_t bytes, std::uint64_t seed)
{
  constexpr std::size_t kv_bytes = std::size_t{64} << 20;
  rmmd::session s(rmmd::session::options{.client_name = "stable-survivor", .reconnect = 60s});
  rmmd::stable_memory_resource mr(s, 0, "weights");
  void* weights = mr.allocate_sync(bytes, 256);
  void* kv      = mr.allocate_tagged("kv", kv_bytes);
  rmmd::test::device_fill(weights, bytes, seed, nullptr);
  rmmd::test::device_fill(kv, kv_bytes, seed + 1, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) { throw std::runtime_error("fill failed"); }
  mr.sleep({"weights"}, rmmd::sleep_backup::host, name);
  std::cout << "asleep" << std::endl;
  std::string line;
  std::getline(std::cin, line);
  try {
    mr.wake({"weights"});
    std::cout << "mismatch: the new daemon woke the old daemon's allocation" << std::endl;
    return 1;
  } catch (rmmd::precondition_error const&) {  // NOLINT(bugprone-empty-catch): as it must
  }
  auto restored = mr.restore(name, 10s);
  if (restored.size() != 1 || restored[0].size != bytes || restored[0].tag != "weights") {
    std::cout << "mismatch: " << restored.size() << " allocations restored" << std::endl;
    return 1;
  }
  auto const restored_word =
      rmmd::test::device_first_mismatch(restored[0].ptr, bytes, seed, nullptr);
  auto const kv_word = rmmd::test::device_first_mismatch(kv, kv_bytes, seed + 1, nullptr);
  mr.deallocate_sync(restored[0].ptr, bytes, 256);
  mr.deallocate_sync(kv, kv_bytes, 256);
  mr.deallocate_sync(weights, bytes, 256);
  if (restored_word >= 0 || kv_word >= 0) {
    std::cout << "mismatch at word " << restored_word << " of the restored backup, " << kv_word
              << " of kv" << std::endl;
    return 1;
  }
  std::cout << "intact" << std::endl;
  return 0;
}

int lease(std::size_t bytes)
{
  rmmd::session s(rmmd::session::options{.client_name = "stable-lender", .reconnect = 0ms});
  rmmd::ipc_resource_options options;
  options.mode = rmmd::allocation_mode::direct;
  rmmd::ipc_memory_resource mr(s, 0, options);
  void* p = mr.allocate_sync(bytes, 256);
  rmmd::test::device_fill(p, bytes, 7, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) { throw std::runtime_error("fill failed"); }
  std::cout << "served" << std::endl;
  wait_for_stdin_to_close();
  mr.deallocate_sync(p, bytes, 256);
  return 0;
}

int stable(std::size_t bytes)
{
  rmmd::session s(rmmd::session::options{.client_name = "stable-taker", .reconnect = 0ms});
  rmmd::stable_memory_resource mr(s, 0, "taken");
  void* p = mr.allocate_sync(bytes, 256);
  rmmd::test::device_fill(p, bytes, 7, nullptr);
  if (cudaDeviceSynchronize() != cudaSuccess) { throw std::runtime_error("fill failed"); }
  if (auto at = rmmd::test::device_first_mismatch(p, bytes, 7, nullptr); at >= 0) {
    std::cout << "mismatch at word " << at << std::endl;
    return 1;
  }
  std::cout << "served" << std::endl;
  wait_for_stdin_to_close();
  mr.deallocate_sync(p, bytes, 256);
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  try {
    std::string const command = argc > 1 ? argv[1] : "";
    if (command == "sleep" && argc == 5) {
      return sleep_engine(argv[2], std::stoull(argv[3]), std::stoull(argv[4]));
    }
    if (command == "restore" && argc == 5) {
      return restore_engine(argv[2], std::stoull(argv[3]), std::stoull(argv[4]));
    }
    if (command == "sleep-across-restart" && argc == 5) {
      return sleep_across_restart(argv[2], std::stoull(argv[3]), std::stoull(argv[4]));
    }
    if (command == "lease" && argc == 3) { return lease(std::stoull(argv[2])); }
    if (command == "stable" && argc == 3) { return stable(std::stoull(argv[2])); }
    std::cerr << "usage: rmmd_stable_client sleep|restore|sleep-across-restart NAME BYTES SEED | "
                 "lease BYTES | stable BYTES\n";
    return 2;
  } catch (std::exception const& e) {
    std::cout << "error: " << e.what() << std::endl;
    return 3;
  }
}
