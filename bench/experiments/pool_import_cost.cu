// Where the time of a pool pointer import goes, by size; against legacy IPC.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#define CK(x)                                                             \
  do {                                                                    \
    auto e = (x);                                                         \
    if (e != cudaSuccess) {                                               \
      std::printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorName(e)); \
      std::exit(1);                                                       \
    }                                                                     \
  } while (0)
using clk = std::chrono::steady_clock;
static double us(clk::time_point a, clk::time_point b)
{
  return std::chrono::duration<double, std::micro>(b - a).count();
}
static std::string hex(void const* p, size_t n)
{
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, 3, "%02x", ((unsigned char const*)p)[i]);
    s += b;
  }
  return s;
}
static void unhex(char const* s, void* p, size_t n)
{
  for (size_t i = 0; i < n; ++i) {
    unsigned v;
    std::sscanf(s + 2 * i, "%2x", &v);
    ((unsigned char*)p)[i] = v;
  }
}
int main(int argc, char** argv)
{
  if (argc > 1 && std::string(argv[1]) == "child") {
    int fd = std::atoi(argv[2]);
    cudaMemPoolPtrExportData d;
    unhex(argv[3], &d, sizeof d);
    cudaIpcMemHandle_t ih;
    unhex(argv[4], &ih, sizeof ih);
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    cudaMemPool_t pool;
    auto t0 = clk::now();
    CK(cudaMemPoolImportFromShareableHandle(
        &pool, (void*)(uintptr_t)fd, cudaMemHandleTypePosixFileDescriptor, 0));
    auto t1 = clk::now();
    std::printf("  pool import %.1f us\n", us(t0, t1));
    for (int r = 0; r < 5; ++r) {
      void* p;
      auto a = clk::now();
      CK(cudaMemPoolImportPointer(&p, pool, &d));
      auto b = clk::now();
      CK(cudaMemsetAsync(p, 1, 8, 0));
      CK(cudaStreamSynchronize(0));
      auto c = clk::now();
      CK(cudaFreeAsync(p, 0));
      CK(cudaStreamSynchronize(0));
      auto e = clk::now();
      std::printf("  pool ptr: import %.1f us, first touch %.1f us, free+sync %.1f us\n",
                  us(a, b),
                  us(b, c),
                  us(c, e));
    }
    for (int r = 0; r < 3; ++r) {
      void* p;
      auto a = clk::now();
      CK(cudaIpcOpenMemHandle(&p, ih, cudaIpcMemLazyEnablePeerAccess));
      auto b = clk::now();
      CK(cudaMemsetAsync(p, 1, 8, 0));
      CK(cudaStreamSynchronize(0));
      auto c = clk::now();
      CK(cudaIpcCloseMemHandle(p));
      auto e = clk::now();
      std::printf("  legacy ipc: open %.1f us, first touch %.1f us, close %.1f us\n",
                  us(a, b),
                  us(b, c),
                  us(c, e));
    }
    return 0;
  }
  CK(cudaSetDevice(0));
  for (size_t mib : {64ul, 1024ul, 4096ul}) {
    for (int variant = 0; variant < 2; ++variant) {
      size_t bytes = mib << 20;
      cudaMemPoolProps props{};
      props.allocType     = cudaMemAllocationTypePinned;
      props.handleTypes   = cudaMemHandleTypePosixFileDescriptor;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id   = 0;
      cudaMemPool_t pool;
      CK(cudaMemPoolCreate(&pool, &props));
      if (variant == 1) {
        uint64_t t = ~0ull;
        CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &t));
      }
      int fd = -1;
      CK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
      void* p;
      CK(cudaMallocFromPoolAsync(&p, bytes, pool, 0));
      CK(cudaStreamSynchronize(0));
      cudaMemPoolPtrExportData d;
      CK(cudaMemPoolExportPointer(&d, p));
      void* q;
      CK(cudaMalloc(&q, bytes));
      cudaIpcMemHandle_t ih;
      CK(cudaIpcGetMemHandle(&ih, q));
      std::printf("%zu MiB, %s\n", mib, variant ? "release threshold max" : "default pool");
      std::fflush(stdout);
      fcntl(fd, F_SETFD, 0);
      pid_t c = fork();
      if (c == 0) {
        execl("/proc/self/exe",
              argv[0],
              "child",
              std::to_string(fd).c_str(),
              hex(&d, sizeof d).c_str(),
              hex(&ih, sizeof ih).c_str(),
              (char*)nullptr);
        _exit(127);
      }
      int st;
      waitpid(c, &st, 0);
      CK(cudaFreeAsync(p, 0));
      CK(cudaStreamSynchronize(0));
      CK(cudaFree(q));
      CK(cudaMemPoolDestroy(pool));
      close(fd);
    }
  }
}
