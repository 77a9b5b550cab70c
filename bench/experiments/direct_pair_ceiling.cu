// The driver's pace for a direct pair across processes, without rmmd.
//
// Section b2 times the daemon's CUDA work per direct pair in one process
// (allocate 256 B from an exportable pool, synchronise, export the pointer,
// free). A direct client adds its own driver work: it imports the pointer
// and frees the import. This program does exactly that driver work and
// nothing else: N exporter threads, each paired with a child process over a
// socketpair, each pair: cudaMallocAsync + cudaStreamSynchronize +
// cudaMemPoolExportPointer in the parent, the 64-byte export data to the
// child, cudaMemPoolImportPointer + cudaFreeAsync + cudaStreamSynchronize in
// the child, a byte back, cudaFreeAsync in the parent. It prints the pairs
// per second for the exporter alone (b2's work) and for 1, 4 and 16 child
// processes at once.
//
//   nvcc -O2 -o direct_pair_ceiling bench/experiments/direct_pair_ceiling.cu
//   ./direct_pair_ceiling [SECONDS]
#include <cuda_runtime.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

#define CK(x)                                                                              \
  do {                                                                                     \
    auto e = (x);                                                                          \
    if (e != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

using clk              = std::chrono::steady_clock;
constexpr size_t bytes = 256;

static int child_main(int sock, int pool_fd)
{
  alarm(120);  // never outlive a stuck parent
  CK(cudaSetDevice(0));
  cudaMemPool_t pool;
  CK(cudaMemPoolImportFromShareableHandle(
      &pool, (void*)(uintptr_t)pool_fd, cudaMemHandleTypePosixFileDescriptor, 0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  char ack = 1;
  if (write(sock, &ack, 1) != 1) { return 1; }  // ready
  cudaMemPoolPtrExportData d;
  while (read(sock, &d, sizeof d) == (ssize_t)sizeof d) {
    void* p = nullptr;
    CK(cudaMemPoolImportPointer(&p, pool, &d));
    CK(cudaFreeAsync(p, s));
    CK(cudaStreamSynchronize(s));
    if (write(sock, &ack, 1) != 1) { return 1; }
  }
  return 0;
}

int main(int argc, char** argv)
{
  if (argc == 4 && std::string(argv[1]) == "child") {
    return child_main(std::atoi(argv[2]), std::atoi(argv[3]));
  }
  double const seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  alarm(static_cast<unsigned>(seconds * 4 + 60));
  CK(cudaSetDevice(0));
  cudaMemPoolProps props{};
  props.allocType     = cudaMemAllocationTypePinned;
  props.handleTypes   = cudaMemHandleTypePosixFileDescriptor;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id   = 0;
  cudaMemPool_t pool;
  CK(cudaMemPoolCreate(&pool, &props));
  int pool_fd = -1;
  CK(cudaMemPoolExportToShareableHandle(&pool_fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
  int const inheritable_fd = dup(pool_fd);  // dup clears FD_CLOEXEC

  // One exporter thread's loop; with sock < 0, no child (b2's work).
  auto run = [&](int sock, std::atomic<bool> const& go, clk::time_point& stop, long& pairs) {
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    while (!go.load()) {}
    while (clk::now() < stop) {
      void* p = nullptr;
      CK(cudaMallocFromPoolAsync(&p, bytes, pool, s));
      CK(cudaStreamSynchronize(s));
      cudaMemPoolPtrExportData d;
      CK(cudaMemPoolExportPointer(&d, p));
      if (sock >= 0) {
        char ack;
        if (write(sock, &d, sizeof d) != (ssize_t)sizeof d || read(sock, &ack, 1) != 1) {
          std::fprintf(stderr, "the child is gone\n");
          std::exit(1);
        }
      }
      CK(cudaFreeAsync(p, s));
      ++pairs;
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamDestroy(s));
  };

  std::printf(
      "clients pairs/s   (256 B; exporter work per pair as in section b2, plus the import)\n");
  for (int n : {0, 1, 4, 16}) {
    int const threads = n == 0 ? 1 : n;
    std::vector<int> socks(threads, -1);
    std::vector<pid_t> kids;
    for (int i = 0; i < n; ++i) {
      int sv[2];
      // The parent's end is close-on-exec: a later child must not hold an
      // earlier child's peer (that child would never see the end of input).
      if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) { return 1; }
      if (fcntl(sv[0], F_SETFD, FD_CLOEXEC) != 0) { return 1; }
      std::string a2 = std::to_string(sv[1]), a3 = std::to_string(inheritable_fd);
      char* args[] = {argv[0], (char*)"child", a2.data(), a3.data(), nullptr};
      pid_t pid;
      if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, args, environ) != 0) { return 1; }
      close(sv[1]);
      char ready;
      if (read(sv[0], &ready, 1) != 1) { return 1; }
      socks[i] = sv[0];
      kids.push_back(pid);
    }
    std::atomic<bool> go{false};
    std::vector<long> pairs(threads, 0);
    clk::time_point stop = clk::now() + std::chrono::hours(1);
    std::vector<std::thread> pool_threads;
    for (int t = 0; t < threads; ++t) {
      pool_threads.emplace_back(run, socks[t], std::cref(go), std::ref(stop), std::ref(pairs[t]));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto const start = clk::now();
    stop =
        start + std::chrono::duration_cast<clk::duration>(std::chrono::duration<double>(seconds));
    go.store(true);
    for (auto& t : pool_threads) { t.join(); }
    double const took = std::chrono::duration<double>(clk::now() - start).count();
    long total        = 0;
    for (long p : pairs) { total += p; }
    std::printf("%7s %8.0f\n", n == 0 ? "none" : std::to_string(n).c_str(), total / took);
    std::fflush(stdout);
    for (int s : socks) {
      if (s >= 0) { close(s); }
    }
    for (pid_t k : kids) { waitpid(k, nullptr, 0); }
  }
  return 0;
}
