// A client process for the integration tests, started with fork+exec.
//
//   rmmd_test_client hold BYTES SEED COUNT
//       allocates COUNT buffers of BYTES from the host pool through
//       rmmd::host_memory_resource, fills each with SEED's pattern, prints
//       "buffer OFFSET BYTES SEED" per buffer and "ready", then waits for
//       stdin to close, checks the buffers are intact, frees them, prints
//       "freed" and exits 0.
//   rmmd_test_client device-hold BYTES VALUE
//       fills an rmm::device_uvector<uint8_t> of BYTES from the GPU 0 pool (one
//       direct allocation) with
//       VALUE (cudaMemsetAsync), prints "ready", waits for stdin to close,
//       copies it back and checks it, prints "intact" (or "corrupted") and
//       exits 0 (or 1).
//   rmmd_test_client slab-hold BYTES VALUE
//       the same through the fast path (allocation_mode::slab).
//   rmmd_test_client slab-fill COUNT BYTES
//       COUNT rmm::device_uvector<uint8_t> of BYTES at once from the GPU 0
//       pool through the fast path (its carving pool grows by ever larger
//       slabs), each filled with its own value and checked at both ends;
//       prints "filled COUNT" (or "corrupted I") and exits 0 (or 1).
//   rmmd_test_client idle-slabs COUNT BYTES
//       a slab client at rest, on the host pool: leases COUNT blocks of BYTES
//       (its "slabs"), reports them as slabs with nothing carved, watches for
//       the daemon's reclaim requests and prints "ready". Asked, it frees them
//       all, reports that, and prints "gave-back BYTES". Exits 0 ("done")
//       once stdin closes.
//   rmmd_test_client allocate BYTES
//       one allocation of BYTES from the host pool in a session of its own:
//       prints "allocated MS" (the milliseconds the request took), or
//       "refused MS MESSAGE" for rmm::out_of_memory; then waits for stdin to
//       close and exits 0.
//   rmmd_test_client write OFFSET:BYTES:SEED...
//       opens its own session, maps the host pool and writes each range's
//       pattern (in memory another process allocated); prints "written N".
//   rmmd_test_client device-free-pending BYTES
//       allocates BYTES from the GPU 0 pool, stalls its stream (a host
//       function that never returns), frees the buffer on that stream (the
//       Free waits behind the stall and will never be sent), prints
//       "pending" and waits to be killed.
//   rmmd_test_client device-identity
//       for each CUDA device this process sees (its CUDA_VISIBLE_DEVICES
//       decides which): the pool ipc_memory_resource picks for it, a direct
//       allocation filled with the device's number and read back, and the
//       device the pointer lives on: "device D uuid U pool NAME pool_uuid P
//       lives_on U2 intact|corrupted". For each CUDA pool on a GPU it cannot
//       see: "pool NAME invisible: MESSAGE". Then "done".
//   rmmd_test_client device-churn COUNT BYTES
//       COUNT direct allocations of BYTES from its device's pool, each written
//       and freed on a stream without waiting for it; then synchronises, prints
//       "done" and waits for stdin to close.
//   rmmd_test_client verify OFFSET:BYTES:SEED...
//       opens its own session, maps the host pool and checks that each range
//       holds its pattern (written by another process); prints "verified N"
//       and exits 0, or names the first mismatch and exits 1.
//   rmmd_test_client exit-with-static KIND
//       KIND: host, pinned-host, ipc-slab or ipc-direct. Keeps a resource of
//       that kind in statics with live allocations, as programs do: in a
//       std::optional made before main (so destroyed after whatever the CUDA
//       runtime registered for its exit), with a static that frees an
//       allocation in its destructor and, for device-accessible kinds, a
//       static rmm::device_uvector; and in a function-local static made in
//       main. Prints "holding", waits for stdin to close and returns from
//       main: the test checks that nothing is printed on stderr and the exit
//       status is 0.
//   rmmd_test_client snoop-host BYTES
//       a hostile client of the host pool (tenant isolation): allocates BYTES
//       through rmmd::host_memory_resource (0: nothing), frees them but keeps
//       the pointer, and prints "kept OFFSET" (or "mapped"). For each line
//       "scan HEX" on stdin it looks for those 16 bytes in everything it can
//       read: the freed allocation ("kept"), its whole mapping of the pool
//       ("mapping"), every memfd mapping in /proc/self/maps ("maps"), every
//       memfd among its fds mapped whole ("fd"), and the pool mapping of a
//       session it opens for the scan ("fresh"); prints "found WHERE at
//       OFFSET" for each place that holds it, then "scanned BYTES". Reads go
//       through /proc/self/mem, so a page it may not read is an error
//       ("unreadable WHERE at OFFSET"), not a crash. Exits 0 when stdin closes.
//   rmmd_test_client secret-host BYTES HEX
//       allocates from the host pool through rmmd::host_memory_resource:
//       BYTES, then pieces of 1 MiB, 64 KiB and 4 KiB until the pool refuses
//       each size; fills every allocation with the 16 bytes HEX over and
//       over; prints "holding COUNT TOTAL_BYTES" and waits for stdin to close.
//   rmmd_test_client snoop-device BYTES SPAN
//       a hostile client of the GPU 0 pool through the session's own calls:
//       allocates BYTES (a direct lease of its own, never packed), imports
//       it, zeroes it, sends the Free but keeps the import, and prints
//       "kept". For each line "scan HEX": copies back the kept BYTES
//       ("kept"), then up to SPAN bytes past them in 64 KiB steps, stopping
//       at the first copy that fails ("past"); prints "found WHERE at OFFSET"
//       for each place that holds the secret, "read-error WHERE at OFFSET:
//       CUDA_ERROR" where a copy failed (reading nothing is not seeing it),
//       then "scanned BYTES".
//   rmmd_test_client secret-device MODE BYTES COUNT HEX
//       up to COUNT allocations of BYTES from the GPU 0 pool through
//       rmmd::ipc_memory_resource (MODE: direct or slab), each filled with
//       the 16 bytes HEX over and over; stops early when the pool refuses;
//       prints "holding COUNT TOTAL_BYTES" and waits for stdin to close.
//
// The daemon is found through $RMMD_RUNTIME_DIR.

#include "common/gpu_identity.hpp"
#include "tests/tools/pattern.hpp"
#include "tests/tools/secret.hpp"

#include <rmmd/host_memory_resource.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/pinned_host_memory_resource.hpp>

#include <rmm/device_uvector.hpp>
#include <rmmd/session.hpp>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using rmmd::test::fill;
using rmmd::test::first_mismatch;

int hold(std::size_t bytes, std::uint64_t seed, int count)
{
  rmmd::host_memory_resource mr(
      rmmd::session(rmmd::session::options{.client_name = "holder-" + std::to_string(seed)}));
  std::vector<void*> buffers;
  for (int i = 0; i < count; ++i) {
    void* p = mr.allocate_sync(bytes, 256);
    fill(p, bytes, seed + static_cast<std::uint64_t>(i));
    buffers.push_back(p);
    std::printf("buffer %llu %zu %llu\n",
                static_cast<unsigned long long>(mr.offset_of(p)),
                bytes,
                static_cast<unsigned long long>(seed + static_cast<std::uint64_t>(i)));
  }
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {}
  int status = 0;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (first_mismatch(buffers[i], bytes, seed + i) >= 0) {
      std::printf("corrupted buffer %zu\n", i);
      status = 1;
    }
    mr.deallocate_sync(buffers[i], bytes, 256);
  }
  std::printf("freed\n");
  return status;
}

int idle_slabs(int count, std::size_t bytes)
{
  rmmd::session s(rmmd::session::options{.client_name = "idle-slabs"});
  auto const pool = s.host_pool().id;
  std::vector<std::uint64_t> slabs;
  for (int i = 0; i < count; ++i) { slabs.push_back(s.allocate(pool, bytes, 0).id); }
  auto report = [&](std::size_t held) {
    static_cast<void>(s.report_usage(
        {rmmd::carved_usage{.pool_id = pool, .slab_bytes = held, .reclaimable_bytes = held}}));
  };
  report(slabs.size() * bytes);
  std::mutex mutex;
  std::condition_variable wake;
  bool asked = false, done = false;
  auto const watch = s.watch_reclaims(pool, [&](std::uint32_t) {
    {
      std::lock_guard lock(mutex);
      asked = true;
    }
    wake.notify_all();
  });
  std::thread input([&] {
    std::string line;
    while (std::getline(std::cin, line)) {}
    {
      std::lock_guard lock(mutex);
      done = true;
    }
    wake.notify_all();
  });
  std::printf("ready\n");
  std::fflush(stdout);
  std::unique_lock lock(mutex);
  while (true) {
    wake.wait(lock, [&] { return asked || done; });
    if (done) { break; }
    asked = false;
    lock.unlock();
    auto const given = slabs.size() * bytes;
    for (auto id : slabs) { s.free(id); }
    slabs.clear();
    report(0);
    std::printf("gave-back %zu\n", given);
    std::fflush(stdout);
    lock.lock();
  }
  lock.unlock();
  input.join();
  s.unwatch_reclaims(watch);
  std::printf("done\n");
  return 0;
}

int allocate_once(std::size_t bytes)
{
  rmmd::session s(rmmd::session::options{.client_name = "allocate-once"});
  auto const pool  = s.host_pool().id;
  auto const start = std::chrono::steady_clock::now();
  auto ms          = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  try {
    static_cast<void>(s.allocate(pool, bytes, 0));
    std::printf("allocated %.1f\n", ms());
  } catch (rmm::out_of_memory const& e) {
    std::printf("refused %.1f %s\n", ms(), e.what());
  }
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {}
  return 0;
}

int device_hold(std::size_t bytes, int value, rmmd::allocation_mode mode)
{
  rmmd::ipc_memory_resource mr(
      rmmd::session(rmmd::session::options{.client_name = "device-holder"}),
      0,
      rmmd::ipc_resource_options{.mode = mode});
  cuda::stream_ref stream{cudaStream_t{}};
  rmm::device_uvector<std::uint8_t> buffer(bytes, stream, mr);
  if (cudaMemsetAsync(buffer.data(), value, bytes, stream.get()) != cudaSuccess) { return 4; }
  stream.sync();
  std::printf("ready\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {}
  std::vector<std::uint8_t> host(bytes);
  if (cudaMemcpy(host.data(), buffer.data(), bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    return 4;
  }
  for (auto b : host) {
    if (b != static_cast<std::uint8_t>(value)) {
      std::printf("corrupted\n");
      return 1;
    }
  }
  std::printf("intact\n");
  return 0;
}

int slab_fill(int count, std::size_t bytes)
{
  rmmd::ipc_memory_resource mr(rmmd::session(rmmd::session::options{.client_name = "slab-filler"}),
                               0,
                               rmmd::ipc_resource_options{.mode = rmmd::allocation_mode::slab});
  cuda::stream_ref stream{cudaStream_t{}};
  auto const value = [](int i) { return static_cast<std::uint8_t>(i % 251 + 1); };
  std::vector<rmm::device_uvector<std::uint8_t>> buffers;
  for (int i = 0; i < count; ++i) {
    buffers.emplace_back(bytes, stream, mr);
    if (cudaMemsetAsync(buffers.back().data(), value(i), bytes, stream.get()) != cudaSuccess) {
      return 4;
    }
  }
  stream.sync();
  std::size_t const edge = std::min<std::size_t>(bytes, 4096);
  std::vector<std::uint8_t> host(edge);
  for (int i = 0; i < count; ++i) {
    for (std::size_t offset : {std::size_t{0}, bytes - edge}) {
      if (cudaMemcpy(host.data(), buffers[i].data() + offset, edge, cudaMemcpyDeviceToHost) !=
          cudaSuccess) {
        return 4;
      }
      if (std::any_of(host.begin(), host.end(), [&](auto b) { return b != value(i); })) {
        std::printf("corrupted %d\n", i);
        return 1;
      }
    }
  }
  std::printf("filled %d\n", count);
  return 0;
}

int write_patterns(int argc, char** argv)
{
  rmmd::session s(rmmd::session::options{.client_name = "writer"});
  auto* base = s.host_pool_base(s.host_pool().id);
  for (int i = 0; i < argc; ++i) {
    unsigned long long offset{}, seed{};
    std::size_t bytes{};
    if (std::sscanf(argv[i], "%llu:%zu:%llu", &offset, &bytes, &seed) != 3) {
      std::printf("bad argument %s\n", argv[i]);
      return 2;
    }
    fill(base + offset, bytes, seed);
  }
  std::printf("written %d\n", argc);
  return 0;
}

int device_free_pending(std::size_t bytes)
{
  rmmd::ipc_memory_resource mr(rmmd::session(rmmd::session::options{.client_name = "free-pending"}),
                               0,
                               rmmd::ipc_resource_options{.mode = rmmd::allocation_mode::direct});
  cudaStream_t stream{};
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) { return 4; }
  void* p    = mr.allocate(cuda::stream_ref{stream}, bytes, 256);
  auto stall = [](void*) {
    for (;;) { ::pause(); }
  };
  if (cudaLaunchHostFunc(stream, stall, nullptr) != cudaSuccess) { return 4; }
  mr.deallocate(cuda::stream_ref{stream}, p, bytes, 256);  // returns: the daemon waits, not us
  std::printf("pending\n");
  std::fflush(stdout);
  for (;;) { ::pause(); }
}

std::string uuid_of(int device)
{
  auto id = rmmd::gpu::identify(device);
  return id ? id->uuid : "?";
}

int device_identity()
{
  rmmd::session s(rmmd::session::options{.client_name = "identity"});
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) { return 4; }
  constexpr std::size_t bytes = 1 << 20;
  for (int d = 0; d < count; ++d) {
    if (cudaSetDevice(d) != cudaSuccess) { return 4; }
    try {
      rmmd::ipc_memory_resource mr(
          s, rmmd::ipc_resource_options{.mode = rmmd::allocation_mode::direct});
      cuda::stream_ref stream{cudaStream_t{}};
      void* p = mr.allocate(stream, bytes, 256);
      std::vector<unsigned char> back(bytes);
      bool ok = cudaMemsetAsync(p, d + 1, bytes, stream.get()) == cudaSuccess &&
                cudaMemcpyAsync(back.data(), p, bytes, cudaMemcpyDeviceToHost, stream.get()) ==
                    cudaSuccess &&
                cudaStreamSynchronize(stream.get()) == cudaSuccess;
      for (auto b : back) { ok = ok && b == d + 1; }
      cudaPointerAttributes attrs{};
      std::string lives_on =
          cudaPointerGetAttributes(&attrs, p) == cudaSuccess ? uuid_of(attrs.device) : "?";
      mr.deallocate(stream, p, bytes, 256);
      std::printf("device %d uuid %s pool %s pool_uuid %s lives_on %s %s\n",
                  d,
                  uuid_of(d).c_str(),
                  mr.pool().name.c_str(),
                  mr.pool().gpu_uuid.c_str(),
                  lives_on.c_str(),
                  ok ? "intact" : "corrupted");
    } catch (std::exception const& e) {
      std::printf("device %d error %s\n", d, e.what());
    }
  }
  for (auto const& pool : s.pools()) {
    if (pool.backend != rmmd::backend_kind::cuda || pool.device >= 0) { continue; }
    try {
      rmmd::ipc_memory_resource mr(s, pool.name);
      std::printf("pool %s invisible but usable\n", pool.name.c_str());
    } catch (rmmd::logic_error const& e) {
      std::printf("pool %s invisible: %s\n", pool.name.c_str(), e.what());
    }
  }
  std::printf("done\n");
  return 0;
}

int device_churn(int count, std::size_t bytes)
{
  rmmd::ipc_memory_resource mr(rmmd::session(rmmd::session::options{.client_name = "churn"}),
                               rmmd::ipc_resource_options{.mode = rmmd::allocation_mode::direct});
  cudaStream_t stream{};
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) { return 4; }
  for (int i = 0; i < count; ++i) {
    void* p = mr.allocate(cuda::stream_ref{stream}, bytes, 256);
    if (cudaMemsetAsync(p, i & 0xff, bytes, stream) != cudaSuccess) { return 4; }
    mr.deallocate(cuda::stream_ref{stream}, p, bytes, 256);
  }
  if (cudaStreamSynchronize(stream) != cudaSuccess) { return 4; }
  std::printf("done\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {}
  cudaStreamDestroy(stream);
  return 0;
}

// exit-with-static: made empty before main (before CUDA starts), in this
// order, and destroyed in the reverse order while the process exits.
std::optional<rmmd::host_memory_resource> static_host;
std::optional<rmmd::pinned_host_memory_resource> static_pinned;
std::optional<rmmd::ipc_memory_resource> static_ipc;
/// Frees what it holds in its destructor, as a static container of buffers does.
struct static_buffers {
  std::vector<std::function<void()>> frees;
  ~static_buffers()
  {
    for (auto& free : frees) { free(); }
  }
} static_frees;
std::optional<rmm::device_uvector<std::uint8_t>> static_vector;

template <typename Resource, typename Make>
int exit_with_static(std::optional<Resource>& kept, Make make)
{
  rmmd::session s(rmmd::session::options{.client_name = "exit-with-static"});
  auto& mr = kept.emplace(make(s));
  cuda::stream_ref stream{cudaStreamLegacy};
  // Left allocated: the resource's destructor meets them.
  for (int i = 0; i < 3; ++i) { static_cast<void>(mr.allocate_sync(std::size_t{1} << 20, 256)); }
  static_cast<void>(mr.allocate(stream, 65536, 256));
  // Freed by a static's destructor while the process exits.
  void* p = mr.allocate(stream, 4096, 256);
  static_frees.frees.emplace_back(
      [&mr, p] { mr.deallocate(cuda::stream_ref{cudaStreamLegacy}, p, 4096, 256); });
  if constexpr (cuda::mr::resource_with<Resource, cuda::mr::device_accessible>) {
    static_vector.emplace(std::size_t{1} << 20, stream, mr);
  }
  // A function-local static made after CUDA started: destroyed before the
  // handlers registered until then.
  static Resource second = make(s);
  static_cast<void>(second.allocate_sync(8192, 256));
  std::printf("holding\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {}
  return 0;
}

int exit_with_static(std::string_view kind)
{
  if (kind == "host") {
    return exit_with_static(static_host,
                            [](rmmd::session const& s) { return rmmd::host_memory_resource(s); });
  }
  if (kind == "pinned-host") {
    return exit_with_static(
        static_pinned, [](rmmd::session const& s) { return rmmd::pinned_host_memory_resource(s); });
  }
  auto const mode =
      kind == "ipc-slab" ? rmmd::allocation_mode::slab : rmmd::allocation_mode::direct;
  if (kind == "ipc-slab" || kind == "ipc-direct") {
    return exit_with_static(static_ipc, [mode](rmmd::session const& s) {
      return rmmd::ipc_memory_resource(s, 0, rmmd::ipc_resource_options{.mode = mode});
    });
  }
  std::printf("unknown kind %.*s\n", static_cast<int>(kind.size()), kind.data());
  return 2;
}

int verify(int argc, char** argv)
{
  rmmd::session s(rmmd::session::options{.client_name = "verifier"});
  auto* base = s.host_pool_base(s.host_pool().id);
  int n      = 0;
  for (int i = 0; i < argc; ++i) {
    unsigned long long offset{}, seed{};
    std::size_t bytes{};
    if (std::sscanf(argv[i], "%llu:%zu:%llu", &offset, &bytes, &seed) != 3) {
      std::printf("bad argument %s\n", argv[i]);
      return 2;
    }
    if (auto at = first_mismatch(base + offset, bytes, seed); at >= 0) {
      std::printf("mismatch in %s at word %ld\n", argv[i], at);
      return 1;
    }
    ++n;
  }
  std::printf("verified %d\n", n);
  return 0;
}

// ---- tenant isolation: a hostile client and the tenant whose secret it hunts

using rmmd::test::find_secret;
using rmmd::test::parse_secret;
using rmmd::test::secret_bytes;

/// Looks for the secret in this process's memory [at, at + bytes) through
/// /proc/self/mem, so that a page it may not read (a hole past a file's end,
/// a revoked mapping) is an error it reports instead of a SIGBUS. Prints
/// "found WHERE at OFFSET" (the first copy) or "unreadable WHERE at OFFSET";
/// returns the bytes read.
std::size_t scan_memory(std::string const& where,
                        void const* at,
                        std::size_t bytes,
                        secret_bytes const& secret)
{
  static int const mem          = ::open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
  constexpr std::size_t chunk   = std::size_t{1} << 20;
  constexpr std::size_t overlap = sizeof(secret_bytes) - 1;  // a copy across two chunks
  std::vector<unsigned char> buffer(chunk + overlap);
  auto const base  = reinterpret_cast<std::uintptr_t>(at);
  std::size_t done = 0, carried = 0;
  while (done < bytes) {
    auto const want = std::min(chunk, bytes - done);
    auto const got  = ::pread(mem, buffer.data() + carried, want, static_cast<off_t>(base + done));
    if (got <= 0) {
      std::printf("unreadable %s at %zu: %s\n",
                  where.c_str(),
                  done,
                  got < 0 ? std::strerror(errno) : "end of memory");
      return done;
    }
    auto const n = carried + static_cast<std::size_t>(got);
    if (auto found = find_secret(buffer.data(), n, secret)) {
      std::printf("found %s at %zu\n", where.c_str(), done - carried + *found);
      return done + static_cast<std::size_t>(got);
    }
    carried = std::min(overlap, n);
    std::memmove(buffer.data(), buffer.data() + n - carried, carried);
    done += static_cast<std::size_t>(got);
  }
  return done;
}

/// Every readable memfd mapping of this process (/proc/self/maps), whatever
/// made it.
std::size_t scan_memfd_mappings(secret_bytes const& secret)
{
  std::ifstream maps("/proc/self/maps");
  std::size_t scanned = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:") == std::string::npos) { continue; }
    unsigned long long start{}, end{};
    char perms[5]{};
    if (std::sscanf(line.c_str(), "%llx-%llx %4s", &start, &end, perms) != 3 || perms[0] != 'r') {
      continue;
    }
    auto const range = line.substr(0, line.find(' '));
    scanned += scan_memory("maps " + range,
                           reinterpret_cast<void const*>(static_cast<std::uintptr_t>(start)),
                           static_cast<std::size_t>(end - start),
                           secret);
  }
  return scanned;
}

/// Every memfd among this process's fds (what the daemon passed and the
/// library kept), mapped whole as the kernel sizes it.
std::size_t scan_memfd_fds(secret_bytes const& secret)
{
  std::size_t scanned = 0;
  std::vector<int> fds;
  for (auto const& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    auto const target = std::filesystem::read_symlink(entry.path(), ec);
    if (!ec && target.string().rfind("/memfd:", 0) == 0) {
      fds.push_back(std::stoi(entry.path().filename().string()));
    }
  }
  for (int fd : fds) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || st.st_size <= 0) { continue; }
    auto const size = static_cast<std::size_t>(st.st_size);
    void* m         = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      std::printf("unreadable fd %d at 0: %s\n", fd, std::strerror(errno));
      continue;
    }
    scanned += scan_memory("fd " + std::to_string(fd), m, size, secret);
    ::munmap(m, size);
  }
  return scanned;
}

int snoop_host(std::size_t bytes)
{
  rmmd::host_memory_resource mr(rmmd::session(rmmd::session::options{.client_name = "snoop"}));
  auto const& s    = mr.get_session();
  auto const pool  = s.host_pool();
  auto* const base = s.host_pool_base(pool.id);
  void* kept       = nullptr;
  if (bytes > 0) {
    kept = mr.allocate_sync(bytes, 256);
    std::memset(kept, 0, bytes);
    auto const offset = mr.offset_of(kept);
    mr.deallocate_sync(kept, bytes, 256);  // the Free's reply is back: the daemon has it
    std::printf("kept %llu\n", static_cast<unsigned long long>(offset));
  } else {
    std::printf("mapped\n");
  }
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    if (line.rfind("scan ", 0) != 0) { continue; }
    auto const secret   = parse_secret(line.substr(5));
    std::size_t scanned = 0;
    if (kept != nullptr) { scanned += scan_memory("kept", kept, bytes, secret); }
    scanned += scan_memory("mapping", base, pool.capacity_bytes, secret);
    scanned += scan_memfd_mappings(secret);
    scanned += scan_memfd_fds(secret);
    {
      rmmd::session fresh(rmmd::session::options{.client_name = "snoop-fresh"});
      auto const& p = fresh.host_pool();
      scanned += scan_memory("fresh", fresh.host_pool_base(p.id), p.capacity_bytes, secret);
    }
    std::printf("scanned %zu\n", scanned);
    std::fflush(stdout);
  }
  return 0;
}

int secret_host(std::size_t bytes, std::string const& hex)
{
  auto const secret = parse_secret(hex);
  rmmd::host_memory_resource mr(rmmd::session(rmmd::session::options{.client_name = "secret"}));
  std::size_t count = 0, total = 0;
  auto take = [&](std::size_t size) {
    try {
      rmmd::test::fill_secret(mr.allocate_sync(size, 256), size, secret);
    } catch (rmm::out_of_memory const&) {
      return false;
    }
    ++count;
    total += size;
    return true;
  };
  take(bytes);  // first, where a freed allocation of that size was
  for (std::size_t size : {std::size_t{1} << 20, std::size_t{64} << 10, std::size_t{4096}}) {
    while (take(size)) {}
  }
  std::printf("holding %zu %zu\n", count, total);
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {}
  return 0;
}

int snoop_device(std::size_t bytes, std::size_t span)
{
  rmmd::session s(rmmd::session::options{.client_name = "snoop-device"});
  auto const& pool = s.device_pool(0);
  if (cudaSetDevice(pool.device) != cudaSuccess) { return 4; }
  auto const lease = s.allocate(pool.id, bytes, 256);
  cudaMemPoolPtrExportData data{};
  std::memcpy(&data, lease.cuda_export.data(), sizeof(data));
  void* kept = nullptr;
  if (auto err = cudaMemPoolImportPointer(&kept, s.cuda_pool(pool.id), &data); err != cudaSuccess) {
    std::printf("error: cudaMemPoolImportPointer: %s\n", cudaGetErrorName(err));
    return 4;
  }
  if (cudaMemset(kept, 0, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
    return 4;
  }
  s.free(lease.id);  // answered: the daemon has freed it; the import stays
  std::printf("kept\n");
  std::fflush(stdout);
  constexpr std::size_t step = std::size_t{64} << 10;
  std::vector<unsigned char> host(std::max(bytes, step));
  for (std::string line; std::getline(std::cin, line);) {
    if (line.rfind("scan ", 0) != 0) { continue; }
    auto const secret   = parse_secret(line.substr(5));
    std::size_t scanned = 0;
    auto read           = [&](char const* where, std::size_t offset, std::size_t n) {
      auto const* from = static_cast<unsigned char const*>(kept) + offset;
      if (auto err = cudaMemcpy(host.data(), from, n, cudaMemcpyDeviceToHost); err != cudaSuccess) {
        cudaGetLastError();
        std::printf("read-error %s at %zu: %s\n", where, offset, cudaGetErrorName(err));
        return false;
      }
      scanned += n;
      if (auto found = find_secret(host.data(), n, secret)) {
        std::printf("found %s at %zu\n", where, offset + *found);
      }
      return true;
    };
    if (read("kept", 0, bytes)) {
      for (std::size_t offset = bytes; offset < bytes + span; offset += step) {
        if (!read("past", offset, step)) { break; }
      }
    }
    std::printf("scanned %zu\n", scanned);
    std::fflush(stdout);
  }
  return 0;
}

int secret_device(std::string_view mode, std::size_t bytes, int count, std::string const& hex)
{
  auto const secret = parse_secret(hex);
  rmmd::ipc_memory_resource mr(
      rmmd::session(rmmd::session::options{.client_name = "secret-device"}),
      0,
      rmmd::ipc_resource_options{.mode = mode == "slab" ? rmmd::allocation_mode::slab
                                                        : rmmd::allocation_mode::direct});
  cuda::stream_ref stream{cudaStream_t{}};
  std::vector<unsigned char> pattern(bytes);
  rmmd::test::fill_secret(pattern.data(), bytes, secret);
  std::vector<void*> held;
  for (int i = 0; i < count; ++i) {
    void* p = nullptr;
    try {
      p = mr.allocate(stream, bytes, 256);
    } catch (rmm::out_of_memory const&) {
      break;
    }
    if (cudaMemcpy(p, pattern.data(), bytes, cudaMemcpyHostToDevice) != cudaSuccess) { return 4; }
    held.push_back(p);
  }
  if (cudaDeviceSynchronize() != cudaSuccess) { return 4; }
  std::printf("holding %zu %zu\n", held.size(), held.size() * bytes);
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {}
  for (void* p : held) { mr.deallocate(stream, p, bytes, 256); }
  stream.sync();
  return 0;
}

}  // namespace

int main(int argc, char** argv)
{
  try {
    if (argc == 5 && std::strcmp(argv[1], "hold") == 0) {
      return hold(std::stoull(argv[2]), std::stoull(argv[3]), std::stoi(argv[4]));
    }
    if (argc == 4 && std::strcmp(argv[1], "device-hold") == 0) {
      return device_hold(std::stoull(argv[2]), std::stoi(argv[3]), rmmd::allocation_mode::direct);
    }
    if (argc == 4 && std::strcmp(argv[1], "slab-hold") == 0) {
      return device_hold(std::stoull(argv[2]), std::stoi(argv[3]), rmmd::allocation_mode::slab);
    }
    if (argc == 4 && std::strcmp(argv[1], "slab-fill") == 0) {
      return slab_fill(std::stoi(argv[2]), std::stoull(argv[3]));
    }
    if (argc >= 2 && std::strcmp(argv[1], "verify") == 0) { return verify(argc - 2, argv + 2); }
    if (argc == 4 && std::strcmp(argv[1], "idle-slabs") == 0) {
      return idle_slabs(std::stoi(argv[2]), std::stoull(argv[3]));
    }
    if (argc == 3 && std::strcmp(argv[1], "allocate") == 0) {
      return allocate_once(std::stoull(argv[2]));
    }
    if (argc >= 2 && std::strcmp(argv[1], "write") == 0) {
      return write_patterns(argc - 2, argv + 2);
    }
    if (argc == 2 && std::strcmp(argv[1], "device-identity") == 0) { return device_identity(); }
    if (argc == 4 && std::strcmp(argv[1], "device-churn") == 0) {
      return device_churn(std::stoi(argv[2]), std::stoull(argv[3]));
    }
    if (argc == 3 && std::strcmp(argv[1], "device-free-pending") == 0) {
      return device_free_pending(std::stoull(argv[2]));
    }
    if (argc == 3 && std::strcmp(argv[1], "snoop-host") == 0) {
      return snoop_host(std::stoull(argv[2]));
    }
    if (argc == 4 && std::strcmp(argv[1], "secret-host") == 0) {
      return secret_host(std::stoull(argv[2]), argv[3]);
    }
    if (argc == 4 && std::strcmp(argv[1], "snoop-device") == 0) {
      return snoop_device(std::stoull(argv[2]), std::stoull(argv[3]));
    }
    if (argc == 6 && std::strcmp(argv[1], "secret-device") == 0) {
      return secret_device(argv[2], std::stoull(argv[3]), std::stoi(argv[4]), argv[5]);
    }
    if (argc == 3 && std::strcmp(argv[1], "exit-with-static") == 0) {
      return exit_with_static(argv[2]);
    }
  } catch (std::exception const& e) {
    std::printf("error: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr,
               "usage: rmmd_test_client hold BYTES SEED COUNT | device-hold BYTES VALUE | "
               "slab-hold BYTES VALUE | slab-fill COUNT BYTES | write "
               "OFFSET:BYTES:SEED... | verify OFFSET:BYTES:SEED... | device-free-pending BYTES | "
               "device-identity | device-churn COUNT BYTES | exit-with-static KIND | idle-slabs "
               "COUNT BYTES | allocate BYTES | snoop-host BYTES | secret-host BYTES HEX | "
               "snoop-device BYTES SPAN | secret-device MODE BYTES COUNT HEX\n");
  return 2;
}
