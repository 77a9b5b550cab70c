// One client of the kill -9 soak (rmmd_soak starts many, and SIGKILLs some of
// them at random moments).
//
//   rmmd_soak_client MODE SEED LIFETIME_MS MAX_BYTES ENDING
//
// Opens a session at $RMMD_RUNTIME_DIR and a resource of MODE:
//   host         rmmd::host_memory_resource (allocate_sync / deallocate_sync)
//   pinned       rmmd::pinned_host_memory_resource on a stream of its own
//   cuda-direct  rmmd::ipc_memory_resource, allocation_mode::direct, GPU 0
//   cuda-slab    rmmd::ipc_memory_resource, allocation_mode::slab, GPU 0, with
//                small slabs and a short idle trim (chosen from SEED), so that
//                slabs come and go while it runs
// then, for LIFETIME_MS, allocates buffers of random sizes (log-uniform in
// [64, MAX_BYTES]) and alignments, writes each one's pattern (the host writes
// host pools; the GPU writes device memory and the pinned pool), and frees
// random ones after checking their pattern. Then it prints "done OPS ALLOCS"
// and ends as ENDING says:
//   free   frees every buffer it still holds, checking each, and returns
//   leave  returns holding them (the resource's destructor frees them)
//   exit   _exit(0) holding them (the daemon reclaims them when the session's
//          socket closes)
// A buffer that lost its pattern: "corrupted ..." and exit status 1. An
// exception: "error: ..." and status 3. Bad arguments: status 2.

#include "tests/tools/pattern.hpp"

#include <rmmd/host_memory_resource.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/pinned_host_memory_resource.hpp>
#include <rmmd/session.hpp>

#include <rmm/error.hpp>

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

using steady = std::chrono::steady_clock;

/// A buffer this client holds, and the seed of the pattern it must hold.
struct buffer {
  void* ptr{};
  std::size_t bytes{};
  std::size_t alignment{};
  std::uint64_t seed{};
};

[[noreturn]] void cuda_failed(char const* what, cudaError_t err)
{
  throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err));
}

void cuda_check(cudaError_t err, char const* what)
{
  if (err != cudaSuccess) { cuda_failed(what, err); }
}

/// What the soak does with one kind of resource: allocate, write the pattern,
/// check it, free.
class client_memory {
 public:
  client_memory()                                = default;
  client_memory(client_memory const&)            = delete;
  client_memory& operator=(client_memory const&) = delete;
  virtual ~client_memory()                       = default;

  virtual void* allocate(std::size_t bytes, std::size_t alignment)             = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, std::size_t alignment) = 0;
  virtual void write(buffer const& b)                                          = 0;
  /// True if `b` holds its pattern.
  virtual bool check(buffer const& b) = 0;
  /// Largest alignment to ask for.
  [[nodiscard]] virtual std::size_t max_alignment() const = 0;
};

/// The shared host pool, written and read by this process.
class host_memory final : public client_memory {
 public:
  explicit host_memory(rmmd::session const& s) : mr_(s) {}

  void* allocate(std::size_t bytes, std::size_t alignment) override
  {
    return mr_.allocate_sync(bytes, alignment);
  }
  void deallocate(void* ptr, std::size_t bytes, std::size_t alignment) override
  {
    mr_.deallocate_sync(ptr, bytes, alignment);
  }
  void write(buffer const& b) override
  {
    rmmd::test::fill(b.ptr, b.bytes, b.seed);
  }
  bool check(buffer const& b) override
  {
    return rmmd::test::first_mismatch(b.ptr, b.bytes, b.seed) < 0;
  }
  [[nodiscard]] std::size_t max_alignment() const override
  {
    return std::min<std::size_t>(mr_.get_session().host_pool().max_alignment, 4096);
  }

 private:
  rmmd::host_memory_resource mr_;
};

/// A byte per buffer (cudaMemsetAsync writes it on the GPU): the seed's low byte.
unsigned char byte_of(std::uint64_t seed)
{
  return static_cast<unsigned char>(seed * 0x9E3779B97F4A7C15ULL >> 56);
}

/// What the GPU writes and this process checks: the pinned host pool, or
/// device memory of a CUDA pool, on a stream of the client's own.
template <typename Resource>
class gpu_memory final : public client_memory {
 public:
  gpu_memory(Resource mr, bool host_readable) : mr_(std::move(mr)), host_readable_(host_readable)
  {
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~gpu_memory() override
  {
    // The resource may free what is still held on another stream: let the
    // writes queued here finish first, as a well-behaved program does.
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }

  void* allocate(std::size_t bytes, std::size_t alignment) override
  {
    return mr_.allocate(cuda::stream_ref{stream_}, bytes, alignment);
  }
  void deallocate(void* ptr, std::size_t bytes, std::size_t alignment) override
  {
    mr_.deallocate(cuda::stream_ref{stream_}, ptr, bytes, alignment);
  }
  void write(buffer const& b) override
  {
    cuda_check(cudaMemsetAsync(b.ptr, byte_of(b.seed), b.bytes, stream_), "cudaMemsetAsync");
  }
  bool check(buffer const& b) override
  {
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    auto const* bytes = static_cast<unsigned char const*>(b.ptr);
    if (!host_readable_) {
      staging_.resize(b.bytes);
      cuda_check(cudaMemcpy(staging_.data(), b.ptr, b.bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
      bytes = staging_.data();
    }
    auto const want = byte_of(b.seed);
    return std::all_of(bytes, bytes + b.bytes, [want](unsigned char c) { return c == want; });
  }
  [[nodiscard]] std::size_t max_alignment() const override
  {
    return 256;  // what CUDA pools guarantee
  }

 private:
  Resource mr_;
  bool host_readable_;
  cudaStream_t stream_{};
  std::vector<unsigned char> staging_;
};

std::unique_ptr<client_memory> open_memory(std::string_view mode,
                                           rmmd::session const& s,
                                           std::mt19937_64& rng)
{
  if (mode == "host") { return std::make_unique<host_memory>(s); }
  if (mode == "pinned") {
    return std::make_unique<gpu_memory<rmmd::pinned_host_memory_resource>>(
        rmmd::pinned_host_memory_resource(s), true);
  }
  if (mode == "cuda-direct") {
    return std::make_unique<gpu_memory<rmmd::ipc_memory_resource>>(
        rmmd::ipc_memory_resource(
            s, 0, rmmd::ipc_resource_options{.mode = rmmd::allocation_mode::direct}),
        false);
  }
  if (mode == "cuda-slab") {
    std::size_t const slab_mib[] = {1, 4, 16};
    auto const slab  = slab_mib[std::uniform_int_distribution<std::size_t>(0, 2)(rng)] << 20;
    auto const trim  = std::chrono::milliseconds(std::uniform_int_distribution<int>(20, 200)(rng));
    auto const slabs = rmmd::ipc_resource_options{
        .mode = rmmd::allocation_mode::slab, .slab_bytes = slab, .idle_trim = trim};
    return std::make_unique<gpu_memory<rmmd::ipc_memory_resource>>(
        rmmd::ipc_memory_resource(s, 0, slabs), false);
  }
  return nullptr;
}

int run(std::string_view mode,
        std::uint64_t seed,
        std::chrono::milliseconds lifetime,
        std::size_t max_bytes,
        std::string_view ending)
{
  std::mt19937_64 rng(seed);
  rmmd::session s(rmmd::session::options{.client_name = "soak-" + std::string(mode)});
  auto memory = open_memory(mode, s, rng);
  if (!memory) {
    std::printf("unknown mode %s\n", std::string(mode).c_str());
    return 2;
  }

  constexpr std::size_t max_held = 16;
  std::vector<buffer> held;
  std::uint64_t ops = 0, allocations = 0, next_seed = seed * 1000;
  auto const log_max = std::log2(static_cast<double>(std::max<std::size_t>(max_bytes, 64)));
  std::uniform_real_distribution<double> log_size(6.0, log_max);
  auto const log_align = static_cast<int>(std::log2(static_cast<double>(memory->max_alignment())));
  std::uniform_int_distribution<int> align_bits(3, std::max(3, log_align));

  auto corrupted = [&](buffer const& b) {
    std::printf("corrupted buffer of %zu bytes (seed %llu) at %p\n",
                b.bytes,
                static_cast<unsigned long long>(b.seed),
                b.ptr);
    std::fflush(stdout);
    return 1;
  };
  auto const end = steady::now() + lifetime;
  while (steady::now() < end) {
    ++ops;
    bool const allocate =
        held.empty() || (held.size() < max_held && std::bernoulli_distribution(0.55)(rng));
    if (allocate) {
      buffer b{.bytes     = static_cast<std::size_t>(std::exp2(log_size(rng))),
               .alignment = std::size_t{1} << align_bits(rng),
               .seed      = ++next_seed};
      b.ptr = memory->allocate(b.bytes, b.alignment);
      ++allocations;
      memory->write(b);
      held.push_back(b);
      continue;
    }
    auto const i = std::uniform_int_distribution<std::size_t>(0, held.size() - 1)(rng);
    auto const b = held[i];
    if (!memory->check(b)) { return corrupted(b); }
    memory->deallocate(b.ptr, b.bytes, b.alignment);
    held[i] = held.back();
    held.pop_back();
  }

  std::printf("done %llu %llu\n",
              static_cast<unsigned long long>(ops),
              static_cast<unsigned long long>(allocations));
  std::fflush(stdout);
  if (ending == "exit") { ::_exit(0); }
  if (ending == "free") {
    for (auto const& b : held) {
      if (!memory->check(b)) { return corrupted(b); }
      memory->deallocate(b.ptr, b.bytes, b.alignment);
    }
  }
  return 0;  // "leave": the resource frees what is left as it goes
}

}  // namespace

int main(int argc, char** argv)
{
  if (argc != 6) {
    std::fprintf(stderr,
                 "usage: rmmd_soak_client host|pinned|cuda-direct|cuda-slab SEED LIFETIME_MS "
                 "MAX_BYTES free|leave|exit\n");
    return 2;
  }
  std::string_view const ending = argv[5];
  if (ending != "free" && ending != "leave" && ending != "exit") {
    std::fprintf(stderr, "rmmd_soak_client: unknown ending %s\n", argv[5]);
    return 2;
  }
  try {
    return run(argv[1],
               std::stoull(argv[2]),
               std::chrono::milliseconds(std::stoll(argv[3])),
               std::stoull(argv[4]),
               ending);
  } catch (std::exception const& e) {
    std::printf("error: %s\n", e.what());
    return 3;
  }
}
