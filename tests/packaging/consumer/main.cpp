// Built against an installed rmmd (find_package(rmmd), rmmd::client): opens a
// session with the daemon whose sockets are in RUNTIME_DIR, writes and reads
// back host memory through rmmd::host_memory_resource, frees it.
//
//   rmmd_consumer RUNTIME_DIR
//
// Exit status: 0 done, 3 no daemon answered (rmmd::session_error), 1 other.

#include <rmmd/error.hpp>
#include <rmmd/host_memory_resource.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/session.hpp>

#include <cstddef>
#include <cstdio>
#include <exception>

int main(int argc, char** argv)
{
  if (argc != 2) {
    std::fprintf(stderr, "usage: rmmd_consumer RUNTIME_DIR\n");
    return 2;
  }
  try {
    rmmd::session session(
        rmmd::session::options{.runtime_dir = argv[1], .client_name = "rmmd-consumer"});
    rmmd::host_memory_resource mr(session);
    std::size_t const bytes = 1 << 20;
    auto* p                 = static_cast<unsigned char*>(mr.allocate_sync(bytes, 256));
    for (std::size_t i = 0; i < bytes; ++i) { p[i] = static_cast<unsigned char>(i * 7); }
    for (std::size_t i = 0; i < bytes; ++i) {
      if (p[i] != static_cast<unsigned char>(i * 7)) {
        std::printf("rmmd_consumer: FAILED: byte %zu reads %d\n", i, p[i]);
        return 1;
      }
    }
    mr.deallocate_sync(p, bytes, 256);
    std::printf("rmmd_consumer: session %llu, pool '%s': %zu bytes written, read back, freed: ok\n",
                static_cast<unsigned long long>(session.id()),
                session.host_pool().name.c_str(),
                bytes);
  } catch (rmmd::session_error const& e) {
    std::printf("rmmd_consumer: no session: %s\n", e.what());
    return 3;
  } catch (std::exception const& e) {
    std::printf("rmmd_consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
