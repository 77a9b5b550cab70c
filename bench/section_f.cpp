// Section f: named shared buffers. A producer process creates and writes one
// buffer; consumer processes time the cycle every consumer's start-up pays:
// open it (to a pointer they can use), read from it, close it. Against the
// same consumers without rmmd: legacy CUDA IPC of the producer's cudaMalloc
// buffer, and a copy of the bytes from a pinned host copy into an allocation
// of their own. The producers and consumers are helper processes
// ("--share-producer", "--ipc-producer", "--share-consumer").

#include "bench/sections.hpp"
#include "bench/targets.hpp"

#include "common/hex.hpp"

#include <rmmd/shared_buffer.hpp>

#include <cuda/stream>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <tuple>

namespace rmmd::bench {
namespace {

constexpr unsigned char share_fill = 0x5a;  // what the producers write
constexpr std::uint64_t share_word = 0x5a5a5a5a5a5a5a5aULL;

bool from_hex(std::string const& text, void* out, std::size_t n)
{
  if (text.size() != 2 * n) { return false; }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') { return c - '0'; }
    if (c >= 'a' && c <= 'f') { return c - 'a' + 10; }
    return -1;
  };
  for (std::size_t i = 0; i < n; ++i) {
    int const hi = nibble(text[2 * i]), lo = nibble(text[2 * i + 1]);
    if (hi < 0 || lo < 0) { return false; }
    static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

}  // namespace

std::string method_name(share_method m)
{
  switch (m) {
    case share_method::rmmd:
      return "rmmd";
    case share_method::rmmd_grpc:
      return "rmmd_grpc";
    case share_method::cuda_ipc:
      return "cuda_ipc";
    case share_method::host_copy:
      return "host_copy";
  }
  return "?";
}

std::optional<share_method> parse_method(std::string const& s)
{
  for (auto m : {share_method::rmmd,
                 share_method::rmmd_grpc,
                 share_method::cuda_ipc,
                 share_method::host_copy}) {
    if (s == method_name(m)) { return m; }
  }
  return std::nullopt;
}

/// Section f's rmmd producer: creates NAME (BYTES) in GPU 0's pool, writes it
/// (cudaMemsetAsync) and publishes it on its stream; says "ready CREATE_NS
/// WRITE_AND_PUBLISH_NS" once the daemon has it published, closes it when
/// its stdin closes.
int share_producer_main(std::string const& name, std::size_t bytes)
{
  die_with_parent();
  try {
    BENCH_CUDA(cudaSetDevice(0));
    BENCH_CUDA(cudaFree(nullptr));
    auto s = open_session("rmmd-bench-share-producer");
    stream_holder stream;
    auto const t0 = steady::now();
    auto buffer   = rmmd::shared_buffer::create(s, name, bytes, {.device = 0});
    auto const t1 = steady::now();
    BENCH_CUDA(cudaMemsetAsync(buffer.data(), share_fill, bytes, stream.get()));
    buffer.publish(cuda::stream_ref{stream.get()});
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    // A host function sent the publication without waiting for a reply; the
    // daemon answers a session's calls in order, so this round trip's answer
    // comes after the publication is done.
    (void)rmmd::admin(s).ping();
    auto const t2 = steady::now();
    say(format("ready %.0f %.0f", ns_between(t0, t1), ns_between(t1, t2)));
    wait_for_stdin_eof();
    buffer.close(cuda::stream_ref{stream.get()});
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

/// Section f's legacy producer: cudaMalloc BYTES, write them, export the
/// buffer with cudaIpcGetMemHandle; says "ready HANDLE_HEX", frees it when
/// its stdin closes.
int ipc_producer_main(std::size_t bytes)
{
  die_with_parent();
  try {
    BENCH_CUDA(cudaSetDevice(0));
    void* p = nullptr;
    BENCH_CUDA(cudaMalloc(&p, bytes));
    BENCH_CUDA(cudaMemset(p, share_fill, bytes));
    BENCH_CUDA(cudaDeviceSynchronize());
    cudaIpcMemHandle_t handle{};
    BENCH_CUDA(cudaIpcGetMemHandle(&handle, p));
    say("ready " + common::to_hex(std::as_bytes(std::span{&handle, 1})));
    wait_for_stdin_eof();
    cudaFree(p);
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

namespace {

std::string ns_list(std::vector<double> const& ns)
{
  std::string out;
  for (double v : ns) { out += format(" %.0f", v); }
  return out;
}

/// What a consumer has before its first cycle: a stream, and per method a
/// session (rmmd), the producer's handle (cuda_ipc), or a pinned host copy
/// and an allocation of its own (host_copy), freed with it.
struct consumer_setup {
  stream_holder stream;
  std::optional<rmmd::session> session;
  cudaIpcMemHandle_t handle{};
  void* pinned{nullptr};
  void* own{nullptr};

  consumer_setup()                                 = default;
  consumer_setup(consumer_setup const&)            = delete;
  consumer_setup& operator=(consumer_setup const&) = delete;
  ~consumer_setup()
  {
    if (own != nullptr) { cudaFree(own); }
    if (pinned != nullptr) { cudaFreeHost(pinned); }
  }
};

void set_up_consumer(consumer_setup& c,
                     share_method method,
                     std::size_t bytes,
                     std::string const& arg)
{
  switch (method) {
    case share_method::rmmd:
    case share_method::rmmd_grpc:
      c.session.emplace(open_session("rmmd-bench-share-consumer",
                                     method == share_method::rmmd_grpc
                                         ? call_transport::grpc
                                         : call_transport::session_socket));
      break;
    case share_method::cuda_ipc:
      if (!from_hex(arg, &c.handle, sizeof(c.handle))) {
        throw bench_error("not a cudaIpcMemHandle_t in hex: " + arg);
      }
      break;
    case share_method::host_copy:
      BENCH_CUDA(cudaMallocHost(&c.pinned, bytes));
      std::memset(c.pinned, share_fill, bytes);
      BENCH_CUDA(cudaMalloc(&c.own, bytes));
      break;
  }
}

/// A consumer's measured cycles.
struct cycle_samples {
  std::vector<double> open_ns, read_ns, close_ns, close_sync_ns;
  double first_ns{};
  std::size_t measured{};
};

cycle_samples run_cycles(consumer_setup& c,
                         share_method method,
                         std::size_t bytes,
                         std::size_t reps,
                         std::size_t warmup,
                         double seconds,
                         std::string const& arg)
{
  auto& stream       = c.stream;
  auto* own          = c.own;
  auto* pinned       = c.pinned;
  auto const& handle = c.handle;
  auto& session      = c.session;
  std::uint64_t word = 0;
  auto read_word     = [&](void const* p) {
    word = 0;
    BENCH_CUDA(cudaMemcpyAsync(&word, p, sizeof(word), cudaMemcpyDeviceToHost, stream.get()));
    BENCH_CUDA(cudaStreamSynchronize(stream.get()));
    if (word != share_word) {
      throw bench_error(format("read %016llx, not what the producer wrote",
                               static_cast<unsigned long long>(word)));
    }
  };
  cycle_samples out;
  auto const total = (method == share_method::host_copy ? 1 : warmup) + reps;
  auto const stop  = steady::now() + std::chrono::duration_cast<steady::duration>(
                                        std::chrono::duration<double>(seconds));
  for (std::size_t i = 0; i < total; ++i) {
    steady::time_point t0, t1, t2, t3, t4, t5;
    if (method == share_method::host_copy) {
      t0 = steady::now();
      BENCH_CUDA(cudaMemcpyAsync(own, pinned, bytes, cudaMemcpyHostToDevice, stream.get()));
      BENCH_CUDA(cudaStreamSynchronize(stream.get()));
      t1 = steady::now();
      read_word(own);
      t2 = t3 = t4 = t5 = steady::now();
    } else if (method == share_method::cuda_ipc) {
      void* p = nullptr;
      t0      = steady::now();
      BENCH_CUDA(cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess));
      t1 = steady::now();
      read_word(p);
      t2 = t3 = steady::now();
      BENCH_CUDA(cudaIpcCloseMemHandle(p));
      t4 = t5 = steady::now();
    } else {
      t0          = steady::now();
      auto buffer = rmmd::shared_buffer::open(*session, arg);
      t1          = steady::now();
      read_word(buffer.data());
      t2 = t3 = steady::now();
      buffer.close(cuda::stream_ref{stream.get()});
      t4 = steady::now();
      BENCH_CUDA(cudaStreamSynchronize(stream.get()));
      t5 = steady::now();
    }
    if (i == 0) { out.first_ns = ns_between(t0, t1); }
    if (i + reps >= total) {
      out.open_ns.push_back(ns_between(t0, t1));
      out.read_ns.push_back(ns_between(t0, t2));
      out.close_ns.push_back(ns_between(t3, t4));
      out.close_sync_ns.push_back(ns_between(t3, t5));
      ++out.measured;
    }
    if (out.measured > 0 && steady::now() >= stop) { break; }
  }
  return out;
}

}  // namespace

/// Section f's consumer: sets up (CUDA context, stream; a session for rmmd;
/// the pinned host copy and its own allocation for host_copy), says "ready",
/// and on "go" runs WARMUP + REPS cycles (host_copy: 1 + REPS copies), up to
/// SECONDS once one is measured: open, read 8 bytes on its stream and check
/// them, close. Then "samples KIND NS..." for open, open_and_read, close and
/// close_and_sync, "first NS" (the first open), and "done MEASURED".
/// ARG: the buffer's name (rmmd), the handle in hex (cuda_ipc), "-" (host_copy).
int share_consumer_main(share_method method,
                        std::size_t bytes,
                        std::size_t reps,
                        std::size_t warmup,
                        double seconds,
                        std::string const& arg)
{
  die_with_parent();
  try {
    BENCH_CUDA(cudaSetDevice(0));
    BENCH_CUDA(cudaFree(nullptr));
    consumer_setup setup;
    set_up_consumer(setup, method, bytes, arg);
    say("ready");
    if (!wait_for_stdin_line(std::chrono::milliseconds(180'000))) { return 3; }
    auto const got = run_cycles(setup, method, bytes, reps, warmup, seconds, arg);
    say("samples open" + ns_list(got.open_ns));
    say("samples open_and_read" + ns_list(got.read_ns));
    say("samples close" + ns_list(got.close_ns));
    say("samples close_and_sync" + ns_list(got.close_sync_ns));
    say(format("first %.0f", got.first_ns));
    say(format("done %zu", got.measured));
    return 0;
  } catch (std::exception const& e) {
    return helper_failed(e);
  }
}

namespace {

/// What N consumers of one method measured, all together.
struct share_samples {
  std::map<std::string, std::vector<double>> ns;  // by KIND of the samples lines
  std::vector<double> first_ns;
  std::size_t measured{};
  std::size_t asked{};  // reps per consumer x consumers
};

share_samples run_share_consumers(config const& cfg,
                                  share_method method,
                                  std::size_t bytes,
                                  int consumers,
                                  std::string const& arg,
                                  std::vector<std::string> const& env)
{
  auto const reps     = method == share_method::host_copy ? cfg.share_copy_reps : cfg.share_reps;
  auto const budget_s = static_cast<double>(cfg.cell_budget.count());
  std::vector<std::unique_ptr<child_process>> procs;
  for (int i = 0; i < consumers; ++i) {
    procs.push_back(
        std::make_unique<child_process>(std::vector<std::string>{self_path(),
                                                                 "--share-consumer",
                                                                 method_name(method),
                                                                 std::to_string(bytes),
                                                                 std::to_string(reps),
                                                                 std::to_string(cfg.share_warmup),
                                                                 format("%g", budget_s),
                                                                 arg},
                                        env));
  }
  auto who = [](std::size_t i) { return "consumer " + std::to_string(i); };
  // Set-up may pin and fill GiBs of host memory (host_copy).
  auto const ready_by = steady::now() + 180s;
  for (std::size_t i = 0; i < procs.size(); ++i) {
    expect_line(*procs[i], who(i), "ready", ready_by);
  }
  for (auto& p : procs) { p->write_line("go"); }
  share_samples out;
  out.asked          = reps * procs.size();
  auto const done_by = steady::now() + cfg.cell_budget + 120s;
  for (std::size_t i = 0; i < procs.size(); ++i) {
    while (true) {
      auto line = next_protocol_line(*procs[i], who(i), "done", done_by);
      std::istringstream words(line);
      std::string word;
      words >> word;
      if (word == "samples") {
        std::string kind;
        words >> kind;
        double v   = 0;
        auto& list = out.ns[kind];
        while (words >> v) { list.push_back(v); }
      } else if (word == "first") {
        double v = 0;
        words >> v;
        out.first_ns.push_back(v);
      } else if (word == "done") {
        std::size_t n = 0;
        words >> n;
        out.measured += n;
        break;
      } else {
        throw bench_error(who(i) + " (pid " + std::to_string(procs[i]->pid()) + ") said: " + line);
      }
    }
  }
  for (std::size_t i = 0; i < procs.size(); ++i) {
    if (auto rc = procs[i]->finish(30s); rc != 0) {
      throw bench_error(who(i) + " exited with status " + std::to_string(rc));
    }
  }
  return out;
}

void set_latency(results::Latency& l, summary const& s)
{
  l.set_p50_us(s.p50_us);
  l.set_p99_us(s.p99_us);
}

/// Section f's cells as they are measured, and the row of each by method,
/// size and consumer count, for the targets.
class sharing_cells {
 public:
  sharing_cells(config const& cfg, daemon_process& daemon, results::Sharing& out, run_state& st)
      : cfg_(cfg), out_(out), st_(st), env_(self_env())
  {
    env_.push_back("RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string());
  }

  /// Measures one cell (or records `skipped` as its error) and prints its line.
  void measure(share_method method,
               std::size_t bytes,
               int consumers,
               std::string const& arg,
               std::string const& skipped);
  /// rmmd's cells at `bytes` (both transports, every consumer count) against
  /// one rmmd producer.
  void rmmd_cells(std::size_t bytes);
  /// cuda_ipc's cells at `bytes` against one cudaIpcGetMemHandle producer.
  void cuda_ipc_cells(std::size_t bytes);
  /// The targets: rmmd's open (calls on the session socket, the default).
  void judge();

 private:
  std::optional<double> open_p50(share_method m, std::size_t bytes, int n) const;

  config const& cfg_;
  results::Sharing& out_;
  run_state& st_;
  std::vector<std::string> env_;
  std::map<std::tuple<share_method, std::size_t, int>, int> rows_;
};

void sharing_cells::measure(share_method method,
                            std::size_t bytes,
                            int consumers,
                            std::string const& arg,
                            std::string const& skipped)
{
  rows_[{method, bytes, consumers}] = out_.cells_size();
  auto& row                         = *out_.add_cells();
  row.set_method(method_name(method));
  row.set_size_bytes(static_cast<double>(bytes));
  row.set_consumers(u32(static_cast<std::size_t>(consumers)));
  if (!skipped.empty()) {
    row.set_error(skipped);
    return;
  }
  try {
    auto got  = run_share_consumers(cfg_, method, bytes, consumers, arg, env_);
    auto open = summarize(got.ns["open"]), read = summarize(got.ns["open_and_read"]),
         close = summarize(got.ns["close"]), close_sync = summarize(got.ns["close_and_sync"]),
         first = summarize(got.first_ns);
    row.set_reps(u32(got.measured));
    row.set_cut_short_by_budget(got.measured < got.asked);
    set_latency(*row.mutable_open(), open);
    set_latency(*row.mutable_open_and_read(), read);
    bool const opens = method != share_method::host_copy;
    if (opens) {
      set_latency(*row.mutable_close(), close);
      set_latency(*row.mutable_close_and_sync(), close_sync);
      row.set_first_open_p50_us(first.p50_us);
    }
    std::printf("%-10s %5d %7s %6zu %10.1f %10.1f %10.1f %10s %10s %10s%s\n",
                method_name(method).c_str(),
                consumers,
                size_name(bytes).c_str(),
                got.measured,
                open.p50_us,
                open.p99_us,
                read.p50_us,
                opens ? format("%.1f", close.p50_us).c_str() : "-",
                opens ? format("%.1f", close_sync.p50_us).c_str() : "-",
                opens ? format("%.1f", first.p50_us).c_str() : "-",
                got.measured < got.asked ? "  (cut short by the time budget)" : "");
  } catch (std::exception const& e) {
    row.set_error(e.what());
    st_.error(
        "f " + method_name(method) + " " + size_name(bytes) + " x" + std::to_string(consumers),
        e.what());
  }
  std::fflush(stdout);
}

void sharing_cells::rmmd_cells(std::size_t bytes)
{
  auto const name    = format("rmmd-bench/share/%zu", bytes);
  auto& producer_row = *out_.add_producers();
  producer_row.set_size_bytes(static_cast<double>(bytes));
  std::optional<child_process> producer;
  std::string skipped;
  try {
    producer.emplace(
        std::vector<std::string>{self_path(), "--share-producer", name, std::to_string(bytes)},
        env_);
    auto line        = expect_line(*producer, "the rmmd producer", "ready", steady::now() + 120s);
    double create_ns = 0, publish_ns = 0;
    if (std::sscanf(line.c_str(), "ready %lf %lf", &create_ns, &publish_ns) != 2) {
      throw bench_error("the rmmd producer said: " + line);
    }
    producer_row.set_create_ms(create_ns / 1e6);
    producer_row.set_write_and_publish_ms(publish_ns / 1e6);
    std::printf("  rmmd producer, %s: create %.3f ms, write + publish + sync %.3f ms\n",
                size_name(bytes).c_str(),
                create_ns / 1e6,
                publish_ns / 1e6);
  } catch (std::exception const& e) {
    producer_row.set_error(e.what());
    st_.error("f rmmd producer " + size_name(bytes), e.what());
    skipped = "no rmmd producer: " + std::string(e.what());
  }
  for (int n : cfg_.share_consumers) {
    for (auto m : {share_method::rmmd, share_method::rmmd_grpc}) {
      measure(m, bytes, n, name, skipped);
    }
  }
  if (producer) {
    producer->close_stdin();
    if (auto rc = producer->finish(30s); rc != 0) {
      st_.error("f rmmd producer " + size_name(bytes), "exited with status " + std::to_string(rc));
    }
  }
}

void sharing_cells::cuda_ipc_cells(std::size_t bytes)
{
  std::optional<child_process> producer;
  std::string handle, skipped;
  try {
    producer.emplace(std::vector<std::string>{self_path(), "--ipc-producer", std::to_string(bytes)},
                     env_);
    auto line = expect_line(*producer, "the CUDA IPC producer", "ready ", steady::now() + 120s);
    handle    = line.substr(6);
  } catch (std::exception const& e) {
    st_.error("f cuda_ipc producer " + size_name(bytes), e.what());
    skipped = "no CUDA IPC producer: " + std::string(e.what());
  }
  for (int n : cfg_.share_consumers) { measure(share_method::cuda_ipc, bytes, n, handle, skipped); }
  if (producer) {
    producer->close_stdin();
    producer->finish(30s);
  }
}

std::optional<double> sharing_cells::open_p50(share_method m, std::size_t bytes, int n) const
{
  auto it = rows_.find({m, bytes, n});
  if (it == rows_.end()) { return std::nullopt; }
  auto const& row = out_.cells(it->second);
  if (row.has_error() || !row.open().has_p50_us()) { return std::nullopt; }
  return row.open().p50_us();
}

void sharing_cells::judge()
{
  auto const largest = *std::max_element(cfg_.share_sizes.begin(), cfg_.share_sizes.end());
  for (auto bytes : cfg_.share_sizes) {
    for (int n : cfg_.share_consumers) {
      auto const open = open_p50(share_method::rmmd, bytes, n);
      if (!open) { continue; }
      auto& row = *out_.mutable_cells(rows_.at({share_method::rmmd, bytes, n}));
      target_row t{format("rmmd open p50, %s, %d consumer(s)", size_name(bytes).c_str(), n),
                   *open / 1000.0,
                   true,
                   share_open_target_ms,
                   "ms"};
      auto verdict          = st_.check(t);
      *row.mutable_target() = target_result(t);
      std::printf("  %-44s %10.3f ms  (target <= %g ms: %s)\n",
                  t.what.c_str(),
                  t.measured,
                  share_open_target_ms,
                  verdict.c_str());
      auto const copy = open_p50(share_method::host_copy, bytes, n);
      if (!copy || *open <= 0) { continue; }
      row.set_host_copy_over_open_p50(*copy / *open);
      if (bytes != largest) { continue; }
      target_row speedup{
          format("host copy p50 / rmmd open p50, %s, %d consumer(s)", size_name(bytes).c_str(), n),
          *copy / *open,
          false,
          share_speedup_target,
          "x"};
      verdict                       = st_.check(speedup);
      *row.mutable_speedup_target() = target_result(speedup);
      std::printf("  %-44s %10.0f x   (target >= %g x: %s)\n",
                  speedup.what.c_str(),
                  speedup.measured,
                  share_speedup_target,
                  verdict.c_str());
    }
  }
}

}  // namespace

void section_sharing(config const& cfg, daemon_process& daemon, run_state& st)
{
  std::printf(
      "\nf) named shared buffers: a producer process creates and writes one buffer; 1 or %d "
      "consumer processes at once open it, read 8 bytes on their stream, close it (us; "
      "open = to a usable pointer). Without rmmd: cudaIpcOpenMemHandle of the producer's "
      "cudaMalloc buffer, and a copy from a pinned host copy into the consumer's own cudaMalloc "
      "buffer (the copy alone)\n",
      cfg.share_consumers.back());
  auto& out = *st.doc.mutable_sharing();
  out.set_reps(u32(cfg.share_reps));
  out.set_copy_reps(u32(cfg.share_copy_reps));
  out.set_warmup(u32(cfg.share_warmup));
  sharing_cells cells(cfg, daemon, out, st);
  std::printf("%-10s %5s %7s %6s %10s %10s %10s %10s %10s %10s\n",
              "method",
              "procs",
              "size",
              "reps",
              "open p50",
              "open p99",
              "+read p50",
              "close p50",
              "+sync p50",
              "1st open");
  std::fflush(stdout);
  for (auto bytes : cfg.share_sizes) {
    cells.rmmd_cells(bytes);
    cells.cuda_ipc_cells(bytes);
    // Each consumer copies its own pinned host copy into its own allocation.
    for (int n : cfg.share_consumers) { cells.measure(share_method::host_copy, bytes, n, "-", {}); }
  }
  cells.judge();
  std::fflush(stdout);
}

}  // namespace rmmd::bench
