// Where a sleep's handoff goes (docs/benchmarks.md, "Sleep and wake against
// torch_memory_saver": 151 ms from pause's return to another process's
// 60 GiB allocation served, through rmmd): the driver's steps of it without
// rmmd. This process stands for the daemon, which makes every allocation
// (cuMemCreate, posix fd) and exports it; children exec'd from it stand
// for the engine and the taker, importing by fd. Each step is timed:
//
//   a. create N x 1 GiB and export each (a wake's daemon side);
//   b. the engine child imports and maps them all at addresses it reserved,
//      writes them, then unmaps and releases its imports (a sleep's client
//      side); this process then releases its handles (the daemon's release,
//      which frees the memory);
//   c. at once: create one N GiB allocation and export it (the taker's
//      allocation, the daemon side), then a taker child imports, reserves,
//      maps and sets access (the taker's side);
//   d. for comparison, in this process alone: create N x 1 GiB, map, write,
//      unmap and release, create N x 1 GiB again (torch_memory_saver's pause
//      and resume, in one process).
//
//   nvcc -O2 -o vmm_handoff bench/experiments/vmm_handoff.cu -lcuda && ./vmm_handoff 60
//   ./vmm_handoff 60 full    # the GPU filled first but for N + 1 GiB (as in the sleep bench)
//
// Prints one line per step: its name and milliseconds.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

extern char** environ;

#define CK(x)                                           \
  do {                                                  \
    auto e = (x);                                       \
    if (e != CUDA_SUCCESS) {                            \
      char const* s;                                    \
      cuGetErrorName(e, &s);                            \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, s); \
      std::exit(1);                                     \
    }                                                   \
  } while (0)

using clk            = std::chrono::steady_clock;
constexpr size_t GiB = size_t{1} << 30;

static double ms_since(clk::time_point a)
{
  return std::chrono::duration<double, std::milli>(clk::now() - a).count();
}

static CUmemAllocationProp device_prop()
{
  CUmemAllocationProp prop{};
  prop.type                 = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type        = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id          = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

static void map_rw(CUdeviceptr at, size_t bytes, CUmemGenericAllocationHandle h)
{
  CK(cuMemMap(at, bytes, 0, h, 0));
  CUmemAccessDesc access{};
  access.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
  access.flags    = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CK(cuMemSetAccess(at, bytes, &access, 1));
}

// Child: import `fds` (each `each` bytes) and map them in one reserved
// range; "engine" also writes, unmaps and releases them.
static int child(char const* role, size_t each, std::vector<int> const& fds)
{
  cudaSetDevice(0);
  cudaFree(0);
  auto const total = each * fds.size();
  CUdeviceptr base{};
  CK(cuMemAddressReserve(&base, total, 0, 0, 0));
  auto t = clk::now();
  std::vector<CUmemGenericAllocationHandle> handles(fds.size());
  for (size_t i = 0; i < fds.size(); ++i) {
    CK(cuMemImportFromShareableHandle(&handles[i],
                                      reinterpret_cast<void*>(static_cast<intptr_t>(fds[i])),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    map_rw(base + i * each, each, handles[i]);
  }
  std::printf("%s: import, map and set access of %zu x %zu MiB: %.1f ms\n",
              role,
              fds.size(),
              each >> 20,
              ms_since(t));
  if (std::string(role) == "engine") {
    CK(cuMemsetD8(base, 7, total));
    CK(cuCtxSynchronize());
    t = clk::now();
    for (size_t i = 0; i < fds.size(); ++i) {
      CK(cuMemUnmap(base + i * each, each));
      CK(cuMemRelease(handles[i]));
    }
    std::printf("engine: unmap and release its imports: %.1f ms\n", ms_since(t));
  }
  std::fflush(stdout);
  return 0;
}

static void run_child(char const* argv0, char const* role, size_t each, std::vector<int> const& fds)
{
  std::vector<std::string> args{argv0, role, std::to_string(each)};
  for (int fd : fds) {
    ::fcntl(fd, F_SETFD, 0);
    args.push_back(std::to_string(fd));
  }
  std::vector<char*> argv;
  for (auto& a : args) { argv.push_back(a.data()); }
  argv.push_back(nullptr);
  pid_t pid{};
  if (posix_spawn(&pid, argv0, nullptr, nullptr, argv.data(), environ) != 0) { std::exit(4); }
  int status = 0;
  ::waitpid(pid, &status, 0);
  for (int fd : fds) { ::close(fd); }
}

// Creates `count` allocations of `each` bytes and exports each; fills
// `handles` and `fds`.
static void create_export(size_t count,
                          size_t each,
                          std::vector<CUmemGenericAllocationHandle>& handles,
                          std::vector<int>& fds)
{
  auto const prop = device_prop();
  handles.assign(count, 0);
  fds.assign(count, -1);
  for (size_t i = 0; i < count; ++i) {
    CK(cuMemCreate(&handles[i], each, &prop, 0));
    CK(cuMemExportToShareableHandle(
        &fds[i], handles[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  }
}

int main(int argc, char** argv)
{
  if (argc >= 3 && (std::string(argv[1]) == "engine" || std::string(argv[1]) == "taker")) {
    std::vector<int> fds;
    for (int i = 3; i < argc; ++i) { fds.push_back(std::atoi(argv[i])); }
    return child(argv[1], std::stoull(argv[2]), fds);
  }
  size_t const n = argc > 1 ? std::stoull(argv[1]) : 60;
  cudaSetDevice(0);
  cudaFree(0);
  void* ballast = nullptr;
  if (argc > 2 && std::string(argv[2]) == "full") {
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    size_t const keep = (n + 1) * GiB;
    if (free > keep && cudaMalloc(&ballast, free - keep) == cudaSuccess) {
      std::printf("ballast: %zu MiB, %zu MiB left free\n", (free - keep) >> 20, keep >> 20);
    }
  }
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<int> fds;

  auto t = clk::now();
  create_export(n, GiB, handles, fds);
  std::printf("a. create and export %zu x 1 GiB: %.1f ms\n", n, ms_since(t));
  run_child(argv[0], "engine", GiB, fds);
  t = clk::now();
  for (auto h : handles) { CK(cuMemRelease(h)); }
  std::printf(
      "b. release this process's %zu handles (the memory freed): %.1f ms\n", n, ms_since(t));

  t = clk::now();
  create_export(1, n * GiB, handles, fds);
  std::printf("c. create and export one %zu GiB allocation: %.1f ms\n", n, ms_since(t));
  run_child(argv[0], "taker", n * GiB, fds);
  CK(cuMemRelease(handles[0]));

  // d: one process, no export.
  auto const prop = device_prop();
  CUdeviceptr base{};
  CK(cuMemAddressReserve(&base, n * GiB, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> own(n);
  t = clk::now();
  for (size_t i = 0; i < n; ++i) {
    CK(cuMemCreate(&own[i], GiB, &prop, 0));
    map_rw(base + i * GiB, GiB, own[i]);
  }
  std::printf("d. one process: create and map %zu x 1 GiB: %.1f ms\n", n, ms_since(t));
  CK(cuMemsetD8(base, 7, n * GiB));
  CK(cuCtxSynchronize());
  t = clk::now();
  for (size_t i = 0; i < n; ++i) {
    CK(cuMemUnmap(base + i * GiB, GiB));
    CK(cuMemRelease(own[i]));
  }
  std::printf("d. one process: unmap and release them: %.1f ms\n", ms_since(t));
  t = clk::now();
  for (size_t i = 0; i < n; ++i) {
    CK(cuMemCreate(&own[i], GiB, &prop, 0));
    map_rw(base + i * GiB, GiB, own[i]);
  }
  std::printf("d. one process: create and map them again: %.1f ms\n", ms_since(t));
  t = clk::now();
  CUmemGenericAllocationHandle one{};
  for (size_t i = 0; i < n; ++i) {
    CK(cuMemUnmap(base + i * GiB, GiB));
    CK(cuMemRelease(own[i]));
  }
  CK(cuMemCreate(&one, n * GiB, &prop, 0));
  std::printf(
      "d. one process: release them and create one %zu GiB at once: %.1f ms\n", n, ms_since(t));
  CK(cuMemRelease(one));
  CK(cuMemAddressFree(base, n * GiB));
  if (ballast != nullptr) { cudaFree(ballast); }
  return 0;
}
