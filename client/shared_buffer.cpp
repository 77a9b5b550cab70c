#include <rmmd/shared_buffer.hpp>

#include "client/detail/cuda_state.hpp"
#include "client/detail/device_scope.hpp"
#include "client/detail/manifest_convert.hpp"
#include "client/detail/process_exit.hpp"
#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "client/detail/stderr_line.hpp"
#include "client/detail/stream_capture.hpp"
#include "common/buffer_address.hpp"
#include "common/buffer_name.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rmmd {
namespace detail {
namespace {

/// A host function's work for a shared buffer: send its publish or close
/// once the stream got there. Like release_job (ipc_memory_resource.cpp) it
/// may run after its buffer, so it holds a share of the queue, not a pointer
/// to the buffer; the session waits for it (buffer_jobs) before it closes.
struct buffer_job {
  std::shared_ptr<session_impl::release_queue> queue;
  session_impl::queued_call call;

  static void CUDART_CB run(void* self) noexcept
  {
    std::unique_ptr<buffer_job> job(static_cast<buffer_job*>(self));
    session_impl::send_when_reached(*job->queue, job->call);
    std::lock_guard lock(job->queue->mutex);
    if (--job->queue->buffer_jobs == 0) { job->queue->buffer_jobs_done.notify_all(); }
  }

  /// Enqueues `call` on `stream`; false (nothing enqueued) when CUDA refuses.
  static bool launch(session_impl& s, cudaStream_t stream, session_impl::queued_call call) noexcept
  {
    std::unique_ptr<buffer_job> job;
    try {
      job = std::make_unique<buffer_job>(buffer_job{.queue = s.releases(), .call = call});
    } catch (std::bad_alloc const&) {
      return false;
    }
    auto& queue = *job->queue;
    {
      std::lock_guard lock(queue.mutex);
      ++queue.buffer_jobs;
    }
    if (cudaLaunchHostFunc(stream, &buffer_job::run, job.get()) == cudaSuccess) {
      static_cast<void>(job.release());  // run() owns it now
      return true;
    }
    cudaGetLastError();
    std::lock_guard lock(queue.mutex);
    if (--queue.buffer_jobs == 0) { queue.buffer_jobs_done.notify_all(); }
    return false;
  }
};

}  // namespace

/// Reads the daemon's grant into a shared_buffer (a friend of it: the
/// public header names no wire type).
struct shared_buffer_access {
  /// This process's view of a buffer the daemon granted (by create or open).
  /// `device`: where a buffer of another node is mapped (-1: current).
  static shared_buffer attached(session const& s,
                                v1::BufferGrant const& grant,
                                bool creator,
                                pinning pin,
                                int device   = -1,
                                bool standby = false);
};

}  // namespace detail

namespace {

/// Whether the daemon's message for a refused buffer call begins with the
/// request ("open buffer 'x': ..."), so that the client need not say it again
/// (a transport error, a timeout, does not).
bool daemon_names_it(grpc::Status const& status)
{
  auto const& m = status.error_message();
  for (char const* prefix : {"create buffer ",
                             "open buffer ",
                             "publish buffer ",
                             "delete buffer ",
                             "describe buffer ",
                             "set manifest of buffer ",
                             "wait for the write lease of buffer ",
                             "buffer '"}) {
    if (m.rfind(prefix, 0) == 0) { return true; }
  }
  return false;
}

/// Throws rmmd::logic_error when `name` breaks the rule, before any request.
void check_name(std::string const& what, std::string_view name)
{
  if (auto problem = names::buffer_name_problem(name)) {
    throw rmmd::logic_error("rmmd: " + what + ": " + *problem);
  }
}

/// Throws what error.hpp gives for a refused buffer call `what`.
[[noreturn]] void refused(grpc::Status const& status, std::string const& what)
{
  // The daemon's own DEADLINE_EXCEEDED (a wait it ended: its message names
  // the request) is not a lost daemon.
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && daemon_names_it(status)) {
    throw rmmd::deadline_error("rmmd: " + status.error_message());
  }
  detail::throw_status(status, daemon_names_it(status) ? std::string() : what);
}

/// An OpenBuffer, asked again while the daemon ends its wait before the
/// caller's (it waits at most some minutes per call) with the wait left; a
/// write lease's place in line starts again at each ask.
grpc::Status open_within(session const& s,
                         v1::OpenBufferRequest& request,
                         std::chrono::milliseconds wait,
                         v1::BufferGrant* grant)
{
  using ms            = std::chrono::milliseconds;
  using steady        = std::chrono::steady_clock;
  auto left           = std::clamp(wait, ms(0), ms(0xffffffff));
  auto const deadline = steady::now() + left;
  while (true) {
    request.set_wait_ms(static_cast<std::uint32_t>(left.count()));
    auto status            = detail::impl_of(s).open_buffer(request, grant);
    left                   = std::chrono::ceil<ms>(deadline - steady::now());
    bool const ended_early = request.exclusive() &&
                             status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                             daemon_names_it(status) && left > std::chrono::seconds(1);
    if (!ended_early) { return status; }
  }
}

/// Gives back an open or create whose memory this process could not reach.
void close_unreachable(session const& s, std::uint64_t id) noexcept
{
  try {
    static_cast<void>(detail::impl_of(s).close_buffer(id));
  } catch (std::exception const&) {
    // The daemon lets go of it when the session closes.
  }
}

}  // namespace

shared_buffer shared_buffer::create(session const& s,
                                    std::string_view name,
                                    std::size_t bytes,
                                    shared_buffer_options const& options)
{
  auto const what = "create buffer '" + std::string(name) + "'";
  check_name(what, name);
  if (bytes == 0) {
    throw rmmd::logic_error("rmmd: " + what + ": size 0 is not allowed; ask for at least 1 byte");
  }
  pool_info const& pool = [&]() -> pool_info const& {
    if (!options.pool.empty()) { return s.pool(options.pool); }
    int device = options.device;
    if (device < 0) {
      if (auto err = cudaGetDevice(&device); err != cudaSuccess) {
        cudaGetLastError();
        throw rmmd::logic_error("rmmd: " + what + ": no pool named and no current CUDA device (" +
                                cudaGetErrorName(err) + "); name a pool (options.pool)");
      }
    }
    return s.device_pool(device);
  }();
  if (bytes > pool.capacity_bytes) {
    throw rmm::out_of_memory("rmmd: " + what + " of " + std::to_string(bytes) + " bytes in pool '" +
                             pool.name + "': larger than the pool's capacity of " +
                             std::to_string(pool.capacity_bytes) + " bytes");
  }
  detail::impl_of(s).watch_exit_once();
  v1::CreateBufferRequest request;
  request.set_name(std::string(name));
  request.set_pool_id(pool.id);
  request.set_size(bytes);
  request.set_alignment(options.alignment);
  request.set_persistent(options.persistent);
  if (options.gid) { request.set_gid(*options.gid); }
  request.set_allow_writers(options.allow_writers);
  v1::BufferGrant grant;
  if (auto status = detail::impl_of(s).create_buffer(request, &grant); !status.ok()) {
    refused(status, what);
  }
  return detail::shared_buffer_access::attached(s, grant, true, options.pin);
}

shared_buffer shared_buffer::open(session const& s,
                                  std::string_view name,
                                  std::chrono::milliseconds wait)
{
  return open(s, name, open_options{.wait = wait});
}

shared_buffer shared_buffer::open(session const& s,
                                  std::string_view name,
                                  open_options const& options)
{
  auto const what = "open buffer '" + std::string(name) + "'";
  std::string problem;
  auto const address = names::parse_buffer_address(name, options.peer, &problem);
  if (!address) { throw rmmd::logic_error("rmmd: " + what + ": " + problem); }
  bool const remote = !address->node.empty();
  if (options.device < -1) {
    throw rmmd::logic_error("rmmd: " + what + ": device is " + std::to_string(options.device) +
                            "; give a CUDA device of this process, or -1 for the current one");
  }
  if (options.exclusive && options.access != buffer_access::read_write) {
    throw rmmd::logic_error("rmmd: " + what +
                            ": an exclusive open takes the write lease, so it is a read-write "
                            "open: set access to buffer_access::read_write too");
  }
  if (options.standby && !options.exclusive) {
    throw rmmd::logic_error("rmmd: " + what +
                            ": a standby stands in line for the write lease, so it is an "
                            "exclusive open: set exclusive (and access read_write) too");
  }
  if (options.exclusive && remote) {
    throw rmmd::logic_error("rmmd: " + what +
                            ": a write lease is held by a session of the buffer's own node "
                            "(docs/failover.md); open it exclusively there");
  }
  int device = -1;
  if (remote) {
    // A buffer of another node comes by fabric handle, mapped on a device of
    // this process: known before the daemon is asked.
    int count = 0;
    if (auto err = cudaGetDeviceCount(&count); err != cudaSuccess || count <= 0) {
      cudaGetLastError();
      throw rmmd::logic_error(
          "rmmd: " + what +
          ": a buffer of another node is mapped on a GPU, and this process sees none (" +
          cudaGetErrorName(err != cudaSuccess ? err : cudaErrorNoDevice) + ")");
    }
    device = options.device;
    if (device >= count) {
      throw rmmd::logic_error("rmmd: " + what + ": device " + std::to_string(device) +
                              ": this process sees " + std::to_string(count) + " GPU" +
                              (count == 1 ? "" : "s") + " (CUDA_VISIBLE_DEVICES decides which)");
    }
    if (device < 0) {
      if (auto err = cudaGetDevice(&device); err != cudaSuccess) {
        cudaGetLastError();
        throw rmmd::logic_error(
            "rmmd: " + what + ": a buffer of another node is mapped on a GPU, " +
            "and this process has no current one (" + cudaGetErrorName(err) + ")");
      }
    }
  }
  detail::impl_of(s).watch_exit_once();
  v1::OpenBufferRequest request;
  request.set_name(address->name);
  request.set_peer(address->node);
  request.set_access(options.access == buffer_access::read_write ? v1::BUFFER_ACCESS_READ_WRITE
                                                                 : v1::BUFFER_ACCESS_READ);
  request.set_exclusive(options.exclusive);
  request.set_standby(options.standby);
  detail::copy_labels(options.expect_labels, request.mutable_expect_labels());
  v1::BufferGrant grant;
  if (auto status = open_within(s, request, options.wait, &grant); !status.ok()) {
    refused(status, what);
  }
  if (remote && grant.peer() != address->node) {
    close_unreachable(s, grant.buffer_id());
    throw rmm::bad_alloc("rmmd: " + what + ": the daemon answered with a buffer of node '" +
                         grant.peer() + "'; a daemon without peering ignores NODE:");
  }
  if (!remote && options.device >= 0) {
    // This node's buffers map where their pool is: the device is a check.
    auto const& pools = s.pools();
    auto const* pool  = grant.pool_id() < pools.size() ? &pools[grant.pool_id()] : nullptr;
    if (pool != nullptr && pool->device != options.device) {
      close_unreachable(s, grant.buffer_id());
      auto const where =
          pool->backend == backend_kind::host
              ? "in host pool '" + pool->name + "', on no GPU"
              : "in pool '" + pool->name + "', " +
                    (pool->device < 0 ? std::string("on a GPU this process cannot see")
                                      : "on device " + std::to_string(pool->device));
      throw rmmd::logic_error(
          "rmmd: " + what + ": it is " + where + ", not on device " +
          std::to_string(options.device) +
          ": a buffer of this node is mapped on its pool's GPU (device chooses the GPU for a "
          "buffer of another node only); open it without device" +
          (pool->device >= 0 ? " or with device " + std::to_string(pool->device) : ""));
    }
  }
  if (grant.manifest_follows()) {
    // A session-socket grant: the manifest comes by gRPC, which the open
    // makes this session's to ask for.
    if (auto status =
            detail::impl_of(s).get_buffer_manifest(grant.buffer_id(), grant.mutable_manifest());
        !status.ok()) {
      close_unreachable(s, grant.buffer_id());
      detail::throw_status(status, what + ": its manifest");
    }
  }
  return detail::shared_buffer_access::attached(
      s, grant, false, options.pin, device, options.standby);
}

shared_buffer detail::shared_buffer_access::attached(session const& s,
                                                     v1::BufferGrant const& grant,
                                                     bool creator,
                                                     pinning pin,
                                                     int device,
                                                     bool standby)
{
  shared_buffer out;
  // The creator holds it read-write; a consumer as the daemon granted (a
  // daemon that knows no access grants READ, the default).
  out.access_ = creator || grant.access() == v1::BUFFER_ACCESS_READ_WRITE
                    ? buffer_access::read_write
                    : buffer_access::read;
  try {
    if (grant.has_manifest()) { out.manifest_ = detail::from_proto(grant.manifest()); }
    bool const read_only = out.access_ == buffer_access::read;
    auto const mode      = standby     ? detail::view_mode::standby
                           : read_only ? detail::view_mode::read_only
                                       : detail::view_mode::read_write;
    out.data_ =
        grant.peer().empty()
            ? detail::impl_of(s).buffers().attach(grant, mode, grant.lease_generation() != 0, pin)
            : detail::impl_of(s).buffers().attach_remote(grant, read_only, device);
  } catch (...) {
    close_unreachable(s, grant.buffer_id());
    throw;
  }
  out.session_          = s;
  out.size_             = grant.size();
  out.id_               = grant.buffer_id();
  out.pool_id_          = grant.pool_id();
  out.name_             = grant.name();
  out.creator_          = creator;
  out.persistent_       = grant.persistent();
  out.peer_             = grant.peer();
  out.peer_device_      = device;
  out.lease_generation_ = grant.lease_generation();
  out.standby_          = standby;
  if (!out.is_host()) { out.stream_ = cuda::stream_ref{cudaStreamLegacy}; }
  return out;
}

std::vector<buffer_info> shared_buffer::list(session const& s, buffer_filter const& filter)
{
  v1::ListBuffersRequest request;
  request.set_name_prefix(filter.name_prefix);
  detail::copy_labels(filter.labels, request.mutable_labels());
  request.set_peer(filter.peer);
  v1::ListBuffersResponse response;
  if (auto status = detail::impl_of(s).list_buffers(request, &response); !status.ok()) {
    detail::throw_status(status, "list buffers");
  }
  std::vector<buffer_info> out;
  out.reserve(static_cast<std::size_t>(response.buffers_size()));
  for (auto const& b : response.buffers()) { out.push_back(detail::from_proto(b)); }
  return out;
}

shared_buffer shared_buffer::open_by_labels(
    session const& s,
    std::map<std::string, std::string, std::less<>> const& labels,
    open_options const& options)
{
  std::string shown;
  for (auto const& [key, value] : labels) {
    shown += (shown.empty() ? "" : ", ") + key + "=" + value;
  }
  auto const where = options.peer.empty() ? std::string() : " on node '" + options.peer + "'";
  auto const what  = "open the buffer labelled {" + shown + "}" + where;
  if (labels.empty()) {
    throw rmmd::logic_error("rmmd: open a buffer by labels: no labels given; name at least one");
  }
  open_options guarded = options;
  for (auto const& [key, value] : labels) {
    auto [it, added] = guarded.expect_labels.try_emplace(key, value);
    if (!added && it->second != value) {
      throw rmmd::logic_error("rmmd: " + what + ": options.expect_labels wants " + key + "=" +
                              it->second + "; give each label one value");
    }
  }
  auto listed = list(s, buffer_filter{.labels = labels, .peer = options.peer});
  // Root and the creator also see unpublished buffers, which no open finds.
  std::erase_if(listed, [](buffer_info const& b) { return !b.published; });
  if (listed.empty()) {
    throw rmmd::not_found_error("rmmd: " + what + ": no published buffer " +
                                (options.peer.empty() ? std::string("this process may see")
                                                      : "that node's grant lets this node open") +
                                " carries them (`rmmctl buffers" +
                                (options.peer.empty() ? std::string() : " --peer " + options.peer) +
                                "` lists them with their labels)");
  }
  if (listed.size() > 1) {
    constexpr std::size_t most_named = 8;
    std::string names;
    for (std::size_t i = 0; i < listed.size() && i < most_named; ++i) {
      names += (i == 0 ? "'" : ", '") + listed[i].name + "'";
    }
    if (listed.size() > most_named) {
      names += " and " + std::to_string(listed.size() - most_named) + " more";
    }
    // Several matches are the state of the daemon, not a malformed request:
    // FAILED_PRECONDITION's error, as for a label that differs on open.
    throw rmmd::precondition_error("rmmd: " + what + ": " + std::to_string(listed.size()) +
                                   " buffers carry them (" + names +
                                   "); add a label that tells them apart, or open one by name");
  }
  return open(s, listed.front().name, guarded);
}

std::pair<buffer_info, buffer_manifest> shared_buffer::describe(session const& s,
                                                                std::string_view name)
{
  auto const what = "describe buffer '" + std::string(name) + "'";
  check_name(what, name);
  v1::DescribeBufferResponse response;
  if (auto status = detail::impl_of(s).describe_buffer(std::string(name), &response);
      !status.ok()) {
    refused(status, what);
  }
  return {detail::from_proto(response.info()), detail::from_proto(response.manifest())};
}

void shared_buffer::set_manifest(buffer_manifest const& manifest)
{
  auto const what = "set manifest of buffer '" + name_ + "'";
  if (!session_) { throw rmmd::logic_error("rmmd: an empty shared_buffer has no manifest"); }
  if (!creator_) {
    throw rmmd::precondition_error("rmmd: " + what +
                                   ": only the process that created it may set its manifest");
  }
  auto& impl = detail::impl_of(*session_);
  v1::SetBufferManifestRequest request;
  request.set_buffer_id(id_);
  detail::to_proto(manifest, request.mutable_manifest());
  if (auto status = impl.set_buffer_manifest(request); !status.ok()) { refused(status, what); }
  // What the daemon holds now, with the labels it adds ("rmmd.gpu_uuid"):
  // read back (one more round trip, once per buffer), else ours.
  v1::BufferManifest held;
  manifest_ = impl.get_buffer_manifest(id_, &held).ok() ? detail::from_proto(held) : manifest;
}

std::size_t shared_buffer::remove(session const& s, std::string_view name)
{
  auto const what = "delete buffer '" + std::string(name) + "'";
  check_name(what, name);
  auto& impl = detail::impl_of(s);
  v1::DeleteBufferRequest request;
  request.set_name(std::string(name));
  v1::DeleteBufferResponse response;
  if (auto status = impl.unary(&v1::Rmmd::Stub::DeleteBuffer, request, &response); !status.ok()) {
    refused(status, what);
  }
  return response.holders();
}

shared_buffer::shared_buffer(shared_buffer&& other) noexcept
    : session_(std::move(other.session_)),
      data_(other.data_),
      size_(other.size_),
      id_(other.id_),
      pool_id_(other.pool_id_),
      name_(std::move(other.name_)),
      peer_(std::move(other.peer_)),
      peer_device_(other.peer_device_),
      manifest_(std::move(other.manifest_)),
      access_(other.access_),
      creator_(other.creator_),
      persistent_(other.persistent_),
      lease_generation_(other.lease_generation_),
      standby_(other.standby_),
      stream_(other.stream_)
{
  other.reset();
}

shared_buffer& shared_buffer::operator=(shared_buffer&& other) noexcept
{
  if (this != &other) {
    close();
    session_          = std::move(other.session_);
    data_             = other.data_;
    size_             = other.size_;
    id_               = other.id_;
    pool_id_          = other.pool_id_;
    name_             = std::move(other.name_);
    peer_             = std::move(other.peer_);
    peer_device_      = other.peer_device_;
    manifest_         = std::move(other.manifest_);
    access_           = other.access_;
    creator_          = other.creator_;
    persistent_       = other.persistent_;
    lease_generation_ = other.lease_generation_;
    standby_          = other.standby_;
    stream_           = other.stream_;
    other.reset();
  }
  return *this;
}

shared_buffer::~shared_buffer()
{
  close();
}

void shared_buffer::reset() noexcept
{
  session_.reset();
  data_    = nullptr;
  size_    = 0;
  id_      = 0;
  creator_ = false;
  peer_.clear();
  peer_device_      = -1;
  manifest_         = {};
  access_           = buffer_access::read_write;
  lease_generation_ = 0;
  standby_          = false;
  stream_.reset();
}

pool_info const& shared_buffer::pool() const
{
  if (!session_) { throw rmmd::logic_error("rmmd: an empty shared_buffer has no pool"); }
  if (!peer_.empty()) {
    throw rmmd::logic_error("rmmd: buffer '" + name_ + "' is node '" + peer_ +
                            "'s; its pool is that node's daemon's");
  }
  return session_->pools().at(pool_id_);
}

bool shared_buffer::is_host() const
{
  // A buffer of another node is always a fabric pool's device memory.
  return peer_.empty() && pool().backend == backend_kind::host;
}

int shared_buffer::device() const
{
  if (!peer_.empty()) { return peer_device_; }
  return pool().device;
}

bool shared_buffer::pinned() const
{
  if (data_ == nullptr || !peer_.empty()) { return false; }
  auto const mode = standby_                         ? detail::view_mode::standby
                    : access_ == buffer_access::read ? detail::view_mode::read_only
                                                     : detail::view_mode::read_write;
  return detail::impl_of(*session_).buffers().pinned(id_, mode);
}

void shared_buffer::publish(cuda::stream_ref stream)
{
  if (!creator_) {
    throw rmmd::precondition_error("rmmd: publish buffer '" + name_ +
                                   "': only the process that created it may publish it");
  }
  if (detail::capturing_graph(stream.get()) != nullptr) {
    // Captured, the publish would be sent at every replay of the graph (and
    // before the graph's writes ever ran).
    throw rmmd::precondition_error(
        "rmmd: publish buffer '" + name_ +
        "': the stream is capturing a CUDA graph; publish on a stream that is not capturing, "
        "after the graph's launch that writes the buffer");
  }
  stream_    = stream;
  using call = detail::session_impl::queued_call;
  if (detail::buffer_job::launch(detail::impl_of(*session_),
                                 stream.get(),
                                 call{.what = call::kind::publish_buffer, .id = id_})) {
    return;
  }
  // No host function (out of memory, or the stream takes none): wait here.
  if (auto err = cudaStreamSynchronize(stream.get()); err != cudaSuccess) {
    cudaGetLastError();
    throw rmm::bad_alloc("rmmd: publish buffer '" + name_ +
                         "': cudaStreamSynchronize: " + cudaGetErrorName(err));
  }
  publish();
}

void shared_buffer::publish()
{
  if (!creator_) {
    throw rmmd::precondition_error("rmmd: publish buffer '" + name_ +
                                   "': only the process that created it may publish it");
  }
  if (auto status = detail::impl_of(*session_).publish_buffer(id_); !status.ok()) {
    refused(status, "publish buffer '" + name_ + "'");
  }
}

void shared_buffer::close() noexcept
{
  if (stream_) {
    close(*stream_);
    return;
  }
  if (!session_) { return; }
  // A host buffer without a stream: nothing of the GPU's to wait for.
  if (!detail::process_is_exiting()) {
    auto& impl = detail::impl_of(*session_);
    if (auto view = impl.buffers().detach(id_, static_cast<detail::view_mode>(view_mode()))) {
      detail::buffer_views::unmap_host(*view);
    }
    send_close();
  }
  reset();
}

void shared_buffer::close(cuda::stream_ref stream) noexcept
{
  if (!session_) { return; }
  // While the process exits: no CUDA and no daemon call; its end closes all.
  if (detail::leave_everything()) {
    reset();
    return;
  }
  auto& impl = detail::impl_of(*session_);
  // Set when this was the last open here with this access.
  auto const view = impl.buffers().detach(id_, static_cast<detail::view_mode>(view_mode()));
  bool const host = [&] {
    try {
      return is_host();
    } catch (std::exception const&) {
      return true;
    }
  }();
  using call = detail::session_impl::queued_call;
  if (!view || host) {
    // Another open in this process keeps the import (only the hold goes),
    // or host memory: what the stream does with it is done before anyone
    // else may have the bytes.
    if (host) {
      synchronize(stream);
      if (view) { detail::buffer_views::unmap_host(*view); }
    }
    send_close();
  } else if (view->vmm_handle != 0) {
    // The buffer's own allocation: unmapping is a CUDA call, which a host
    // function may not make, so the stream is waited for here.
    synchronize(stream);
    detail::buffer_views::unmap_allocation(*view);
    send_close();
  } else {
    // A pool pointer (a daemon that serves buffers from pool memory). CUDA's
    // rule: the import goes before the daemon may free the memory, in the
    // stream's order; the close follows it there.
    if (auto err = cudaFreeAsync(data_, stream.get()); err != cudaSuccess) {
      cudaGetLastError();
      if (!detail::cuda_is_going(err)) {
        rmmd::detail::stderr_line(
            "rmmd: closing buffer '%s' failed (%s); the daemon lets go of it when the "
            "session closes\n",
            name_.c_str(),
            cudaGetErrorName(err));
      }
      reset();
      return;
    }
    if (!detail::buffer_job::launch(
            impl,
            stream.get(),
            call{.what = call::kind::close_buffer, .id = id_, .hold = hold_kind()})) {
      synchronize(stream);
      send_close();
    }
  }
  reset();
}

void shared_buffer::synchronize(cuda::stream_ref stream) const noexcept
{
  auto err = cudaStreamSynchronize(stream.get());
  if (err == cudaSuccess) { return; }
  cudaGetLastError();
  // A host buffer in a process without a GPU has no stream to wait for.
  if (err != cudaErrorNoDevice && err != cudaErrorInsufficientDriver &&
      !detail::cuda_is_going(err)) {
    rmmd::detail::stderr_line("rmmd: closing buffer '%s': cudaStreamSynchronize: %s\n",
                              name_.c_str(),
                              cudaGetErrorName(err));
  }
}

std::uint8_t shared_buffer::hold_kind() const noexcept
{
  if (lease_generation_ != 0 || standby_) { return v1::BUFFER_HOLD_LEASE; }
  return access_ == buffer_access::read_write ? v1::BUFFER_HOLD_READ_WRITE : v1::BUFFER_HOLD_READ;
}

std::uint8_t shared_buffer::view_mode() const noexcept
{
  if (standby_) { return static_cast<std::uint8_t>(detail::view_mode::standby); }
  return static_cast<std::uint8_t>(access_ == buffer_access::read ? detail::view_mode::read_only
                                                                  : detail::view_mode::read_write);
}

std::uint64_t shared_buffer::wait_lease(std::chrono::milliseconds wait)
{
  auto const what = "wait for the write lease of buffer '" + name_ + "'";
  if (!session_) { throw rmmd::logic_error("rmmd: an empty shared_buffer has no lease"); }
  if (!standby_) {
    if (lease_generation_ != 0) { return lease_generation_; }
    throw rmmd::precondition_error("rmmd: " + what +
                                   ": it was not opened as a standby (open_options::standby)");
  }
  if (lease_generation_ == 0) {
    using ms            = std::chrono::milliseconds;
    using steady        = std::chrono::steady_clock;
    auto left           = std::clamp(wait, ms(0), ms(0xffffffff));
    auto const deadline = steady::now() + left;
    v1::WaitBufferLeaseResponse response;
    while (true) {
      auto status = detail::impl_of(*session_).wait_buffer_lease(id_, left, &response);
      if (status.ok()) { break; }
      left = std::chrono::ceil<ms>(deadline - steady::now());
      // The daemon holds a call at most some minutes: ask again with what
      // is left (the place in line stays).
      bool const ended_early = status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                               daemon_names_it(status) && left > std::chrono::seconds(1);
      if (!ended_early) { refused(status, what); }
    }
    lease_generation_ = response.lease_generation();
  }
  // Granted: the same mapping becomes writable (data() stays).
  detail::impl_of(*session_).buffers().upgrade(id_);
  return lease_generation_;
}

void shared_buffer::send_close() const noexcept
{
  auto status =
      detail::impl_of(*session_).close_buffer(id_, static_cast<v1::BufferHold>(hold_kind()));
  // UNAVAILABLE: the daemon is gone, and the hold with it.
  if (!status.ok() && status.error_code() != grpc::StatusCode::UNAVAILABLE) {
    rmmd::detail::stderr_line(
        "rmmd: closing buffer '%s' failed: %s; the daemon lets go of it when the "
        "session closes\n",
        name_.c_str(),
        status.error_message().c_str());
  }
}

}  // namespace rmmd
