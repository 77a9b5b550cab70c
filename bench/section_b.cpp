// Section b: the direct path's bare steps. An exporter process (this binary,
// helper "--exporter") exports pointers of a posix-fd pool; the bench imports
// and frees them, and times one round trip on the session socket; their sum
// against the direct pair's p50 from section a.

#include "bench/sections.hpp"
#include "bench/targets.hpp"

#include "common/fd_passing.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>

namespace rmmd::bench {
namespace {

// Section b's exporter, in its own process: a posix-fd cudaMemPool (what the
// daemon's pool is), exported once over the socket on fd 3; then, per
// request, allocate + sync (untimed), time cudaMemPoolExportPointer, send the
// export data; free on the next request.
struct exporter_request {
  std::uint32_t op{};  // 0 quit, 1 allocate and export, 2 free the last one
  std::uint64_t bytes{};
};
struct exporter_reply {
  std::int32_t cuda_error{};
  std::int64_t export_ns{};
  cudaMemPoolPtrExportData data{};
  char message[200]{};
};
constexpr int exporter_fd = 3;

bool send_reply(int fd, exporter_reply const& r, int pass_fd = -1)
{
  auto const fds = pass_fd >= 0 ? std::span<int const>(&pass_fd, 1) : std::span<int const>();
  return fd_passing::send_datagram(fd, {reinterpret_cast<char const*>(&r), sizeof(r)}, fds) ==
         static_cast<ssize_t>(sizeof(r));
}

/// Receives one fixed-size message (and an fd, if one came); false at EOF,
/// on error, or at the deadline.
template <typename T>
bool receive(int fd, T& out, std::chrono::milliseconds timeout, int* got_fd = nullptr)
{
  pollfd p{fd, POLLIN, 0};
  int rc;
  do {
    rc = ::poll(&p, 1, static_cast<int>(timeout.count()));
  } while (rc < 0 && errno == EINTR);
  if (rc <= 0) { return false; }
  std::array<int, 1> fds{-1};
  auto const got =
      fd_passing::receive_datagram(fd, {reinterpret_cast<char*>(&out), sizeof(out)}, fds);
  bool const whole = got.bytes == static_cast<ssize_t>(sizeof(out)) && !got.truncated;
  if (whole && got.fd_count == 1 && got_fd != nullptr) {
    *got_fd = fds[0];
  } else {
    fd_passing::close_fds(fds, got.fd_count);
  }
  return whole;
}

}  // namespace

cudaError_t make_exportable_pool(cudaMemPool_t* pool, std::uint64_t release_threshold)
{
  cudaMemPoolProps props{};
  props.allocType     = cudaMemAllocationTypePinned;
  props.handleTypes   = cudaMemHandleTypePosixFileDescriptor;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id   = 0;
  if (auto e = cudaMemPoolCreate(pool, &props); e != cudaSuccess) { return e; }
  return cudaMemPoolSetAttribute(*pool, cudaMemPoolAttrReleaseThreshold, &release_threshold);
}

int exporter_main()
{
  die_with_parent();
  int const fd = exporter_fd;
  exporter_reply reply;
  auto fail = [&](char const* what, cudaError_t e) {
    reply.cuda_error = e;
    std::snprintf(
        reply.message, sizeof(reply.message), "exporter: %s failed: %s", what, cudaGetErrorName(e));
    send_reply(fd, reply);
    return 1;
  };
  if (auto e = cudaSetDevice(0); e != cudaSuccess) { return fail("cudaSetDevice(0)", e); }
  cudaMemPool_t pool{};
  if (auto e = make_exportable_pool(&pool); e != cudaSuccess) {
    return fail("creating an exportable pool", e);
  }
  int pool_fd = -1;
  if (auto e = cudaMemPoolExportToShareableHandle(
          &pool_fd, pool, cudaMemHandleTypePosixFileDescriptor, 0);
      e != cudaSuccess) {
    return fail("cudaMemPoolExportToShareableHandle", e);
  }
  cudaStream_t stream{};
  if (auto e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return fail("cudaStreamCreate", e);
  }
  if (!send_reply(fd, reply, pool_fd)) { return 1; }
  ::close(pool_fd);

  void* ptr = nullptr;
  exporter_request req;
  while (receive(fd, req, std::chrono::milliseconds(120'000)) && req.op != 0) {
    reply = exporter_reply{};
    if (req.op == 1) {
      if (auto e = cudaMallocFromPoolAsync(&ptr, req.bytes, pool, stream); e != cudaSuccess) {
        return fail("cudaMallocFromPoolAsync", e);
      }
      if (auto e = cudaStreamSynchronize(stream); e != cudaSuccess) {
        return fail("cudaStreamSynchronize", e);
      }
      auto t0 = steady::now();
      auto e  = cudaMemPoolExportPointer(&reply.data, ptr);
      auto t1 = steady::now();
      if (e != cudaSuccess) { return fail("cudaMemPoolExportPointer", e); }
      reply.export_ns = static_cast<std::int64_t>(ns_between(t0, t1));
    } else if (req.op == 2) {
      if (auto e = cudaFreeAsync(ptr, stream); e != cudaSuccess) {
        return fail("cudaFreeAsync", e);
      }
      if (auto e = cudaStreamSynchronize(stream); e != cudaSuccess) {
        return fail("cudaStreamSynchronize", e);
      }
      ptr = nullptr;
    }
    if (!send_reply(fd, reply)) { return 1; }
  }
  if (ptr != nullptr) { cudaFreeAsync(ptr, stream); }
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  cudaMemPoolDestroy(pool);
  return 0;
}

namespace {

/// The exporter process, the bench's end of its socket and the pool it
/// exported, imported here. The destructor destroys the imported pool, then
/// kills the exporter if quit() did not end it.
class exporter_link {
 public:
  exporter_link()
  {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
      throw bench_error(std::string("socketpair: ") + std::strerror(errno));
    }
    fd_ = sv[0];
    try {
      exporter_.emplace(std::vector<std::string>{self_path(), "--exporter"},
                        self_env(),
                        harness::spawn_options{.fds = {{exporter_fd, sv[1]}}});
    } catch (...) {
      ::close(sv[1]);
      throw;
    }
    ::close(sv[1]);
    try {
      import_pool();
    } catch (...) {
      exporter_.reset();
      ::close(fd_);
      throw;
    }
  }
  exporter_link(exporter_link const&)            = delete;
  exporter_link& operator=(exporter_link const&) = delete;
  ~exporter_link()
  {
    if (imported_ != nullptr) { cudaMemPoolDestroy(imported_); }
    exporter_.reset();
    ::close(fd_);
  }

  [[nodiscard]] cudaMemPool_t pool() const noexcept
  {
    return imported_;
  }
  [[nodiscard]] double pool_import_us() const noexcept
  {
    return pool_import_us_;
  }

  /// Sends `req` and waits for its reply; throws if the exporter is gone,
  /// silent for 20 s or says a CUDA call failed.
  void step(exporter_request req, exporter_reply& reply)
  {
    if (::send(fd_, &req, sizeof(req), MSG_NOSIGNAL) != sizeof(req)) {
      throw bench_error("the exporter process is gone (send failed)");
    }
    if (!receive(fd_, reply, std::chrono::milliseconds(20'000))) {
      throw bench_error("the exporter process did not answer within 20 s");
    }
    if (reply.cuda_error != 0) { throw bench_error(reply.message); }
  }

  void quit()
  {
    exporter_request quit{0, 0};
    ::send(fd_, &quit, sizeof(quit), MSG_NOSIGNAL);
    exporter_->finish(10s);
  }

 private:
  void import_pool()
  {
    int pool_fd = -1;
    exporter_reply hello;
    if (!receive(fd_, hello, std::chrono::milliseconds(60'000), &pool_fd)) {
      throw bench_error("the exporter process sent no pool fd within 60 s (exit status " +
                        std::to_string(exporter_->finish(1s)) + ")");
    }
    if (hello.cuda_error != 0 || pool_fd < 0) {
      if (pool_fd >= 0) { ::close(pool_fd); }
      throw bench_error(std::string(hello.message[0] ? hello.message : "exporter: no pool fd"));
    }
    auto t_pool0    = steady::now();
    auto import_err = cudaMemPoolImportFromShareableHandle(
        &imported_,
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(pool_fd)),
        cudaMemHandleTypePosixFileDescriptor,
        0);
    auto t_pool1 = steady::now();
    ::close(pool_fd);
    if (import_err != cudaSuccess) { imported_ = nullptr; }
    BENCH_CUDA(import_err);
    pool_import_us_ = ns_between(t_pool0, t_pool1) / 1000.0;
  }

  int fd_{-1};
  std::optional<child_process> exporter_;
  cudaMemPool_t imported_{};
  double pool_import_us_{};
};

/// Each step's samples at one size, the first 20 (warm-up) left out.
struct step_samples {
  std::vector<double> export_ns, import_ns, free_ns;
};

step_samples measure_steps(exporter_link& link,
                           cudaStream_t stream,
                           std::size_t bytes,
                           std::size_t reps,
                           std::chrono::seconds budget)
{
  step_samples out;
  auto const deadline = steady::now() + budget;
  for (std::size_t i = 0; i < reps + 20 && steady::now() < deadline; ++i) {
    exporter_reply reply;
    link.step({1, bytes}, reply);
    void* p = nullptr;
    auto t0 = steady::now();
    BENCH_CUDA(cudaMemPoolImportPointer(&p, link.pool(), &reply.data));
    auto t1 = steady::now();
    BENCH_CUDA(cudaFreeAsync(p, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    auto t2 = steady::now();
    exporter_reply freed;
    link.step({2, 0}, freed);
    if (i >= 20) {  // the first 20 warm up
      out.export_ns.push_back(static_cast<double>(reply.export_ns));
      out.import_ns.push_back(ns_between(t0, t1));
      out.free_ns.push_back(ns_between(t1, t2));
    }
  }
  return out;
}

void print_steps_header()
{
  std::printf("%7s %6s %8s %8s %8s %8s %8s %9s %8s  %s\n",
              "size",
              "steps",
              "export",
              "import",
              "free",
              "rpc",
              "sum",
              "direct",
              "x sum",
              "target");
}

/// Fills `row` with one size's steps, judged against section a's direct p50.
void record_steps(std::size_t bytes,
                  step_samples const& samples,
                  summary const& rpc,
                  pair_p50_map const& pair_p50,
                  results::StepRow& row,
                  run_state& st)
{
  auto ex = summarize(samples.export_ns), im = summarize(samples.import_ns),
       fr    = summarize(samples.free_ns);
  double sum = ex.p50_us + im.p50_us + fr.p50_us + rpc.p50_us;
  std::optional<double> direct_p50, ratio;
  if (auto d = pair_p50.find({"rmmd_direct", bytes}); d != pair_p50.end()) {
    direct_p50 = d->second;
    ratio      = d->second / sum;
  }
  std::string verdict = "(no direct figure from a)";
  if (ratio) {
    target_row t{"direct p50 / sum of bare steps at " + size_name(bytes),
                 *ratio,
                 true,
                 direct_steps_target,
                 "x"};
    verdict               = format("<= %.1fx %s", direct_steps_target, st.check(t).c_str());
    *row.mutable_target() = target_result(t);
  }
  std::printf("%7s %6zu %8.2f %8.2f %8.2f %8.2f %8.2f %9s %8s  %s\n",
              size_name(bytes).c_str(),
              ex.count,
              ex.p50_us,
              im.p50_us,
              fr.p50_us,
              rpc.p50_us,
              sum,
              direct_p50 ? format("%.2f", *direct_p50).c_str() : "-",
              ratio ? format("%.2f", *ratio).c_str() : "-",
              verdict.c_str());
  std::fflush(stdout);
  auto set_latency = [](results::Latency& l, summary const& s) {
    l.set_p50_us(s.p50_us);
    l.set_p99_us(s.p99_us);
  };
  row.set_steps(u32(ex.count));
  set_latency(*row.mutable_export_(), ex);
  set_latency(*row.mutable_import(), im);
  set_latency(*row.mutable_free_sync(), fr);
  row.set_rpc_p50_us(rpc.p50_us);
  row.set_sum_p50_us(sum);
  // A direct pair makes two round trips (Allocate, Free); the target counts
  // one, the transport's floor, so the two-trip sum is recorded beside it.
  row.set_sum_with_two_rpcs_p50_us(sum + rpc.p50_us);
  if (direct_p50) { row.set_direct_p50_us(*direct_p50); }
  if (ratio) { row.set_direct_over_sum(*ratio); }
}

void steps_against_exporter(config const& cfg,
                            summary const& rpc,
                            pair_p50_map const& pair_p50,
                            results::DirectSteps& out,
                            run_state& st)
{
  exporter_link link;
  out.set_pool_import_us(link.pool_import_us());
  stream_holder stream;
  print_steps_header();
  bool broken = false;  // after an error the exporter's replies may be out of step: stop
  for (auto bytes : pair_sizes) {
    auto& row = *out.add_sizes();
    row.set_size_bytes(u32(bytes));
    if (broken) {
      row.set_error("skipped after the error above");
      continue;
    }
    try {
      auto reps    = bytes >= (std::size_t{64} << 20) ? cfg.step_reps_64mib : cfg.step_reps;
      auto samples = measure_steps(link, stream.get(), bytes, reps, cfg.cell_budget);
      record_steps(bytes, samples, rpc, pair_p50, row, st);
    } catch (std::exception const& e) {
      row.set_error(e.what());
      st.error("b " + size_name(bytes), e.what());
      broken = true;
    }
  }
  link.quit();
}

}  // namespace

void section_steps(config const& cfg,
                   rmmd::session const& session,
                   std::map<std::pair<std::string, std::size_t>, double> const& pair_p50,
                   run_state& st)
{
  std::printf(
      "\nb) the direct path against its bare steps (p50 us): export in an exporter process, "
      "import + free (cudaFreeAsync + stream sync) here, one round trip on the session socket "
      "(Ping, the transport the direct path uses)\n");
  results::DirectSteps out;

  auto round_trips = [&](auto&& call) {
    std::vector<double> ns;
    for (std::size_t i = 0; i < cfg.rpc_reps + 50; ++i) {
      auto t0 = steady::now();
      call();
      auto t1 = steady::now();
      if (i >= 50) { ns.push_back(ns_between(t0, t1)); }
    }
    return summarize(ns);
  };
  rmmd::admin const admin(session);
  auto rpc             = round_trips([&] { (void)admin.ping(); });
  auto set_round_trips = [](results::RoundTrips& r, summary const& s) {
    r.set_count(u32(s.count));
    r.set_p50_us(s.p50_us);
    r.set_p99_us(s.p99_us);
  };
  set_round_trips(*out.mutable_rpc_session_ping(), rpc);
  // For reference: a gRPC round trip, what each call of the gRPC transport pays.
  // (its JSON printed too: rmmd::admin's form of the reply; a few us).
  auto grpc_rpc = round_trips([&] { (void)admin.stats_json(); });
  set_round_trips(*out.mutable_rpc_grpc_getstats(), grpc_rpc);
  std::printf(
      "  one round trip: session socket (Ping) p50 %.2f us, p99 %.2f us; gRPC (GetStats) "
      "p50 %.2f us, p99 %.2f us\n",
      rpc.p50_us,
      rpc.p99_us,
      grpc_rpc.p50_us,
      grpc_rpc.p99_us);
  try {
    steps_against_exporter(cfg, rpc, pair_p50, out, st);
  } catch (std::exception const& e) {
    out.set_error(e.what());
    *st.doc.mutable_direct_steps() = std::move(out);
    throw;
  }
  *st.doc.mutable_direct_steps() = std::move(out);
}

}  // namespace rmmd::bench
