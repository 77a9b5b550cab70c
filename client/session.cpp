#include <rmmd/session.hpp>

#include "client/detail/device_scope.hpp"
#include "client/detail/process_exit.hpp"
#include "client/detail/session_impl.hpp"
#include "client/detail/welcome_parser.hpp"
#include "tools/gpu/gpu_identity.hpp"
#include "tools/runtime/runtime_dir.hpp"
#include "tools/socket/fd_passing.hpp"

#include <rmm/process_is_exiting.hpp>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace rmmd {
namespace detail {
namespace {

/// True on a session's reader thread (read_unasked), which may drop packed
/// blocks and keeps the device it made current for that (drop_blocks).
thread_local bool on_reader_thread = false;

std::string to_hex(std::string_view bytes)
{
  static constexpr char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 0xf]);
  }
  return out;
}

int connect_session_socket(std::filesystem::path const& dir)
{
  auto const path = dir / "rmmd-session.sock";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.native().size() >= sizeof(addr.sun_path)) {
    throw rmmd::logic_error("rmmd: runtime directory path too long: " + dir.string());
  }
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) { throw session_error(std::string("rmmd: socket: ") + std::strerror(errno)); }
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    if (err == EACCES || err == EPERM) {
      throw permission_error("rmmd: no permission to connect to " + path.string() +
                             ": ask the operator to add you to the rmmd group");
    }
    throw session_error("rmmd: no daemon is listening at " + path.string() + " (" +
                        std::strerror(err) +
                        "): is rmmd running? (systemctl status rmmd), or set RMMD_RUNTIME_DIR");
  }
  return fd;
}

}  // namespace

[[noreturn]] void throw_status(grpc::Status const& status, std::string_view what)
{
  // An empty `what`: the daemon's message names the request itself.
  auto message = what.empty() ? "rmmd: " + status.error_message()
                              : "rmmd: " + std::string(what) + ": " + status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
      throw rmmd::logic_error(message);
    case grpc::StatusCode::FAILED_PRECONDITION:
      throw rmmd::precondition_error(message);
    case grpc::StatusCode::NOT_FOUND:
      throw rmmd::not_found_error(message);
    case grpc::StatusCode::ALREADY_EXISTS:
      throw rmmd::already_exists_error(message);
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      // what() reads "std::bad_alloc: out_of_memory: rmmd: ...", as RMM's own.
      throw rmm::out_of_memory(message);
    case grpc::StatusCode::PERMISSION_DENIED:
      throw permission_error(message);
    case grpc::StatusCode::UNAUTHENTICATED:
      throw session_error(message);
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      throw session_error(message + " (the daemon is gone or not answering)");
    default:
      throw rmm::bad_alloc(message);
  }
}

session_impl::session_impl(session::options opts) : options(std::move(opts))
{
  socket_fd_ = connect_session_socket(options.runtime_dir);
  v1::SessionHello hello;
  hello.set_protocol_version(1);
  hello.set_client_name(options.client_name);
  auto bytes = hello.SerializeAsString();
  // A daemon that refuses the connection before it reads the hello (a uid at
  // its admission limit) has sent its reason already: read it even if the
  // send failed, and say why the send failed only when there is none.
  int send_error = 0;
  if (::send(socket_fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(bytes.size())) {
    send_error = errno;
  }
  // The welcome comes at once; do not wait forever on a daemon that hangs.
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  ::setsockopt(socket_fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::vector<char> buffer(1 << 16);
  std::array<int, 64> received_fds{};
  auto const received = fd_passing::receive_datagram(socket_fd_, buffer, received_fds);
  auto const n        = received.bytes;
  std::vector<int> fds(received_fds.begin(), received_fds.begin() + received.fd_count);
  auto fail = [&](auto error) {
    for (int fd : fds) { ::close(fd); }
    ::close(socket_fd_);
    throw error;
  };
  if (n <= 0 && send_error != 0) {
    fail(session_error(std::string("rmmd: sending the session hello failed: ") +
                       std::strerror(send_error)));
  }
  if (n <= 0) {
    fail(session_error("rmmd: the daemon closed the session socket without a welcome"));
  }
  if (received.truncated || received.fds_truncated) {
    fail(
        session_error("rmmd: the daemon's welcome is larger than this client takes (64 KiB, 64 "
                      "pool fds)"));
  }
  v1::SessionWelcome welcome;
  auto read = read_welcome(std::span(buffer.data(), static_cast<std::size_t>(n)), fds, welcome);
  if (read.status == welcome_status::permission_denied) { fail(permission_error(read.message)); }
  if (read.status != welcome_status::ok) { fail(session_error(read.message)); }
  for (int fd : fds) {  // attached, but named by no pool
    if (std::find(read.pool_fds.begin(), read.pool_fds.end(), fd) == read.pool_fds.end()) {
      ::close(fd);
    }
  }
  id         = welcome.session_id();
  token_hex_ = to_hex(welcome.token());
  pool_fds_  = std::move(read.pool_fds);
  fabric_handles_.resize(static_cast<std::size_t>(welcome.pools_size()));
  for (auto const& p : welcome.pools()) {
    pools_.push_back(pool_info{
        .id             = p.id(),
        .name           = p.name(),
        .device         = p.device(),
        .backend        = p.backend() == v1::BACKEND_CUDA ? backend_kind::cuda : backend_kind::host,
        .capacity_bytes = p.capacity_bytes(),
        .has_fabric_handle = !p.fabric_handle().empty(),
        .max_alignment     = p.max_alignment(),
        .pinnable          = p.pinnable(),
        .gpu_uuid          = p.gpu_uuid(),
        .pci_bus_id        = p.pci_bus_id()});
    if (p.id() < fabric_handles_.size()) { fabric_handles_[p.id()] = p.fabric_handle(); }
  }
  // The hello is done: from here the socket carries the session's calls and
  // its close ends the session. A call waits for its reply in a blocking
  // receive (no poll first: one system call fewer per call), which wakes a
  // few times per call_timeout (at most every 50 ms) to look at the call's
  // own deadline: a call overruns it by a quarter of call_timeout at most.
  auto const slice_us = std::clamp<std::int64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(options.call_timeout).count() / 4,
      1000,
      50'000);
  timeval slice{.tv_sec = 0, .tv_usec = static_cast<suseconds_t>(slice_us)};
  ::setsockopt(socket_fd_, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof(slice));
  daemon_takes_calls_ = welcome.session_calls();
  session_calls_ = daemon_takes_calls_ && options.lease_calls == call_transport::session_socket;

  grpc::ChannelArguments args;
  if (welcome.max_message_bytes() > 0) {
    args.SetMaxSendMessageSize(static_cast<int>(welcome.max_message_bytes()));
  }
  channel_ = grpc::CreateCustomChannel("unix:" + (options.runtime_dir / "rmmd.sock").string(),
                                       grpc::InsecureChannelCredentials(),
                                       args);
  stub_    = v1::Rmmd::NewStub(channel_);
  releases_->session = this;
}

session_impl::~session_impl()
{
  if (reader_.joinable()) {
    reader_.request_stop();
    ::eventfd_write(reader_wake_fd_, 1);
    reader_.join();
  }
  if (reader_wake_fd_ >= 0) { ::close(reader_wake_fd_); }
  {
    // The host functions of shared buffers close what their stream stopped
    // using: the daemon may free a buffer only after that, so they must have
    // run before the session (and with it every hold) goes. Streams reach
    // them unless the process is exiting (then its end releases it all).
    std::unique_lock lock(releases_->mutex);
    if (!process_is_exiting()) {
      releases_->buffer_jobs_done.wait_for(
          lock, options.call_timeout, [this] { return releases_->buffer_jobs == 0; });
    }
    // Host functions that run from now on (only while the process exits: a
    // resource waits for its own before it lets its session go) drop their calls.
    releases_->session = nullptr;
  }
  // Imports first: an imported pool must go before the fd it came from. No
  // CUDA call while the process exits: the process's end releases them.
  if (!process_is_exiting()) {
    drop_all_blocks();  // before the socket's close lets the daemon free them
    for (auto& [id, pool] : cuda_pools_) { cudaMemPoolDestroy(pool); }
    for (auto id : pinned_) { cudaHostUnregister(mappings_.at(id).first); }
  }
  for (auto& [id, m] : mappings_) { ::munmap(m.first, m.second); }
  for (int fd : pool_fds_) {
    if (fd >= 0) { ::close(fd); }
  }
  // Closing the session socket ends the session: the daemon frees what is left.
  ::close(socket_fd_);
}

std::unique_ptr<grpc::ClientContext> session_impl::context() const
{
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("rmmd-token", token_hex_);
  ctx->set_deadline(std::chrono::system_clock::now() + options.call_timeout);
  return ctx;
}

class session_impl::call_lock {
 public:
  explicit call_lock(session_impl& s) : s_(s)
  {
    s_.call_mutex_.lock();
  }
  call_lock(call_lock const&)            = delete;
  call_lock& operator=(call_lock const&) = delete;
  ~call_lock()
  {
    s_.call_mutex_.unlock();
    s_.drain_releases();
  }

 private:
  session_impl& s_;
};

void session_impl::drain_releases() noexcept
{
  // A host function that found the socket taken left its id queued for the
  // holder; the holder looks again once it has let go (here), so no id is
  // left behind.
  while (true) {
    std::lock_guard queue_lock(releases_->mutex);
    if (releases_->calls.empty() || !call_mutex_.try_lock()) { return; }
    std::vector<queued_call> calls;
    calls.swap(releases_->calls);
    send_releases_locked(calls);
    call_mutex_.unlock();
  }
}

void session_impl::free_when_reached(release_queue& queue, std::uint64_t id) noexcept
{
  send_when_reached(queue, queued_call{.what = queued_call::kind::free, .id = id});
}

void session_impl::send_when_reached(release_queue& queue, queued_call call) noexcept
{
  std::lock_guard queue_lock(queue.mutex);
  auto* self = queue.session;
  if (self == nullptr) { return; }
  try {
    queue.calls.push_back(call);
  } catch (std::bad_alloc const&) {
    return;  // the daemon reclaims it with the session
  }
  // Whoever holds the socket sends the queue before letting go of it.
  if (!self->call_mutex_.try_lock()) { return; }
  std::vector<queued_call> calls;
  calls.swap(queue.calls);
  self->send_releases_locked(calls);
  self->call_mutex_.unlock();
}

void session_impl::send_releases_locked(std::vector<queued_call>& calls) noexcept
{
  using kind = queued_call::kind;
  for (auto const& q : calls) {
    try {
      v1::SessionCall c;
      switch (q.what) {
        case kind::free:
          forget_packed_lease(q.id);
          c.mutable_free()->set_allocation_id(q.id);
          break;
        case kind::publish_buffer:
          c.mutable_publish_buffer()->set_buffer_id(q.id);
          break;
        case kind::close_buffer:
          c.mutable_close_buffer()->set_buffer_id(q.id);
          break;
        case kind::drop_block:
          c.mutable_blocks_dropped()->add_block_ids(q.id);
          break;
      }
      grpc::Status sent;
      if (session_calls_) {
        // The daemon answers only if the call fails; call_locked prints that.
        c.set_reply_only_on_error(true);
        sent = send_locked(c, std::chrono::steady_clock::now() + options.call_timeout);
      } else {
        auto ctx = context();
        switch (q.what) {
          case kind::free: {
            v1::FreeResponse response;
            sent = stub_->Free(ctx.get(), c.free(), &response);
            break;
          }
          case kind::publish_buffer: {
            v1::PublishBufferResponse response;
            sent = stub_->PublishBuffer(ctx.get(), c.publish_buffer(), &response);
            break;
          }
          case kind::close_buffer: {
            v1::CloseBufferResponse response;
            sent = stub_->CloseBuffer(ctx.get(), c.close_buffer(), &response);
            break;
          }
          case kind::drop_block:
            break;  // only sessions that call on the session socket get packed blocks
        }
      }
      // UNAVAILABLE: the daemon is gone, and with it the lease or the hold.
      if (!sent.ok() && sent.error_code() != grpc::StatusCode::UNAVAILABLE) {
        char const* what = q.what == kind::free             ? "freeing allocation"
                           : q.what == kind::publish_buffer ? "publishing buffer"
                           : q.what == kind::drop_block     ? "dropping packed block"
                                                            : "closing buffer";
        std::fprintf(stderr,
                     "rmmd: %s %llu failed (%s)%s\n",
                     what,
                     static_cast<unsigned long long>(q.id),
                     sent.error_message().c_str(),
                     q.what == kind::publish_buffer
                         ? ""
                         : "; the daemon lets go of it when the session closes");
      }
    } catch (std::exception const&) {
      // Out of memory building the message: the daemon reclaims the lease
      // or the hold with the session.
    }
  }
  calls.clear();
}

grpc::Status session_impl::call(v1::SessionCall& call,
                                v1::SessionReply* reply,
                                std::vector<int>* fds)
{
  grpc::Status status;
  std::vector<std::uint32_t> reclaims;
  std::vector<std::uint64_t> retired;
  {
    call_lock lock(*this);
    {
      // Frees that streams reached go first: the daemon handles a session's
      // calls in order, so this call sees their memory back.
      std::vector<queued_call> calls;
      {
        std::lock_guard queue_lock(releases_->mutex);
        calls.swap(releases_->calls);
      }
      send_releases_locked(calls);
    }
    status = call_locked(call, reply, fds);
    if (status.ok() && reply != nullptr && reply->has_allocate() &&
        reply->allocate().block_id() != 0) {
      // A packed lease is live in its block from its grant on: a RetireBlocks
      // this call heard (dropped below) must not take the block from under it.
      // (Every packed grant comes through here: packing is asked only on the
      // session socket.) A lease that fails later is freed, which forgets it.
      count_packed_lease(reply->allocate().allocation_id(), reply->allocate().block_id());
    }
    // Leases granted to calls that had given up waiting: nobody will free them
    // but us (they would count against our quota until the session ends).
    while (!orphans_.empty()) {
      v1::SessionCall free_call;
      free_call.mutable_free()->set_allocation_id(orphans_.back());
      orphans_.pop_back();
      v1::SessionReply ignored;
      static_cast<void>(call_locked(free_call, &ignored));
    }
    reclaims.swap(reclaims_heard_);
    retired.swap(retired_heard_);
  }
  if (!retired.empty()) { drop_blocks(retired); }
  if (!reclaims.empty()) { run_reclaim_watches(reclaims); }
  return status;
}

void session_impl::take_unasked_locked(v1::SessionReply const& reply,
                                       std::vector<std::uint32_t>& reclaims)
{
  if (reply.has_reclaim()) {
    reclaims.push_back(reply.reclaim().pool_id());
  } else if (reply.has_retire_blocks()) {
    auto const& ids = reply.retire_blocks().block_ids();
    retired_heard_.insert(retired_heard_.end(), ids.begin(), ids.end());
  } else if (reply.has_error()) {
    // The answer to an earlier call that did not wait: a Free sent with
    // free_later() that failed, or a call that timed out.
    std::fprintf(stderr,
                 "rmmd: an earlier call on the session socket failed: %s\n",
                 reply.error().message().c_str());
  } else if (reply.has_allocate()) {
    // A lease granted to a call that timed out is ours to give back.
    orphans_.push_back(reply.allocate().allocation_id());
  }
}

void session_impl::run_reclaim_watches(std::vector<std::uint32_t> const& reclaims) noexcept
{
  std::lock_guard lock(watches_mutex_);
  for (auto const& [id, w] : watches_) {
    if (std::find(reclaims.begin(), reclaims.end(), w.pool_id) == reclaims.end()) { continue; }
    try {
      w.on_request(w.pool_id);
    } catch (std::exception const& e) {
      std::fprintf(stderr, "rmmd: answering the daemon's reclaim request: %s\n", e.what());
    }
  }
}

std::uint64_t session_impl::watch_reclaims(std::uint32_t pool_id,
                                           std::function<void(std::uint32_t)> on_request)
{
  std::lock_guard lock(watches_mutex_);
  start_reader_locked();
  auto const id = next_watch_++;
  watches_.emplace(id, reclaim_watch{.pool_id = pool_id, .on_request = std::move(on_request)});
  return id;
}

void session_impl::start_reader_locked()
{
  if (reader_.joinable()) { return; }
  reader_wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (reader_wake_fd_ < 0) {
    throw rmm::bad_alloc(std::string("rmmd: eventfd for the session's reader: ") +
                         std::strerror(errno));
  }
  reader_ = std::jthread([this](std::stop_token stop) { read_unasked(std::move(stop)); });
}

void session_impl::unwatch_reclaims(std::uint64_t watch_id) noexcept
{
  std::lock_guard lock(watches_mutex_);
  watches_.erase(watch_id);
}

void session_impl::read_unasked(std::stop_token stop) noexcept
{
  on_reader_thread = true;
  std::array<char, 4096> buffer;
  std::array<int, 4> attached{};
  while (!stop.stop_requested()) {
    std::array<pollfd, 2> watched{pollfd{.fd = socket_fd_, .events = POLLIN, .revents = 0},
                                  pollfd{.fd = reader_wake_fd_, .events = POLLIN, .revents = 0}};
    if (::poll(watched.data(), watched.size(), -1) < 0) {
      if (errno == EINTR) { continue; }
      return;
    }
    if (watched[1].revents != 0) { return; }
    // The daemon is gone: the next call says so.
    if ((watched[0].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) { return; }
    if ((watched[0].revents & POLLIN) == 0) { continue; }
    std::vector<std::uint32_t> reclaims;
    std::vector<std::uint64_t> retired;
    try {
      // A call in progress reads its own reply (and whatever came before it):
      // this waits for it, then takes what is left.
      call_lock lock(*this);
      while (true) {
        auto const got = fd_passing::receive_datagram(socket_fd_, buffer, attached, MSG_DONTWAIT);
        fd_passing::close_fds(attached, got.fd_count);
        if (got.bytes < 0 && errno == EINTR) { continue; }
        if (got.bytes <= 0) { break; }  // nothing more now, or closed (poll says so next)
        v1::SessionReply reply;
        if (!reply.ParseFromArray(buffer.data(), static_cast<int>(got.bytes))) { continue; }
        take_unasked_locked(reply, reclaims);
      }
      retired.swap(retired_heard_);
    } catch (std::exception const&) {
      continue;  // out of memory: the request's deadline passes, nothing worse
    }
    if (!retired.empty()) { drop_blocks(retired); }
    if (!reclaims.empty()) { run_reclaim_watches(reclaims); }
  }
}

bool session_impl::wait_socket(short events, std::chrono::steady_clock::time_point deadline) const
{
  while (true) {
    auto const left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) { return false; }
    pollfd p{.fd = socket_fd_, .events = events, .revents = 0};
    int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready > 0) { return true; }
    if (ready == 0) { return false; }
    if (errno != EINTR) { return true; }  // let the send or receive report it
  }
}

grpc::Status session_impl::send_locked(v1::SessionCall& call,
                                       std::chrono::steady_clock::time_point deadline)
{
  call.set_tag(++last_tag_);
  auto const bytes = call.SerializeAsString();
  while (true) {
    auto n = ::send(socket_fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(bytes.size())) { return grpc::Status::OK; }
    if (n < 0 && errno == EINTR) { continue; }
    if (n < 0 && errno == EAGAIN) {
      // The daemon is behind on this session's calls: wait, within the deadline.
      if (!wait_socket(POLLOUT, deadline)) { return timed_out(); }
      continue;
    }
    return {grpc::StatusCode::UNAVAILABLE,
            std::string("the session socket is closed (") + std::strerror(errno) + ")"};
  }
}

grpc::Status session_impl::timed_out() const
{
  return {grpc::StatusCode::DEADLINE_EXCEEDED,
          "no reply on the session socket within " + std::to_string(options.call_timeout.count()) +
              " ms"};
}

grpc::Status session_impl::call_locked(v1::SessionCall& call,
                                       v1::SessionReply* reply,
                                       std::vector<int>* fds)
{
  auto const deadline = std::chrono::steady_clock::now() + options.call_timeout;
  if (auto sent = send_locked(call, deadline); !sent.ok()) { return sent; }
  std::array<char, 4096> buffer;  // replies are far smaller; left uninitialised
  std::array<int, 4> attached{};  // a BufferFd answer brings one fd
  while (true) {
    // Blocks until a reply comes or the socket's receive timeout (a slice of
    // call_timeout, set after the hello) passes: then EAGAIN, and the
    // deadline decides.
    auto const got = fd_passing::receive_datagram(socket_fd_, buffer, attached, 0);
    auto const n   = got.bytes;
    // Whatever fds did not come with this call's answer are not ours to keep.
    auto drop_fds = [&] { fd_passing::close_fds(attached, got.fd_count); };
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (std::chrono::steady_clock::now() >= deadline) { return timed_out(); }
      continue;
    }
    if (n <= 0) {
      drop_fds();
      return {grpc::StatusCode::UNAVAILABLE, "the daemon closed the session"};
    }
    auto const read = read_reply(std::span(buffer.data(), static_cast<std::size_t>(n)),
                                 call.tag(),
                                 call.call_case(),
                                 *reply);
    if (read.kind != reply_kind::answer || fds == nullptr) { drop_fds(); }
    if (read.kind == reply_kind::invalid) { return read.status; }
    if (read.kind == reply_kind::earlier) {
      // A reclaim request, or the late answer to an earlier call.
      take_unasked_locked(*reply, reclaims_heard_);
      continue;
    }
    if (fds != nullptr) { fds->assign(attached.begin(), attached.begin() + got.fd_count); }
    return read.status;
  }
}

grpc::Status session_impl::allocate(v1::AllocateRequest const& request,
                                    v1::AllocateResponse* response)
{
  if (!session_calls_) {
    auto ctx = context();
    return stub_->Allocate(ctx.get(), request, response);
  }
  v1::SessionCall c;
  *c.mutable_allocate() = request;
  v1::SessionReply reply;
  auto status = call(c, &reply);
  if (status.ok()) { *response = std::move(*reply.mutable_allocate()); }
  return status;
}

grpc::Status session_impl::free(v1::FreeRequest const& request)
{
  // Before the call: a RetireBlocks that the call hears is handled before it
  // returns, and must find this lease gone from its block.
  auto const block = forget_packed_lease(request.allocation_id());
  grpc::Status status;
  if (!session_calls_) {
    v1::FreeResponse response;
    auto ctx = context();
    status   = stub_->Free(ctx.get(), request, &response);
  } else {
    v1::SessionCall c;
    *c.mutable_free() = request;
    v1::SessionReply reply;
    status = call(c, &reply);
  }
  auto const code = status.error_code();
  if (block != 0 && (code == grpc::StatusCode::INVALID_ARGUMENT ||
                     code == grpc::StatusCode::FAILED_PRECONDITION)) {
    // Refused, so not freed (a release event the daemon could not use): the
    // lease is still live in its block.
    count_packed_lease(request.allocation_id(), block);
  }
  return status;
}

grpc::Status session_impl::ping()
{
  if (!session_calls_) {
    return {grpc::StatusCode::FAILED_PRECONDITION, "this session makes no session-socket calls"};
  }
  v1::SessionCall c;
  c.mutable_ping();
  v1::SessionReply reply;
  return call(c, &reply);
}

std::vector<std::uint32_t> session_impl::report_carved(void const* reporter,
                                                       carved_usage const& usage)
{
  std::lock_guard lock(carved_mutex_);
  carved_[usage.pool_id][reporter] = usage;
  return send_carved_locked(usage.pool_id);
}

void session_impl::forget_reporter(void const* reporter, std::uint32_t pool_id) noexcept
{
  std::lock_guard lock(carved_mutex_);
  auto it = carved_.find(pool_id);
  if (it == carved_.end() || it->second.erase(reporter) == 0) { return; }
  try {
    static_cast<void>(send_carved_locked(pool_id));
  } catch (std::exception const&) {
    // The daemon is gone, or busy: its figure corrects itself at the next report.
  }
}

std::vector<std::uint32_t> session_impl::send_carved_locked(std::uint32_t pool_id)
{
  carved_usage sum{.pool_id = pool_id};
  for (auto const& [reporter, u] : carved_[pool_id]) {
    sum.bytes += u.bytes;
    sum.allocation_count += u.allocation_count;
    sum.slab_bytes += u.slab_bytes;
    sum.reclaimable_bytes += u.reclaimable_bytes;
  }
  return send_usage({sum});
}

std::vector<pool_info> const& session_impl::pools() noexcept
{
  std::call_once(devices_mapped_, [this] {
    // CUDA_VISIBLE_DEVICES renumbers GPUs per process: the daemon's ordinal
    // names another GPU here, or none. Its UUID names the same one everywhere.
    bool const by_uuid = std::any_of(pools_.begin(), pools_.end(), [](pool_info const& p) {
      return p.backend == backend_kind::cuda && !p.gpu_uuid.empty();
    });
    if (!by_uuid) { return; }  // host pools only, or a daemon that sends no UUIDs
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
      cudaGetLastError();
      count = 0;
    }
    std::vector<std::string> uuids;
    for (int d = 0; d < count; ++d) {
      auto id = gpu::identify(d);
      uuids.push_back(id ? id->uuid : std::string());
    }
    for (auto& p : pools_) {
      if (p.backend != backend_kind::cuda) { continue; }
      auto it  = std::find(uuids.begin(), uuids.end(), p.gpu_uuid);
      p.device = it == uuids.end() ? -1 : static_cast<int>(it - uuids.begin());
    }
  });
  return pools_;
}

std::byte* session_impl::host_pool_base(std::uint32_t pool_id)
{
  std::lock_guard lock(map_mutex_);
  if (auto it = mappings_.find(pool_id); it != mappings_.end()) { return it->second.first; }
  if (pool_id >= pools_.size() || pools_[pool_id].backend != backend_kind::host ||
      pool_fds_[pool_id] < 0) {
    throw rmmd::logic_error("rmmd: pool " + std::to_string(pool_id) + " is not a host pool");
  }
  // The daemon aligns offsets; map the pool at an address aligned as strongly,
  // so that an offset aligned to A is an address aligned to A. Reserve room
  // for the alignment, map the pool at the aligned spot, give back the rest.
  auto const size  = pools_[pool_id].capacity_bytes;
  auto const align = std::max<std::size_t>(pools_[pool_id].max_alignment, 4096);
  if (auto why = check_host_pool_fd(pool_fds_[pool_id], size)) {
    throw rmm::bad_alloc("rmmd: mapping host pool '" + pools_[pool_id].name + "' failed: " + *why);
  }
  auto fail = [&](char const* what) {
    throw rmm::bad_alloc("rmmd: mapping host pool '" + pools_[pool_id].name + "' failed (" + what +
                         "): " + std::strerror(errno));
  };
  void* room = ::mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (room == MAP_FAILED) { fail("reserve"); }
  auto const start = reinterpret_cast<std::uintptr_t>(room);
  auto const at    = (start + align - 1) / align * align;
  void* p          = ::mmap(reinterpret_cast<void*>(at),
                   size,
                   PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED,
                   pool_fds_[pool_id],
                   0);
  if (p == MAP_FAILED) {
    ::munmap(room, size + align);
    fail("map");
  }
  if (at > start) { ::munmap(room, at - start); }
  if (auto tail = start + size + align - (at + size); tail > 0) {
    ::munmap(reinterpret_cast<void*>(at + size), tail);
  }
  mappings_.emplace(pool_id, std::pair{static_cast<std::byte*>(p), size});
  return static_cast<std::byte*>(p);
}

std::byte* session_impl::pinned_host_pool_base(std::uint32_t pool_id)
{
  auto* base = host_pool_base(pool_id);
  std::lock_guard lock(map_mutex_);
  if (pinned_.contains(pool_id)) { return base; }
  auto const& pool = pools_[pool_id];
  if (!pool.pinnable) {
    throw rmmd::logic_error("rmmd: host pool '" + pool.name +
                            "' is not pinnable: the daemon gives its free pages back to the "
                            "kernel, which a pinned mapping cannot follow; start rmmd with "
                            "--host-pool-pinned=on, or use rmmd::host_memory_resource");
  }
  // Once per session: about 0.1 s per GiB (measured on an H100), and it
  // commits the whole pool's RAM in this process's page tables.
  auto err = cudaHostRegister(
      base, pool.capacity_bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw rmm::bad_alloc("rmmd: page-locking host pool '" + pool.name + "' (" +
                         std::to_string(pool.capacity_bytes) +
                         " bytes, cudaHostRegister) failed: " + cudaGetErrorName(err) +
                         "; check RLIMIT_MEMLOCK (ulimit -l)");
  }
  // Kernels get the host address itself; that needs a GPU that can use host
  // pointers of registered memory directly (every GPU with unified addressing).
  void* device_ptr = nullptr;
  err              = cudaHostGetDevicePointer(&device_ptr, base, 0);
  if (err != cudaSuccess || device_ptr != base) {
    cudaGetLastError();
    cudaHostUnregister(base);
    throw rmmd::logic_error("rmmd: this GPU cannot use the host pool's addresses directly (" +
                            std::string(cudaGetErrorName(err)) +
                            "); use rmmd::host_memory_resource and copy");
  }
  pinned_.insert(pool_id);
  return base;
}

cudaMemPool_t session_impl::cuda_pool(std::uint32_t pool_id)
{
  std::lock_guard lock(map_mutex_);
  if (auto it = cuda_pools_.find(pool_id); it != cuda_pools_.end()) { return it->second; }
  if (pool_id >= pools_.size() || pools_[pool_id].backend != backend_kind::cuda) {
    throw rmmd::logic_error("rmmd: pool " + std::to_string(pool_id) + " is not a CUDA pool");
  }
  cudaMemPool_t pool{};
  cudaError_t err{};
  if (options.import_by_fabric) {
    auto const& handle = fabric_handles_[pool_id];
    if (handle.size() != sizeof(cudaMemFabricHandle_t)) {
      throw rmmd::logic_error("rmmd: pool '" + pools_[pool_id].name +
                              "' has no fabric handle (the daemon found no IMEX channel, or runs "
                              "with --fabric=off; see its start-up log)");
    }
    cudaMemFabricHandle_t fabric{};
    std::memcpy(&fabric, handle.data(), sizeof(fabric));
    err = cudaMemPoolImportFromShareableHandle(&pool, &fabric, cudaMemHandleTypeFabric, 0);
  } else {
    if (pool_fds_[pool_id] < 0) {
      throw rmmd::logic_error("rmmd: pool '" + pools_[pool_id].name + "' came without a pool fd");
    }
    err = cudaMemPoolImportFromShareableHandle(
        &pool,
        reinterpret_cast<void*>(static_cast<std::uintptr_t>(pool_fds_[pool_id])),
        cudaMemHandleTypePosixFileDescriptor,
        0);
  }
  if (err != cudaSuccess) {
    throw rmm::bad_alloc("rmmd: importing CUDA pool '" + pools_[pool_id].name +
                         "' failed: " + cudaGetErrorName(err));
  }
  cuda_pools_.emplace(pool_id, pool);
  return pool;
}

}  // namespace detail

std::filesystem::path session::default_runtime_dir()
{
  return runtime::resolve_runtime_dir();
}

session::session() : session(options{}) {}

session::session(options opts) : impl_(std::make_shared<detail::session_impl>(std::move(opts))) {}

std::uint64_t session::id() const noexcept
{
  return impl_->id;
}

std::vector<pool_info> const& session::pools() const noexcept
{
  return impl_->pools();
}

pool_info const& session::pool(std::string_view name) const
{
  std::string known;
  for (auto const& p : impl_->pools()) {
    if (p.name == name) { return p; }
    known += (known.empty() ? "" : ", ") + p.name;
  }
  throw rmmd::logic_error("rmmd: no pool named '" + std::string(name) +
                          "'; this daemon serves: " + known);
}

pool_info const& session::device_pool(int device) const
{
  std::string known;
  for (auto const& p : impl_->pools()) {
    if (p.backend != backend_kind::cuda) { continue; }
    if (p.device == device) { return p; }
    known += (known.empty() ? "" : ", ") + p.name + " on " +
             (p.gpu_uuid.empty() ? "device " + std::to_string(p.device) : p.gpu_uuid) +
             (p.device < 0 ? " (not visible to this process)" : "");
  }
  std::string mine = "CUDA device " + std::to_string(device);
  if (auto id = gpu::identify(device)) { mine += " (" + id->uuid + ", " + id->pci_bus_id + ")"; }
  char const* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  throw rmmd::logic_error(
      "rmmd: the daemon serves no pool on this process's " + mine +
      "; it serves: " + (known.empty() ? "no GPU pool (no GPU, or --backend=host)" : known) +
      (visible != nullptr ? "; this process has CUDA_VISIBLE_DEVICES=" + std::string(visible)
                          : std::string()));
}

cudaMemPool_t session::cuda_pool(std::uint32_t pool_id) const
{
  return impl_->cuda_pool(pool_id);
}

pool_info const& session::host_pool() const
{
  for (auto const& p : impl_->pools()) {
    if (p.backend == backend_kind::host) { return p; }
  }
  throw rmmd::logic_error("rmmd: this daemon serves no host pool");
}

lease session::allocate(std::uint32_t pool_id, std::size_t bytes, std::size_t alignment) const
{
  return impl_->lease_memory(pool_id, bytes, alignment, false).granted;
}

namespace detail {

session_impl::granted_lease session_impl::lease_memory(std::uint32_t pool_id,
                                                       std::size_t bytes,
                                                       std::size_t alignment,
                                                       bool may_pack)
{
  v1::AllocateRequest request;
  request.set_pool_id(pool_id);
  request.set_size(bytes);
  request.set_alignment(alignment);
  // Packed blocks are retired on the session socket, and dropped there.
  bool const packable = may_pack && session_calls_;
  request.set_may_pack(packable);
  v1::AllocateResponse response;
  auto status = allocate(request, &response);
  if (!status.ok()) {
    detail::throw_status(status, "allocate " + std::to_string(bytes) + " bytes");
  }
  auto const& pools = pools_unmapped();
  auto checked =
      pool_id < pools.size()
          ? detail::check_allocation(response,
                                     {.host_pool     = pools[pool_id].backend == backend_kind::host,
                                      .pool_capacity = pools[pool_id].capacity_bytes,
                                      .bytes         = bytes,
                                      .alignment     = alignment,
                                      .may_pack      = packable})
          : grpc::Status(grpc::StatusCode::INTERNAL,
                         "the daemon granted a pool it did not describe");
  if (!checked.ok()) {
    v1::FreeRequest give_back;  // not usable, and ours to free all the same
    give_back.set_allocation_id(response.allocation_id());
    static_cast<void>(free(give_back));
    detail::throw_status(checked, "allocate " + std::to_string(bytes) + " bytes");
  }
  granted_lease granted{
      .granted      = {.id          = response.allocation_id(),
                       .bytes       = response.size(),
                       .host_offset = response.has_host() ? response.host().offset() : 0},
      .block_id     = response.block_id(),
      .block_offset = response.block_offset()};
  auto& out = granted.granted;
  if (response.has_cuda()) {
    auto const& data = response.cuda().export_data();
    if (data.size() != out.cuda_export.size()) {
      throw rmm::bad_alloc("rmmd: the daemon's pointer export data has " +
                           std::to_string(data.size()) + " bytes, expected " +
                           std::to_string(out.cuda_export.size()));
    }
    std::memcpy(out.cuda_export.data(), data.data(), data.size());
  }
  return granted;
}

void* session_impl::packed_block_base(std::uint32_t pool_id,
                                      std::uint64_t block,
                                      void const* export_data)
{
  {
    // RetireBlocks must be heard while no call reads the socket.
    std::lock_guard lock(watches_mutex_);
    start_reader_locked();
  }
  // One import per block: the lock is held across it (once per block), so
  // that threads whose leases lie in a block they have not seen yet do not
  // each import it. The daemon retires a block only once it holds none of
  // our leases, so no drop of it runs meanwhile.
  std::lock_guard lock(packed_mutex_);
  if (auto it = packed_.find(block); it != packed_.end()) { return it->second.base; }
  void* base = nullptr;
  auto data  = static_cast<cudaMemPoolPtrExportData const*>(export_data);
  if (auto err = cudaMemPoolImportPointer(
          &base, cuda_pool(pool_id), const_cast<cudaMemPoolPtrExportData*>(data));
      err != cudaSuccess) {
    cudaGetLastError();
    throw rmm::bad_alloc("rmmd: importing packed block " + std::to_string(block) + " of pool " +
                         std::to_string(pool_id) + " failed: " + cudaGetErrorName(err));
  }
  try {
    packed_.emplace(block, packed_import{.base = base, .pool_id = pool_id});
  } catch (...) {
    // Unrecorded, the import would outlive the daemon's block (a retired
    // block never imported is dropped at once): free it, the lease with it.
    if (cudaFree(base) != cudaSuccess) { cudaGetLastError(); }
    throw;
  }
  return base;
}

void session_impl::count_packed_lease(std::uint64_t lease, std::uint64_t block) noexcept
{
  std::lock_guard live(packed_live_mutex_);
  try {
    if (packed_lease_block_.emplace(lease, block).second) { ++packed_block_live_[block]; }
  } catch (std::bad_alloc const&) {
    // Uncounted (or recorded without its block's tally, which
    // forget_packed_lease() tolerates): a RetireBlocks of its block would be
    // obeyed, as before leases were counted.
  }
}

std::uint64_t session_impl::forget_packed_lease(std::uint64_t lease) noexcept
{
  std::lock_guard live(packed_live_mutex_);
  auto it = packed_lease_block_.find(lease);
  if (it == packed_lease_block_.end()) { return 0; }
  auto const block = it->second;
  if (auto b = packed_block_live_.find(block); b != packed_block_live_.end()) {
    if (--b->second == 0) { packed_block_live_.erase(b); }
  }
  packed_lease_block_.erase(it);
  return block;
}

void session_impl::drop_blocks(std::vector<std::uint64_t> const& blocks) noexcept
{
  // At exit the daemon frees every block with the session; CUDA may be going.
  if (process_is_exiting()) { return; }
  // The reader thread is ours: it keeps whichever device it made current.
  auto const then =
      on_reader_thread ? device_scope::afterwards::keep : device_scope::afterwards::restore;
  for (auto block : blocks) {
    packed_import import;
    cudaStream_t stream = nullptr;
    int device          = 0;
    {
      std::lock_guard lock(packed_mutex_);
      {
        // The daemon retires only blocks whose every Free it handled, and a
        // Free is sent only after its stream passed the lease's last use. A
        // block this process still uses stays imported (and the daemon keeps
        // it) until the session ends: freeing the import under a running
        // kernel would end the process.
        std::lock_guard live(packed_live_mutex_);
        if (auto b = packed_block_live_.find(block); b != packed_block_live_.end()) {
          std::fprintf(stderr,
                       "rmmd: the daemon asked back packed block %llu, which still holds %zu of "
                       "this process's allocations; it stays until the session ends\n",
                       static_cast<unsigned long long>(block),
                       b->second);
          continue;
        }
      }
      auto it = packed_.find(block);
      if (it == packed_.end()) {
        // Never imported here (its one lease's import failed): nothing to free.
        send_when_reached(*releases_,
                          queued_call{.what = queued_call::kind::drop_block, .id = block});
        continue;
      }
      import = it->second;
      packed_.erase(it);
      device = pools()[import.pool_id].device;
      try {
        auto& s = drop_streams_[device];
        if (s == nullptr) {
          device_scope scope(device, then);
          if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
            cudaGetLastError();
            s = nullptr;
          }
        }
        stream = s;
      } catch (std::bad_alloc const&) {
        stream = nullptr;  // cudaFree below waits for the device instead
      }
    }
    // Every lease of the block was freed, each after its stream passed its
    // last use: the import is idle. Free it in the order of a stream of our
    // own, wait for that, and only then may the daemon free the block.
    cudaError_t err = cudaSuccess;
    {
      device_scope scope(device, then);
      err = stream != nullptr ? cudaFreeAsync(import.base, stream) : cudaFree(import.base);
      if (err == cudaSuccess && stream != nullptr) { err = cudaStreamSynchronize(stream); }
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (cuda_is_unloading(err)) { return; }  // the process is ending after all
      std::fprintf(stderr,
                   "rmmd: freeing the import of packed block %llu failed (%s); the daemon keeps it "
                   "until the session closes\n",
                   static_cast<unsigned long long>(block),
                   cudaGetErrorName(err));
      continue;
    }
    send_when_reached(*releases_, queued_call{.what = queued_call::kind::drop_block, .id = block});
  }
}

void session_impl::drop_all_blocks() noexcept
{
  std::lock_guard lock(packed_mutex_);
  // On the thread that ends the session: its current device is the caller's.
  for (auto const& [block, import] : packed_) {
    device_scope scope(pools()[import.pool_id].device);
    if (cudaFree(import.base) != cudaSuccess) { cudaGetLastError(); }
  }
  packed_.clear();
  for (auto const& [device, stream] : drop_streams_) {
    device_scope scope(device);
    if (cudaStreamDestroy(stream) != cudaSuccess) { cudaGetLastError(); }
  }
  drop_streams_.clear();
}

}  // namespace detail

void session::free(std::uint64_t allocation_id) const
{
  v1::FreeRequest request;
  request.set_allocation_id(allocation_id);
  auto status = impl_->free(request);
  if (!status.ok()) {
    detail::throw_status(status, "free allocation " + std::to_string(allocation_id));
  }
}

bool session::free(std::uint64_t allocation_id, cudaIpcEventHandle_t const& after) const
{
  v1::FreeRequest request;
  request.set_allocation_id(allocation_id);
  request.set_release_event(reinterpret_cast<char const*>(&after), sizeof(after));
  auto status = impl_->free(request);
  if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) { return false; }
  if (!status.ok()) {
    detail::throw_status(status, "free allocation " + std::to_string(allocation_id));
  }
  return true;
}

std::vector<std::uint32_t> session::report_usage(std::vector<carved_usage> const& usage) const
{
  return impl_->send_usage(usage);
}

std::uint64_t session::watch_reclaims(std::uint32_t pool_id,
                                      std::function<void(std::uint32_t)> on_request) const
{
  return impl_->watch_reclaims(pool_id, std::move(on_request));
}

void session::unwatch_reclaims(std::uint64_t watch_id) const noexcept
{
  impl_->unwatch_reclaims(watch_id);
}

namespace detail {

std::vector<std::uint32_t> session_impl::send_usage(std::vector<carved_usage> const& usage)
{
  v1::UsageReport request;
  for (auto const& u : usage) {
    auto* p = request.add_pools();
    p->set_pool_id(u.pool_id);
    p->set_bytes(u.bytes);
    p->set_allocation_count(u.allocation_count);
    p->set_slab_bytes(u.slab_bytes);
    p->set_reclaimable_bytes(u.reclaimable_bytes);
  }
  v1::UsageReply reply;
  auto ctx    = context();
  auto status = stub_->ReportUsage(ctx.get(), request, &reply);
  if (!status.ok()) {
    // The daemon's refusals name the call already; gRPC's own do not.
    throw_status(status, status.error_message().starts_with("report usage") ? "" : "report usage");
  }
  return {reply.trim_pool_ids().begin(), reply.trim_pool_ids().end()};
}

}  // namespace detail

std::byte* session::host_pool_base(std::uint32_t pool_id) const
{
  return impl_->host_pool_base(pool_id);
}

std::byte* session::pinned_host_pool_base(std::uint32_t pool_id) const
{
  return impl_->pinned_host_pool_base(pool_id);
}

}  // namespace rmmd
