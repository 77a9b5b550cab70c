// Built against an installed rmmd (find_package(rmmd) and rmmd::client, or
// pkg-config rmmd): opens a session with the daemon whose sockets are in
// RUNTIME_DIR, writes and reads back host memory through
// rmmd::host_memory_resource, frees it. With --device, then the same with
// device memory of the current GPU's pool (rmm::device_uvector over
// rmmd::ipc_memory_resource). It also asks the daemon's health and stats
// through rmmd::admin (its public header needs no protobuf).
//
//   rmmd_consumer RUNTIME_DIR [--device]
//
// Exit status: 0 done, 3 no daemon answered (rmmd::session_error), 4 --device
// where CUDA sees no GPU (the host part passed; the reason is printed),
// 1 other.

#include <rmmd/admin.hpp>
#include <rmmd/error.hpp>
#include <rmmd/host_memory_resource.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/session.hpp>

#include <rmm/device_uvector.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

int const exit_no_gpu = 4;

void check(cudaError_t status, char const* what)
{
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(status) + " (" +
                             cudaGetErrorString(status) + ")");
  }
}

/// 64 MiB of the current GPU's pool, written from the host, read back.
int use_device_memory(rmmd::session const& session)
{
  int gpus          = 0;
  cudaError_t found = cudaGetDeviceCount(&gpus);
  if (found != cudaSuccess || gpus == 0) {
    std::printf("rmmd_consumer: no GPU: %s; device part skipped\n",
                found != cudaSuccess ? cudaGetErrorString(found) : "CUDA sees no device");
    return exit_no_gpu;
  }
  rmmd::ipc_memory_resource device_mr(session);  // the current device's pool
  cuda::stream_ref stream{cudaStream_t{}};
  std::size_t const n = (64 << 20) / sizeof(int);
  std::vector<int> host(n), back(n);
  std::iota(host.begin(), host.end(), 7);
  {
    rmm::device_uvector<int> v(n, stream, device_mr);
    check(cudaMemcpyAsync(
              v.data(), host.data(), n * sizeof(int), cudaMemcpyHostToDevice, stream.get()),
          "cudaMemcpyAsync to the device");
    check(cudaMemcpyAsync(
              back.data(), v.data(), n * sizeof(int), cudaMemcpyDeviceToHost, stream.get()),
          "cudaMemcpyAsync from the device");
    stream.sync();
  }
  if (back != host) {
    std::printf("rmmd_consumer: FAILED: device memory did not read back\n");
    return 1;
  }
  auto const& pool = device_mr.pool();
  std::printf(
      "rmmd_consumer: session %llu, pool '%s' (%s): %zu bytes of device memory written, "
      "read back, freed: ok\n",
      static_cast<unsigned long long>(session.id()),
      pool.name.c_str(),
      pool.gpu_uuid.c_str(),
      n * sizeof(int));
  // Direct mode: small allocations are packed leases, carved by the daemon
  // (another user, as deployed) out of a block this session imports once.
  rmmd::ipc_resource_options direct_options;
  direct_options.mode = rmmd::allocation_mode::direct;
  rmmd::ipc_memory_resource direct_mr(session, direct_options);
  {
    rmm::device_uvector<int> a(1000, stream, direct_mr), b(1000, stream, direct_mr);
    check(cudaMemcpyAsync(
              a.data(), host.data(), a.size() * sizeof(int), cudaMemcpyHostToDevice, stream.get()),
          "cudaMemcpyAsync to a packed lease");
    check(cudaMemcpyAsync(
              b.data(), a.data(), a.size() * sizeof(int), cudaMemcpyDeviceToDevice, stream.get()),
          "cudaMemcpyAsync between packed leases");
    check(cudaMemcpyAsync(
              back.data(), b.data(), b.size() * sizeof(int), cudaMemcpyDeviceToHost, stream.get()),
          "cudaMemcpyAsync from a packed lease");
    stream.sync();
  }
  if (!std::equal(host.begin(), host.begin() + 1000, back.begin())) {
    std::printf("rmmd_consumer: FAILED: packed direct leases did not read back\n");
    return 1;
  }
  std::printf("rmmd_consumer: two packed direct leases written, copied, read back: ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  bool const device = argc == 3 && std::strcmp(argv[2], "--device") == 0;
  if (argc != 2 && !device) {
    std::fprintf(stderr, "usage: rmmd_consumer RUNTIME_DIR [--device]\n");
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
    rmmd::admin const admin(session);
    auto const health = admin.health();
    std::printf("rmmd_consumer: daemon %s, %u sessions, stats of %zu bytes of JSON: ok\n",
                health.version.c_str(),
                health.session_count,
                admin.stats_json().size());
    if (device) { return use_device_memory(session); }
  } catch (rmmd::session_error const& e) {
    std::printf("rmmd_consumer: no session: %s\n", e.what());
    return 3;
  } catch (std::exception const& e) {
    std::printf("rmmd_consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
