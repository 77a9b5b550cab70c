// The smallest rmmd client: open a session with the node's daemon, allocate
// through it, write, read back, free.
//
//   rmmd_hello [--hold]
//
// With --hold it keeps its allocations after the check (so `rmmctl stats`
// can show them) until its stdin closes, then frees them.

#include <rmmd/host_memory_resource.hpp>
#include <rmmd/session.hpp>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <numeric>
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
    std::printf("hello_rmmd: session %llu, pool '%s': wrote and read back %zu buffers "
                "(%zu words) through rmmd: ok\n",
                static_cast<unsigned long long>(session.id()),
                session.host_pool().name.c_str(),
                buffers.size(),
                checked);
    if (hold) {
      std::printf("hello_rmmd: holding the buffers until stdin closes\n");
      std::fflush(stdout);
      std::string line;
      while (std::getline(std::cin, line)) {}
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      mr.deallocate_sync(buffers[i], sizes[i], 256);
    }
    std::printf("hello_rmmd: freed\n");
  } catch (std::exception const& e) {
    std::fprintf(stderr, "hello_rmmd: %s\n", e.what());
    return 1;
  }
  return 0;
}
