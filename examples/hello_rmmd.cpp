// The smallest rmmd client: open a session with the node's daemon, allocate
// through it, write, read back, free: device memory from the GPU's pool
// (rmm::device_uvector over rmmd::ipc_memory_resource) where the daemon serves
// one, and shared host memory (rmmd::host_memory_resource) everywhere.
//
//   rmmd_hello [--hold]
//
// With --hold it keeps its allocations after the check (so `rmmctl stats`
// can show them) until its stdin closes, then frees them.

#include <rmmd/host_memory_resource.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/session.hpp>

#include <rmm/device_uvector.hpp>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

int main(int argc, char** argv)
{
  bool const hold = argc > 1 && std::strcmp(argv[1], "--hold") == 0;
  try {
    rmmd::session session(rmmd::session::options{.client_name = "hello-rmmd"});
    rmmd::host_memory_resource mr(session);

    std::vector<std::size_t> sizes{256, 64 << 10, 1 << 20};
    std::vector<int*> buffers;
    for (auto bytes : sizes) {
      auto* p = static_cast<int*>(mr.allocate_sync(bytes, 256));
      std::iota(p, p + bytes / sizeof(int), static_cast<int>(bytes));
      buffers.push_back(p);
    }
    std::size_t checked = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      for (std::size_t j = 0; j < sizes[i] / sizeof(int); ++j) {
        if (buffers[i][j] != static_cast<int>(sizes[i] + j)) {
          std::printf("hello_rmmd: FAILED: buffer %zu word %zu reads %d\n", i, j, buffers[i][j]);
          return 1;
        }
        ++checked;
      }
    }
    std::printf(
        "hello_rmmd: session %llu, pool '%s': wrote and read back %zu buffers "
        "(%zu words) through rmmd: ok\n",
        static_cast<unsigned long long>(session.id()),
        session.host_pool().name.c_str(),
        buffers.size(),
        checked);
    // Device memory, where the daemon has a pool on this process's GPU.
    std::optional<rmm::device_uvector<int>> device_vector;
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0) {
      rmmd::ipc_memory_resource device_mr(session);  // the current device's pool
      cuda::stream_ref stream{cudaStream_t{}};
      std::size_t const n = (8 << 20) / sizeof(int);
      device_vector.emplace(n, stream, device_mr);
      std::vector<int> host(n), back(n);
      std::iota(host.begin(), host.end(), 42);
      cudaMemcpyAsync(device_vector->data(),
                      host.data(),
                      n * sizeof(int),
                      cudaMemcpyHostToDevice,
                      stream.get());
      cudaMemcpyAsync(back.data(),
                      device_vector->data(),
                      n * sizeof(int),
                      cudaMemcpyDeviceToHost,
                      stream.get());
      stream.sync();
      if (back != host) {
        std::printf("hello_rmmd: FAILED: device memory did not read back\n");
        return 1;
      }
      std::printf(
          "hello_rmmd: pool '%s': wrote and read back %zu ints of device memory "
          "(rmm::device_uvector over rmmd::ipc_memory_resource): ok\n",
          device_mr.pool().name.c_str(),
          n);
    } else {
      cudaGetLastError();
    }
    if (hold) {
      std::printf("hello_rmmd: holding the buffers until stdin closes\n");
      std::fflush(stdout);
      std::string line;
      while (std::getline(std::cin, line)) {}
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      mr.deallocate_sync(buffers[i], sizes[i], 256);
    }
    device_vector.reset();
    std::printf("hello_rmmd: freed\n");
  } catch (std::exception const& e) {
    std::fprintf(stderr, "hello_rmmd: %s\n", e.what());
    return 1;
  }
  return 0;
}
