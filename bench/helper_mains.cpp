// The dispatch table of rmmd_bench's helper processes: each entry's main
// reads its arguments and calls the helper in its section's file.

#include "bench/helper_mains.hpp"

#include "bench/section_g.hpp"
#include "bench/section_h.hpp"
#include "bench/section_l.hpp"
#include "bench/section_r.hpp"
#include "bench/section_t.hpp"
#include "bench/sections.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <optional>

namespace rmmd::bench {
namespace {

int usage(char** argv)
{
  auto const* h = find_helper(argv[1]);
  std::fprintf(stderr,
               "rmmd_bench %s: internal mode; usage: rmmd_bench %s %s\n",
               argv[1],
               argv[1],
               h != nullptr ? std::string(h->usage).c_str() : "");
  return 2;
}

/// A positive decimal count; nullopt if `text` is anything else.
std::optional<std::size_t> count_arg(char const* text)
{
  char* end = nullptr;
  auto n    = std::strtoull(text, &end, 10);
  if (*end != '\0' || n == 0) { return std::nullopt; }
  return n;
}

int exporter(int, char**)
{
  return exporter_main();
}

int context_rss(int, char**)
{
  return context_rss_main();
}

int gpu_slug_main(int, char**)
{
  std::string why;
  if (visible_gpus(why) == 0) {
    std::fprintf(stderr, "rmmd_bench: no CUDA GPU here (%s)\n", why.c_str());
    return 2;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) { return 2; }
  std::printf("%s\n", gpu_slug(prop.name).c_str());
  return 0;
}

int raw_leases(int argc, char** argv)
{
  std::string const kind = argc == 6 ? argv[3] : "";
  auto count             = argc == 6 ? count_arg(argv[4]) : std::nullopt;
  auto bytes             = argc == 6 ? count_arg(argv[5]) : std::nullopt;
  if ((kind != "host" && kind != "cuda") || !count || bytes != scale_lease_bytes) {
    return usage(argv);
  }
  return raw_leases_main(argv[2], kind, *count);
}

int raw_sessions(int argc, char** argv)
{
  auto count = argc == 5 ? count_arg(argv[3]) : std::nullopt;
  auto bytes = argc == 5 ? count_arg(argv[4]) : std::nullopt;
  if (!count || bytes != scale_lease_bytes) { return usage(argv); }
  return raw_sessions_main(argv[2], *count);
}

int tenant_sessions(int argc, char** argv)
{
  auto count = argc == 4 ? count_arg(argv[3]) : std::nullopt;
  if (!count) { return usage(argv); }
  return tenant_sessions_main(argv[2], *count);
}

int tenant_idle(int argc, char** argv)
{
  std::string const backend = argc == 6 ? argv[3] : "";
  auto count                = argc == 6 ? count_arg(argv[4]) : std::nullopt;
  auto bytes                = argc == 6 ? count_arg(argv[5]) : std::nullopt;
  if ((backend != "host" && backend != "cuda") || !count || !bytes) { return usage(argv); }
  return tenant_idle_main(argv[2], backend, *count, *bytes);
}

int mobility_worker(int argc, char** argv)
{
  auto bytes = argc == 3 ? count_arg(argv[2]) : std::nullopt;
  if (!bytes) { return usage(argv); }
  return mobility_worker_main(*bytes);
}

int worker(int argc, char** argv)
{
  if (argc != 5 && argc != 6) { return usage(argv); }
  auto m = parse_kind(argv[2]);
  char* end1;
  char* end2;
  char* end3   = nullptr;
  auto bytes   = std::strtoull(argv[3], &end1, 10);
  auto seconds = std::strtod(argv[4], &end2);
  auto device  = argc == 6 ? std::strtol(argv[5], &end3, 10) : 0;
  if (!m || *end1 != '\0' || *end2 != '\0' || (end3 != nullptr && *end3 != '\0') || bytes == 0 ||
      seconds <= 0 || device < 0) {
    return usage(argv);
  }
  return worker_main(*m, bytes, seconds, static_cast<int>(device));
}

int holder(int argc, char** argv)
{
  if (argc != 4) { return usage(argv); }
  auto m     = parse_kind(argv[2]);
  auto bytes = count_arg(argv[3]);
  if (!m || !bytes) { return usage(argv); }
  return holder_main(m->mode, *bytes);
}

int share_producer(int argc, char** argv)
{
  auto bytes = argc == 4 ? count_arg(argv[3]) : std::nullopt;
  if (!bytes) { return usage(argv); }
  return share_producer_main(argv[2], *bytes);
}

int ipc_producer(int argc, char** argv)
{
  auto bytes = argc == 3 ? count_arg(argv[2]) : std::nullopt;
  if (!bytes) { return usage(argv); }
  return ipc_producer_main(*bytes);
}

int share_consumer(int argc, char** argv)
{
  if (argc != 8) { return usage(argv); }
  auto method = parse_method(argv[2]);
  char *e1, *e2, *e3, *e4;
  auto bytes   = std::strtoull(argv[3], &e1, 10);
  auto reps    = std::strtoull(argv[4], &e2, 10);
  auto warmup  = std::strtoull(argv[5], &e3, 10);
  auto seconds = std::strtod(argv[6], &e4);
  if (!method || *e1 != '\0' || *e2 != '\0' || *e3 != '\0' || *e4 != '\0' || bytes == 0 ||
      reps == 0 || seconds <= 0) {
    return usage(argv);
  }
  return share_consumer_main(*method, bytes, reps, warmup, seconds, argv[7]);
}

int restart_publisher(int argc, char** argv)
{
  auto count = argc == 6 ? count_arg(argv[4]) : std::nullopt;
  auto bytes = argc == 6 ? count_arg(argv[5]) : std::nullopt;
  if (!count || !bytes) { return usage(argv); }
  return restart_publisher_main(argv[2], argv[3], *count, *bytes);
}

int restart_opener(int argc, char** argv)
{
  auto count = argc == 4 ? count_arg(argv[3]) : std::nullopt;
  if (!count) { return usage(argv); }
  return restart_opener_main(argv[2], *count);
}

int lease_waiter(int argc, char** argv)
{
  if (argc != 4) { return usage(argv); }
  return lease_waiter_main(argv[2], argv[3]);
}

constexpr std::array<helper_entry, 16> table{{
    {"--exporter", "(socket on fd 3)", exporter},
    {"--raw-leases", "RUNTIME_DIR host|cuda COUNT 256", raw_leases},
    {"--raw-sessions", "RUNTIME_DIR COUNT 256", raw_sessions},
    {"--context-rss", "", context_rss},
    {"--gpu-slug", "", gpu_slug_main},
    {"--mobility-worker", "SLAB_BYTES", mobility_worker},
    {"--worker", "fast|direct|direct-grpc BYTES SECONDS [DEVICE]", worker},
    {"--share-producer", "NAME BYTES", share_producer},
    {"--ipc-producer", "BYTES", ipc_producer},
    {"--share-consumer",
     "rmmd|rmmd_grpc|cuda_ipc|host_copy BYTES REPS WARMUP SECONDS ARG",
     share_consumer},
    {"--holder", "fast|direct BYTES", holder},
    {"--tenant-sessions", "RUNTIME_DIR COUNT", tenant_sessions},
    {"--tenant-idle", "RUNTIME_DIR host|cuda COUNT BYTES", tenant_idle},
    {"--restart-publisher", "RUNTIME_DIR POOL COUNT BYTES", restart_publisher},
    {"--restart-opener", "RUNTIME_DIR COUNT", restart_opener},
    {"--lease-waiter", "RUNTIME_DIR NAME", lease_waiter},
}};

}  // namespace

helper_entry const* find_helper(std::string_view name)
{
  for (auto const& h : table) {
    if (h.name == name) { return &h; }
  }
  return nullptr;
}

int run_helper(int argc, char** argv)
{
  if (argc < 2) { return -1; }
  auto const* h = find_helper(argv[1]);
  return h != nullptr ? h->main(argc, argv) : -1;
}

}  // namespace rmmd::bench
