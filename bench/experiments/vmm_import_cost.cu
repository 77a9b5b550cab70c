// Import cost of one VMM allocation (cuMemCreate, posix fd) by size, mapped
// read-write and read-only in turn.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
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
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b)
{
  return std::chrono::duration<double, std::micro>(b - a).count();
}
int main(int argc, char** argv)
{
  cudaSetDevice(0);
  cudaFree(0);
  CUmemAllocationProp prop{};
  prop.type                 = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type        = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id          = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (argc > 1) {
    int fd       = std::atoi(argv[1]);
    size_t bytes = std::stoull(argv[2]);
    // Each round twice: mapped read-write, then read-only (a reader's open
    // since rmmd maps readers read-only), each touched by an 8-byte read.
    for (int r = 0; r < 8; ++r) {
      bool const read_only = r % 2 == 1;
      auto a               = clk::now();
      CUmemGenericAllocationHandle h;
      CK(cuMemImportFromShareableHandle(
          &h, (void*)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      CUdeviceptr p;
      CK(cuMemAddressReserve(&p, bytes, gran, 0, 0));
      CK(cuMemMap(p, bytes, 0, h, 0));
      CUmemAccessDesc acc{};
      acc.location = prop.location;
      acc.flags    = read_only ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      CK(cuMemSetAccess(p, bytes, &acc, 1));
      auto b             = clk::now();
      unsigned long word = 0;
      cudaMemcpy(&word, (void*)p, sizeof(word), cudaMemcpyDeviceToHost);
      auto c = clk::now();
      CK(cuMemUnmap(p, bytes));
      CK(cuMemAddressFree(p, bytes));
      CK(cuMemRelease(h));
      auto d = clk::now();
      std::printf("  vmm %s: import+map+access %.1f us, read 8 B %.1f us, unmap+release %.1f us\n",
                  read_only ? "read-only " : "read-write",
                  us(a, b),
                  us(b, c),
                  us(c, d));
    }
    return 0;
  }
  for (size_t mib : {64ul, 1024ul, 4096ul}) {
    size_t bytes = mib << 20;
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, bytes, &prop, 0));
    int fd;
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    fcntl(fd, F_SETFD, 0);
    std::printf("%zu MiB\n", mib);
    std::fflush(stdout);
    pid_t c = fork();
    if (c == 0) {
      execl("/proc/self/exe",
            argv[0],
            std::to_string(fd).c_str(),
            std::to_string(bytes).c_str(),
            (char*)nullptr);
      _exit(127);
    }
    int st;
    waitpid(c, &st, 0);
    close(fd);
    CK(cuMemRelease(h));
  }
}
