// Does the driver import a pool pointer larger than 4 GiB into another
// process? rmmd's clients ended on SIGSEGV (a call through a null pointer)
// taking a 6 GiB lease on an H200 while 4 GiB + 2 MiB worked; this takes
// rmmd out: one exportable pool (posix fd; maxSize as given), one
// allocation of BYTES, a child process (exec'd, the pool's fd inherited)
// that imports the pool and the pointer, writes it and synchronises.
//
//   nvcc -O2 -o large_pool_import bench/experiments/large_pool_import.cu
//   for b in 4297064448 4831838208 5368709120 6442450944; do ./large_pool_import $b; done
//   ./large_pool_import 6442450944 8589934592    # the pool's maxSize 8 GiB
//
// Prints one line per run: the size, maxSize, and how the child ended.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

extern char** environ;

#define CK(x)                                           \
  do {                                                  \
    auto e = (x);                                       \
    if (e != cudaSuccess) {                             \
      std::printf("%s: %s\n", #x, cudaGetErrorName(e)); \
      std::fflush(stdout);                              \
      return 3;                                         \
    }                                                   \
  } while (0)

static int child(int fd, char const* hex, size_t bytes)
{
  cudaMemPoolPtrExportData data{};
  for (int i = 0; i < 64; ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    data.reserved[i] = static_cast<unsigned char>(v);
  }
  CK(cudaSetDevice(0));
  cudaMemPool_t pool{};
  CK(cudaMemPoolImportFromShareableHandle(&pool,
                                          reinterpret_cast<void*>(static_cast<std::uintptr_t>(fd)),
                                          cudaMemHandleTypePosixFileDescriptor,
                                          0));
  cudaMemAccessDesc access{};
  access.location = {cudaMemLocationTypeDevice, 0};
  access.flags    = cudaMemAccessFlagsProtReadWrite;
  CK(cudaMemPoolSetAccess(pool, &access, 1));
  void* p = nullptr;
  std::printf("child: importing\n");
  std::fflush(stdout);
  CK(cudaMemPoolImportPointer(&p, pool, &data));
  CK(cudaMemset(p, 7, bytes));
  CK(cudaDeviceSynchronize());
  std::printf("child: imported and written at %p\n", p);
  return 0;
}

int main(int argc, char** argv)
{
  if (argc == 5) { return child(std::atoi(argv[2]), argv[3], std::strtoull(argv[4], nullptr, 10)); }
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s BYTES [POOL_MAX_BYTES]\n", argv[0]);
    return 2;
  }
  size_t const bytes = std::strtoull(argv[1], nullptr, 10);
  size_t const max   = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 0;
  CK(cudaSetDevice(0));
  cudaMemPoolProps props{};
  props.allocType   = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  props.location    = {cudaMemLocationTypeDevice, 0};
  props.maxSize     = max;
  cudaMemPool_t pool{};
  CK(cudaMemPoolCreate(&pool, &props));
  void* p = nullptr;
  CK(cudaMallocFromPoolAsync(&p, bytes, pool, nullptr));
  CK(cudaStreamSynchronize(nullptr));
  int fd = -1;
  CK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
  ::fcntl(fd, F_SETFD, 0);  // the child inherits it
  cudaMemPoolPtrExportData data{};
  CK(cudaMemPoolExportPointer(&data, p));
  char hex[129];
  for (int i = 0; i < 64; ++i) { std::snprintf(hex + 2 * i, 3, "%02x", data.reserved[i]); }
  std::string fd_text = std::to_string(fd), bytes_text = std::to_string(bytes);
  char child_word[]  = "child";
  char* child_argv[] = {argv[0], child_word, fd_text.data(), hex, bytes_text.data(), nullptr};
  pid_t pid{};
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, child_argv, environ) != 0) { return 4; }
  int status = 0;
  ::waitpid(pid, &status, 0);
  std::printf("%zu bytes, pool maxSize %zu: the child %s %d\n",
              bytes,
              max,
              WIFSIGNALED(status) ? "died of signal" : "exited",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
  return 0;
}
