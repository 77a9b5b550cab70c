// A client process for the shared-buffer tests, started with fork+exec.
//
//   rmmd_share_client produce NAME BYTES SEED [OPTIONS]
//       creates buffer NAME of BYTES, writes SEED's pattern into it and
//       publishes it; prints "created ID", "published" and waits for stdin to
//       close; then closes it and exits 0. Device buffers are written the way
//       a producer's kernel would: on a stream held back by a host function
//       (--delay-ms, default 300) followed by an asynchronous copy, and
//       published on that stream right after (publish(stream)), so a consumer
//       that could open the buffer before the stream reached the publication
//       would read zeros. After stdin closes it checks the pattern again and
//       prints "intact" (or "corrupted") before it closes the buffer.
//         --pool NAME     the pool (default: the current GPU's; a host pool
//                         needs it)
//         --persistent    a persistent buffer
//         --gid GID       members of GID may open it
//         --no-publish    create and write, but never publish ("created ID",
//                         then wait)
//   rmmd_share_client consume NAME BYTES SEED [OPTIONS]
//       opens NAME (waiting up to --wait-ms, default 30000), checks that it
//       holds BYTES bytes of SEED's pattern (device buffers: copied back on
//       its own stream), prints "verified BYTES OPEN_US" (or "mismatch at
//       WORD") and waits for stdin to close; then checks again (the producer
//       may have gone meanwhile), prints "intact" (or "corrupted"), closes it
//       on its stream and exits 0 (1 on a mismatch).
//   rmmd_share_client hold-past-close NAME BYTES SEED [OPTIONS]
//       a hostile holder (tenant isolation): opens NAME, checks SEED's
//       pattern ("verified BYTES", or "mismatch at WORD" and exit 1), then
//       tells the daemon it closed the buffer but keeps its mapping (the
//       close call alone, not the library's close) and prints "closed-kept".
//       Once stdin closes it reads its mapping again and prints "intact" if
//       the pattern is still there, else "corrupted" (and exits 1): the
//       memory it kept must stay its own, never be given to anyone else.
//   rmmd_share_client try-open NAME [OPTIONS]
//       opens NAME without waiting: "opened ID BYTES" and exit 0 after stdin
//       closes, or "error KIND: MESSAGE" and exit 2.
//   rmmd_share_client show NAME [OPTIONS]
//       opens NAME (as --writable and --expect say) and prints what the
//       C++ API says of it: "access read|read_write", one "tensor NAME DTYPE
//       SHAPE OFFSET EXTENT [alias A]..." line per tensor (SHAPE as 2x3),
//       one "label KEY=VALUE" per label, then "end"; waits for stdin to close.
//   rmmd_share_client lease NAME [OPTIONS]
//       opens NAME exclusively (its write lease; waiting up to --wait-ms,
//       default 30000), reads its first 8 bytes as a number, writes the
//       lease's generation there, prints "leased GENERATION SEEN" and waits
//       for stdin to close; then closes it and prints "closed". A wait that
//       ends first: "error deadline: MESSAGE" and exit 2.
//   rmmd_share_client standby NAME [OPTIONS]
//       opens NAME as a standby (exclusive and standby: mapped at once, in
//       line for the write lease; --wait-ms bounds the wait for its
//       publication) and prints "standby GENERATION" (0: in line). With
//       --write-early it then writes its first word before the grant: a
//       host buffer's read-only mapping faults (SIGSEGV), a device buffer's
//       is a CUDA error ("cuda-error NAME", exit 3). Waits up to
//       --lease-wait-ms (default 60000) for the lease; then reads the first
//       word (SEEN: the last holder's generation), checks that the words
//       after it hold SEEN's pattern (KV: "kv-intact", or "kv-corrupt"; SEEN
//       0: nothing to check), writes its own generation's pattern there and
//       then its generation into the first word (the stamp after the data),
//       and prints "leased GENERATION SEEN same|moved KV" (same: data() is
//       the address it had before the grant). Until stdin closes it checks
//       every millisecond that the first word is still its generation
//       ("overwritten", exit 1, if another writer wrote it); then closes it
//       and prints "closed".
//   rmmd_share_client write NAME BYTES SEED [OPTIONS]
//       opens NAME (read-only unless --writable) and writes SEED's pattern
//       over it: a host buffer with the CPU (a read-only mapping faults:
//       SIGSEGV), a device buffer with cudaMemset and then cudaMemcpy
//       (a read-only mapping is a CUDA error in this process: "cuda-error
//       NAME" and exit 3). Prints "written" once done and waits for stdin to
//       close, then checks the pattern again ("intact" or "corrupted").
// Options of produce:
//         --allow-writers  others may open it read-write
//         --tensors N      a manifest of N float32 tensors that tile the
//                          buffer ("t0".."tN-1"; "t0" has alias "first")
//         --label K=V      a label of the manifest (repeatable)
// Options of consume, try-open, show and write:
//         --writable       open it read-write
//         --expect K=V     the fingerprint guard (repeatable)
// Common options:
//         --grpc          buffer calls over gRPC instead of the session socket
//         --socket        on the session socket (the default)
//         --fabric        import CUDA pools by fabric handle
//
// Errors print "error KIND: MESSAGE" (KIND: not_found, already_exists, precondition,
// permission, logic, out_of_memory, session, deadline, bad_alloc) and exit 2. The
// daemon is found through $RMMD_RUNTIME_DIR.

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/tools/pattern.hpp"

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <cuda_runtime_api.h>

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using rmmd::test::fill;
using rmmd::test::first_mismatch;
using rmmd::test::pattern;

struct options {
  std::string pool;
  bool persistent{false};
  std::optional<gid_t> gid;
  bool publish{true};
  int delay_ms{300};
  int wait_ms{30000};
  bool grpc{false};
  bool fabric{false};
  bool allow_writers{false};
  std::size_t tensors{0};
  std::map<std::string, std::string, std::less<>> labels;
  bool writable{false};
  std::map<std::string, std::string, std::less<>> expect;
  bool write_early{false};
  int lease_wait_ms{60000};
};

rmmd::open_options open_options_of(options const& o, int wait_ms)
{
  return {.wait          = std::chrono::milliseconds(wait_ms),
          .access        = o.writable ? rmmd::buffer_access::read_write : rmmd::buffer_access::read,
          .expect_labels = o.expect};
}

/// N float32 tensors that tile `bytes` (the last takes what is left).
rmmd::buffer_manifest manifest_of(options const& o, std::size_t bytes)
{
  rmmd::buffer_manifest m{.labels = o.labels};
  std::size_t const each = bytes / o.tensors / 4 * 4;
  for (std::size_t i = 0; i < o.tensors; ++i) {
    std::size_t const size = i + 1 < o.tensors ? each : bytes - each * i;
    m.tensors.push_back({.name        = "t" + std::to_string(i),
                         .type        = rmmd::dtype::float32,
                         .shape       = {size / 4},
                         .byte_offset = each * i});
  }
  if (!m.tensors.empty()) { m.tensors.front().aliases = {"first"}; }
  return m;
}

void check(cudaError_t err, char const* what)
{
  if (err != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorName(err));
    std::exit(3);
  }
}

void wait_for_stdin_to_close()
{
  std::string line;
  while (std::getline(std::cin, line)) {}
}

rmmd::session open_session(options const& o)
{
  rmmd::session::options so;
  so.client_name      = "rmmd_share_client";
  so.import_by_fabric = o.fabric;
  so.lease_calls      = o.grpc ? rmmd::call_transport::grpc : rmmd::call_transport::session_socket;
  return rmmd::session(so);
}

void CUDART_CB sleep_on_stream(void* ms)
{
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<std::intptr_t>(ms)));
}

/// Index of the first word of `buf` that does not hold the pattern, or -1.
long mismatch(rmmd::shared_buffer const& buf,
              std::size_t bytes,
              std::uint64_t seed,
              cudaStream_t stream)
{
  if (buf.is_host()) { return first_mismatch(buf.data(), bytes, seed); }
  std::vector<std::uint64_t> copy(bytes / 8);
  check(cudaMemcpyAsync(copy.data(), buf.data(), bytes, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return first_mismatch(copy.data(), bytes, seed);
}

int produce(std::string const& name, std::size_t bytes, std::uint64_t seed, options const& o)
{
  auto s   = open_session(o);
  auto buf = rmmd::shared_buffer::create(
      s,
      name,
      bytes,
      {.pool = o.pool, .persistent = o.persistent, .gid = o.gid, .allow_writers = o.allow_writers});
  if (o.tensors > 0 || !o.labels.empty()) { buf.set_manifest(manifest_of(o, bytes)); }
  std::cout << "created " << buf.id() << std::endl;
  if (buf.is_host()) {
    fill(buf.data(), bytes, seed);
    if (o.publish) { buf.publish(); }
  } else {
    void* staging = nullptr;
    check(cudaMallocHost(&staging, bytes), "cudaMallocHost");
    fill(staging, bytes, seed);
    cudaStream_t stream{};
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    // Hold the stream back, then write: the publication must wait for both.
    check(cudaLaunchHostFunc(stream,
                             &sleep_on_stream,
                             reinterpret_cast<void*>(static_cast<std::intptr_t>(o.delay_ms))),
          "cudaLaunchHostFunc");
    check(cudaMemcpyAsync(buf.data(), staging, bytes, cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    if (o.publish) { buf.publish(cuda::stream_ref{stream}); }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaFreeHost(staging), "cudaFreeHost");
    buf.set_stream(cuda::stream_ref{cudaStreamLegacy});
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  }
  if (o.publish) { std::cout << "published" << std::endl; }
  wait_for_stdin_to_close();
  cudaStream_t stream{};
  if (!buf.is_host()) {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  std::cout << (mismatch(buf, bytes, seed, stream) < 0 ? "intact" : "corrupted") << std::endl;
  if (!buf.is_host()) {
    buf.close(cuda::stream_ref{stream});
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  }
  return 0;
}

int consume(std::string const& name, std::size_t bytes, std::uint64_t seed, options const& o)
{
  auto s           = open_session(o);
  auto const start = std::chrono::steady_clock::now();
  auto buf         = rmmd::shared_buffer::open(s, name, open_options_of(o, o.wait_ms));
  auto const took  = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  if (buf.size() != bytes) {
    std::cout << "size " << buf.size() << std::endl;
    return 1;
  }
  cudaStream_t stream{};
  if (!buf.is_host()) {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  auto bad = mismatch(buf, bytes, seed, stream);
  if (bad >= 0) {
    std::cout << "mismatch at " << bad << std::endl;
    return 1;
  }
  std::cout << "verified " << bytes << " " << took << std::endl;
  wait_for_stdin_to_close();
  bad = mismatch(buf, bytes, seed, stream);
  std::cout << (bad < 0 ? "intact" : "corrupted") << std::endl;
  if (!buf.is_host()) {
    buf.close(cuda::stream_ref{stream});
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  }
  return bad < 0 ? 0 : 1;
}

int hold_past_close(std::string const& name,
                    std::size_t bytes,
                    std::uint64_t seed,
                    options const& o)
{
  auto s   = open_session(o);
  auto buf = rmmd::shared_buffer::open(s, name, std::chrono::milliseconds(o.wait_ms));
  cudaStream_t stream{};
  if (!buf.is_host()) {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  if (auto bad = mismatch(buf, bytes, seed, stream); bad >= 0) {
    std::cout << "mismatch at " << bad << std::endl;
    return 1;
  }
  std::cout << "verified " << bytes << std::endl;
  if (auto status = rmmd::detail::impl_of(s).close_buffer(buf.id()); !status.ok()) {
    std::cout << "error close: " << status.error_message() << std::endl;
    return 2;
  }
  std::cout << "closed-kept" << std::endl;
  wait_for_stdin_to_close();
  auto const bad = mismatch(buf, bytes, seed, stream);
  std::cout << (bad < 0 ? "intact" : "corrupted") << std::endl;
  // The library's close would tell the daemon again, which knows it no more.
  std::cout.flush();
  std::_Exit(bad < 0 ? 0 : 1);
}

int try_open(std::string const& name, options const& o)
{
  auto s   = open_session(o);
  auto buf = rmmd::shared_buffer::open(s, name, open_options_of(o, 0));
  std::cout << "opened " << buf.id() << " " << buf.size() << std::endl;
  wait_for_stdin_to_close();
  return 0;
}

int show(std::string const& name, options const& o)
{
  auto s   = open_session(o);
  auto buf = rmmd::shared_buffer::open(s, name, open_options_of(o, o.wait_ms));
  std::cout << "access " << (buf.access() == rmmd::buffer_access::read ? "read" : "read_write")
            << "\n";
  for (auto const& t : buf.manifest().tensors) {
    std::cout << "tensor " << t.name << " " << rmmd::to_string(t.type) << " ";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      std::cout << (i > 0 ? "x" : "") << t.shape[i];
    }
    std::cout << " " << t.byte_offset << " " << t.byte_extent();
    for (auto const& a : t.aliases) { std::cout << " alias " << a; }
    std::cout << "\n";
  }
  for (auto const& [key, value] : buf.manifest().labels) {
    std::cout << "label " << key << "=" << value << "\n";
  }
  std::cout << "end" << std::endl;
  wait_for_stdin_to_close();
  return 0;
}

int write(std::string const& name, std::size_t bytes, std::uint64_t seed, options const& o)
{
  auto s   = open_session(o);
  auto buf = rmmd::shared_buffer::open(s, name, open_options_of(o, o.wait_ms));
  cudaStream_t stream{};
  if (buf.is_host()) {
    // SIGSEGV here on a read-only mapping: the kernel's, so that the test
    // sees the signal also where a sanitizer would catch it and exit.
    std::signal(SIGSEGV, SIG_DFL);
    fill(buf.data(), bytes, seed);
  } else {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    std::vector<std::uint64_t> words(bytes / 8);
    fill(words.data(), bytes, seed);
    // A memset first (the GPU writes it; a read-only mapping faults), then
    // the pattern.
    auto err = cudaMemsetAsync(buf.data(), 0xab, bytes, stream);
    if (err == cudaSuccess) { err = cudaStreamSynchronize(stream); }
    if (err == cudaSuccess) {
      err = cudaMemcpyAsync(buf.data(), words.data(), bytes, cudaMemcpyHostToDevice, stream);
    }
    if (err == cudaSuccess) { err = cudaStreamSynchronize(stream); }
    if (err != cudaSuccess) {
      std::cout << "cuda-error " << cudaGetErrorName(err) << std::endl;
      std::_Exit(3);  // the context is lost: no CUDA call may clean up
    }
  }
  std::cout << "written" << std::endl;
  wait_for_stdin_to_close();
  auto const bad = mismatch(buf, bytes, seed, stream);
  std::cout << (bad < 0 ? "intact" : "corrupted") << std::endl;
  if (!buf.is_host()) {
    buf.close(cuda::stream_ref{stream});
    check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  }
  return bad < 0 ? 0 : 1;
}

/// The first 8 bytes of `buf` (host or device memory).
std::uint64_t first_word(rmmd::shared_buffer const& buf)
{
  std::uint64_t word = 0;
  if (buf.is_host()) {
    std::memcpy(&word, buf.data(), sizeof word);
  } else {
    check(cudaMemcpy(&word, buf.data(), sizeof word, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }
  return word;
}

int lease(std::string const& name, options const& o)
{
  auto s                = open_session(o);
  auto buf              = rmmd::shared_buffer::open(s,
                                       name,
                                       {.wait          = std::chrono::milliseconds(o.wait_ms),
                                                     .access        = rmmd::buffer_access::read_write,
                                                     .expect_labels = o.expect,
                                                     .exclusive     = true});
  auto const seen       = first_word(buf);
  auto const generation = buf.lease_generation();
  if (buf.is_host()) {
    std::memcpy(buf.data(), &generation, sizeof generation);
  } else {
    check(cudaMemcpy(buf.data(), &generation, sizeof generation, cudaMemcpyHostToDevice),
          "cudaMemcpy");
  }
  std::cout << "leased " << generation << " " << seen << std::endl;
  wait_for_stdin_to_close();
  buf.close();
  std::cout << "closed" << std::endl;
  return 0;
}

/// Writes `words` over `buf` from word `first` (host or device memory).
void write_words(rmmd::shared_buffer const& buf,
                 std::vector<std::uint64_t> const& words,
                 std::size_t first)
{
  auto* at = static_cast<std::uint64_t*>(buf.data()) + first;
  if (buf.is_host()) {
    std::memcpy(at, words.data(), words.size() * 8);
  } else {
    check(cudaMemcpy(at, words.data(), words.size() * 8, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
}

int standby(std::string const& name, options const& o)
{
  auto s             = open_session(o);
  auto buf           = rmmd::shared_buffer::open(s,
                                       name,
                                       {.wait      = std::chrono::milliseconds(o.wait_ms),
                                                  .access    = rmmd::buffer_access::read_write,
                                                  .exclusive = true,
                                                  .standby   = true});
  void* const before = buf.data();
  std::cout << "standby " << buf.lease_generation() << std::endl;
  if (o.write_early) {
    std::uint64_t const word = 0xBAD;
    if (buf.is_host()) {
      std::memcpy(buf.data(), &word, sizeof word);  // SIGSEGV on a read-only mapping
    } else if (auto err = cudaMemcpy(buf.data(), &word, sizeof word, cudaMemcpyHostToDevice);
               err != cudaSuccess || (err = cudaDeviceSynchronize()) != cudaSuccess) {
      std::cout << "cuda-error " << cudaGetErrorName(err) << std::endl;
      std::_Exit(3);
    }
    std::cout << "wrote-early" << std::endl;
  }
  auto const generation = buf.wait_lease(std::chrono::milliseconds(o.lease_wait_ms));
  auto const seen       = first_word(buf);
  auto const words      = buf.size() / 8;
  bool intact           = true;
  if (seen != 0 && words > 1) {
    std::vector<std::uint64_t> copy(words);
    if (buf.is_host()) {
      std::memcpy(copy.data(), buf.data(), words * 8);
    } else {
      check(cudaMemcpy(copy.data(), buf.data(), words * 8, cudaMemcpyDeviceToHost), "cudaMemcpy");
    }
    for (std::size_t i = 1; i < words && intact; ++i) { intact = copy[i] == pattern(seen, i); }
  }
  std::vector<std::uint64_t> body(words > 0 ? words - 1 : 0);
  for (std::size_t i = 0; i < body.size(); ++i) { body[i] = pattern(generation, i + 1); }
  write_words(buf, body, 1);
  write_words(buf, {generation}, 0);
  std::cout << "leased " << generation << " " << seen << " "
            << (buf.data() == before ? "same" : "moved") << " "
            << (intact ? "kv-intact" : "kv-corrupt") << std::endl;
  pollfd in{.fd = 0, .events = POLLIN, .revents = 0};
  std::string line;
  while (true) {
    if (first_word(buf) != generation) {
      std::cout << "overwritten" << std::endl;
      return 1;
    }
    if (::poll(&in, 1, 1) > 0 && !std::getline(std::cin, line)) { break; }
  }
  buf.close();
  std::cout << "closed" << std::endl;
  return 0;
}

int usage()
{
  std::fprintf(stderr,
               "usage: rmmd_share_client produce NAME BYTES SEED [OPTIONS] | consume NAME BYTES "
               "SEED [OPTIONS] | hold-past-close NAME BYTES SEED [OPTIONS] | try-open NAME "
               "[OPTIONS] | show NAME [OPTIONS] | write NAME BYTES SEED [OPTIONS] | lease NAME "
               "[OPTIONS] | standby NAME [OPTIONS]\n");
  return 64;
}

}  // namespace

int main(int argc, char** argv)
{
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() < 2) { return usage(); }
  options o;
  std::vector<std::string> positional;
  for (std::size_t i = 0; i < args.size(); ++i) {
    auto const& a = args[i];
    auto next     = [&]() -> std::string {
      if (i + 1 >= args.size()) { std::exit(usage()); }
      return args[++i];
    };
    if (a == "--pool") {
      o.pool = next();
    } else if (a == "--persistent") {
      o.persistent = true;
    } else if (a == "--gid") {
      o.gid = static_cast<gid_t>(std::stoul(next()));
    } else if (a == "--no-publish") {
      o.publish = false;
    } else if (a == "--delay-ms") {
      o.delay_ms = std::stoi(next());
    } else if (a == "--wait-ms") {
      o.wait_ms = std::stoi(next());
    } else if (a == "--grpc") {
      o.grpc = true;
    } else if (a == "--socket") {
      o.grpc = false;
    } else if (a == "--fabric") {
      o.fabric = true;
    } else if (a == "--allow-writers") {
      o.allow_writers = true;
    } else if (a == "--tensors") {
      o.tensors = std::stoull(next());
    } else if (a == "--label" || a == "--expect") {
      auto kv = next();
      auto eq = kv.find('=');
      if (eq == std::string::npos) { std::exit(usage()); }
      (a == "--label" ? o.labels : o.expect)[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else if (a == "--writable") {
      o.writable = true;
    } else if (a == "--write-early") {
      o.write_early = true;
    } else if (a == "--lease-wait-ms") {
      o.lease_wait_ms = std::stoi(next());
    } else {
      positional.push_back(a);
    }
  }
  auto const& mode = positional.at(0);
  try {
    if (mode == "produce" && positional.size() == 4) {
      return produce(positional[1], std::stoull(positional[2]), std::stoull(positional[3]), o);
    }
    if (mode == "consume" && positional.size() == 4) {
      return consume(positional[1], std::stoull(positional[2]), std::stoull(positional[3]), o);
    }
    if (mode == "try-open" && positional.size() == 2) { return try_open(positional[1], o); }
    if (mode == "show" && positional.size() == 2) { return show(positional[1], o); }
    if (mode == "lease" && positional.size() == 2) { return lease(positional[1], o); }
    if (mode == "standby" && positional.size() == 2) { return standby(positional[1], o); }
    if (mode == "write" && positional.size() == 4) {
      return write(positional[1], std::stoull(positional[2]), std::stoull(positional[3]), o);
    }
    if (mode == "hold-past-close" && positional.size() == 4) {
      return hold_past_close(
          positional[1], std::stoull(positional[2]), std::stoull(positional[3]), o);
    }
  } catch (rmmd::not_found_error const& e) {
    std::cout << "error not_found: " << e.what() << std::endl;
    return 2;
  } catch (rmmd::already_exists_error const& e) {
    std::cout << "error already_exists: " << e.what() << std::endl;
    return 2;
  } catch (rmmd::precondition_error const& e) {
    std::cout << "error precondition: " << e.what() << std::endl;
    return 2;
  } catch (rmmd::logic_error const& e) {
    std::cout << "error logic: " << e.what() << std::endl;
    return 2;
  } catch (rmmd::permission_error const& e) {
    std::cout << "error permission: " << e.what() << std::endl;
    return 2;
  } catch (rmmd::session_error const& e) {
    std::cout << "error session: " << e.what() << std::endl;
    return 2;
  } catch (rmmd::deadline_error const& e) {
    std::cout << "error deadline: " << e.what() << std::endl;
    return 2;
  } catch (rmm::out_of_memory const& e) {
    std::cout << "error out_of_memory: " << e.what() << std::endl;
    return 2;
  } catch (rmm::bad_alloc const& e) {
    std::cout << "error bad_alloc: " << e.what() << std::endl;
    return 2;
  }
  return usage();
}
