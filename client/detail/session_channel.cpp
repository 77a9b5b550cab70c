#include "client/detail/session_channel.hpp"
#include "client/detail/stderr_line.hpp"

#include "client/detail/daemon_message_checks.hpp"
#include "client/detail/process_exit.hpp"
#include "client/detail/session_hello.hpp"
#include "client/detail/usage_reports.hpp"
#include "client/packed_block_imports.hpp"
#include "common/fd_passing.hpp"
#include "common/hex.hpp"
#include "rmmd/v1/errors.pb.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace rmmd::detail {
namespace {

/// True on a session's reader thread (read_unasked).
thread_local bool reader_thread = false;

/// The largest gRPC answer taken: a manifest's 4 MiB bound with room to
/// spare, and a listing of many buffers with their labels.
constexpr int max_receive_bytes = 64 << 20;

/// ABORTED: the daemon a call was meant for was replaced while it waited.
constexpr char const* reconnected_meanwhile = "rmmd: reconnected meanwhile";

bool is_reconnected_meanwhile(grpc::Status const& s)
{
  return s.error_code() == grpc::StatusCode::ABORTED && s.error_message() == reconnected_meanwhile;
}

}  // namespace

std::string unreachable_node(grpc::Status const& status)
{
  if (status.error_details().empty()) { return {}; }
  v1::ErrorDetails details;
  if (!details.ParseFromString(status.error_details())) { return {}; }
  return details.unreachable_node();
}

[[noreturn]] void throw_status(grpc::Status const& status, std::string_view what)
{
  // An empty `what`: the daemon's message names the request itself.
  auto message = what.empty() ? "rmmd: " + status.error_message()
                              : "rmmd: " + std::string(what) + ": " + status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::UNIMPLEMENTED:  // a call this daemon does not know
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
      // This node's daemon answered that another node cannot be reached
      // (its message says so, and where to look): it and the session are fine.
      if (!unreachable_node(status).empty()) { throw session_error(message); }
      throw session_error(message + " (the daemon is gone or not answering)");
    default:
      throw rmm::bad_alloc(message);
  }
}

session_channel::session_channel(session::options const& options, session_welcome& welcome)
    : options_(options)
{
  int const fd = connect_session_socket(options_.runtime_dir);
  say_hello(fd, options_.client_name, welcome);
  // The hello is done: from here the socket carries the session's calls and
  // its close ends the session. A call waits for its reply in a blocking
  // receive (no poll first: one system call fewer per call).
  set_receive_slice(fd, options_.call_timeout);
  socket_fd_.store(fd);
  for (auto const& p : welcome.welcome.pools()) {
    first_pool_keys_.push_back(pool_key(p));
    to_daemon_pool_.push_back(p.id());
    from_daemon_pool_.push_back(p.id());
  }
  adopt_welcome_locked(welcome.welcome, 0);
  releases_->channel = this;
}

void session_channel::adopt_welcome_locked(v1::SessionWelcome const& w, std::uint32_t generation)
{
  grpc::ChannelArguments args;
  if (w.max_message_bytes() > 0) {
    args.SetMaxSendMessageSize(static_cast<int>(w.max_message_bytes()));
  }
  // A manifest may be 4 MiB serialized (GetBufferManifest, DescribeBuffer,
  // an OpenBuffer grant), a listing more: gRPC's default of 4 MiB is short.
  args.SetMaxReceiveMessageSize(max_receive_bytes);
  // A channel of its own per daemon, with connections of its own (gRPC
  // shares them between channels to one address by default): the last
  // one's broke, or waits out gRPC's backoff, from the moment its daemon
  // went away.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto channel = grpc::CreateCustomChannel("unix:" + (options_.runtime_dir / "rmmd.sock").string(),
                                           grpc::InsecureChannelCredentials(),
                                           args);
  auto stub    = v1::Rmmd::NewStub(channel);
  std::lock_guard lock(ids_mutex_);
  token_hex_ = common::to_hex(w.token());
  daemon_takes_calls_.store(w.session_calls());
  session_calls_.store(w.session_calls() && options_.lease_calls == call_transport::session_socket);
  session_id_.store(w.session_id(), std::memory_order_release);
  generation_.store(generation, std::memory_order_release);
  grpc_channels_.push_back(std::move(channel));
  stubs_.push_back(std::move(stub));
  stub_.store(stubs_.back().get(), std::memory_order_release);
}

session_channel::~session_channel()
{
  ::close(socket_fd_.load());
  for (int fd : old_fds_) { ::close(fd); }
}

void session_channel::close() noexcept
{
  closing_.store(true);
  if (reader_.joinable()) {
    reader_.request_stop();
    ::eventfd_write(reader_wake_fd_, 1);
    reader_.join();
  }
  if (reader_wake_fd_ >= 0) { ::close(reader_wake_fd_); }
  reader_wake_fd_ = -1;
  // The host functions of shared buffers close what their stream stopped
  // using: the daemon may free a buffer only after that, so they must have
  // run before the session (and with it every hold) goes. Streams reach
  // them unless the process is exiting (then its end releases it all).
  std::unique_lock lock(releases_->mutex);
  if (!process_is_exiting()) {
    releases_->buffer_jobs_done.wait_for(
        lock, options_.call_timeout, [this] { return releases_->buffer_jobs == 0; });
  }
  // Host functions that run from now on (only while the process exits: a
  // resource waits for its own before it lets its session go) drop their calls.
  releases_->channel = nullptr;
}

std::unique_ptr<grpc::ClientContext> session_channel::context()
{
  reconnect_if_gone();
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("rmmd-token", token_hex());
  ctx->set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  return ctx;
}

std::unique_ptr<grpc::ClientContext> session_channel::context_for(std::uint32_t generation) const
{
  std::lock_guard lock(ids_mutex_);
  return context_for_locked(generation);
}

std::unique_ptr<grpc::ClientContext> session_channel::context_for_locked(
    std::uint32_t generation) const
{
  // The token, the stub and the generation change together, under ids_mutex_.
  if (generation_.load(std::memory_order_relaxed) != generation) { return nullptr; }
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("rmmd-token", token_hex_);
  ctx->set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  return ctx;
}

std::string session_channel::token_hex() const
{
  std::lock_guard lock(ids_mutex_);
  return token_hex_;
}

grpc::Status session_channel::call(unary_rpc const& rpc)
{
  return reconnecting(true, [&](std::uint32_t generation) -> grpc::Status {
    std::unique_ptr<grpc::ClientContext> ctx;
    v1::Rmmd::Stub* stub{};
    {
      std::lock_guard lock(ids_mutex_);
      ctx  = context_for_locked(generation);
      stub = stubs_.back().get();
    }
    if (!ctx) { return {grpc::StatusCode::ABORTED, reconnected_meanwhile}; }
    return rpc(*stub, ctx.get(), generation);
  });
}

grpc::Status session_channel::reconnecting(
    bool look_first, std::function<grpc::Status(std::uint32_t)> const& attempt)
{
  if (options_.reconnect.count() <= 0) { return attempt(generation()); }
  // A session that made no call while its daemon went away finds out here:
  // its socket is closed. Reconnecting first spares a try that the new
  // daemon would refuse (it does not know the old token).
  if (look_first) { reconnect_if_gone(); }
  while (true) {
    auto const generation = this->generation();
    auto status           = attempt(generation);
    if (status.ok()) { return status; }
    // Another node that this daemon cannot reach: nothing to reconnect.
    if (!unreachable_node(status).empty()) { return status; }
    auto const code = status.error_code();
    // Again at the new daemon, when the try was meant for one that is gone:
    // a reconnect came between, the old token reached a new daemon, or no
    // daemon answered and a new one is there now.
    bool const again =
        is_reconnected_meanwhile(status) ||
        (code == grpc::StatusCode::UNAUTHENTICATED && this->generation() != generation) ||
        daemon_replaced(code, generation);
    if (!again) { return status; }
  }
}

void session_channel::reconnect_if_gone()
{
  if (options_.reconnect.count() <= 0 || closing_.load() || !socket_closed()) { return; }
  static_cast<void>(reconnect_after(generation()));
}

class session_channel::call_lock {
 public:
  explicit call_lock(session_channel& c) : c_(c)
  {
    c_.call_mutex_.lock();
  }
  call_lock(call_lock const&)            = delete;
  call_lock& operator=(call_lock const&) = delete;
  ~call_lock()
  {
    c_.call_mutex_.unlock();
    c_.tell_reconnects();
    c_.drain_releases();
  }

 private:
  session_channel& c_;
};

grpc::Status session_channel::call(v1::SessionCall& call,
                                   v1::SessionReply* reply,
                                   std::vector<int>* fds)
{
  v1::SessionReply ignored;
  if (reply == nullptr) { reply = &ignored; }
  bool const may_reconnect = options_.reconnect.count() > 0;
  auto const kind          = call.call_case();
  // A Free or a close lets go of what the daemon lent: one that finds its
  // daemon gone is done (what it let go of went with the daemon, and a
  // daemon started again never lent it), and waits for no new one.
  bool const lets_go = kind == v1::SessionCall::kFree || kind == v1::SessionCall::kCloseBuffer ||
                       kind == v1::SessionCall::kBlocksDropped;
  v1::SessionCall asked;  // with the client's ids, for a try at a new daemon
  if (may_reconnect) { asked = call; }
  bool first = true;
  // On the session socket, the send finds a closed socket itself (no poll
  // first: one system call fewer per call).
  bool const look_first = !lets_go && !uses_session_calls();
  auto status           = reconnecting(look_first, [&](std::uint32_t generation) -> grpc::Status {
    if (!first) {
      call = asked;
      reply->Clear();
    }
    first = false;
    if (auto answered = to_daemon(call, generation)) { return *answered; }
    auto tried = route(call, reply, fds, generation);
    if (may_reconnect && lets_go && tried.error_code() == grpc::StatusCode::UNAVAILABLE &&
        this->generation() == generation && socket_closed()) {
      return grpc::Status::OK;
    }
    return tried;
  });
  if (may_reconnect && (status.ok() || kind == v1::SessionCall::kCloseBuffer)) {
    note_holds(asked, *reply);
  }
  return status;
}

grpc::Status session_channel::route(v1::SessionCall& call,
                                    v1::SessionReply* reply,
                                    std::vector<int>* fds,
                                    std::uint32_t generation)
{
  auto const kind = call.call_case();
  // A buffer of another node: the daemon asks its peer over TCP, which its
  // gRPC method may wait for; its session-socket call threads wait for no one.
  bool const remote_open =
      kind == v1::SessionCall::kOpenBuffer && !call.open_buffer().peer().empty();
  if (!remote_open &&
      (uses_session_calls() || (kind == v1::SessionCall::kBufferFd && daemon_takes_calls()))) {
    if (kind != v1::SessionCall::kOpenBuffer || call.open_buffer().wait_ms() == 0) {
      return socket_call(call, reply, fds, generation);
    }
    // The daemon waits for a buffer only on gRPC (its session-socket call
    // threads wait for no one): ask without waiting first.
    auto const wait_ms = call.open_buffer().wait_ms();
    call.mutable_open_buffer()->set_wait_ms(0);
    auto status = socket_call(call, reply, fds, generation);
    call.mutable_open_buffer()->set_wait_ms(wait_ms);
    bool const waitable = status.error_code() == grpc::StatusCode::NOT_FOUND ||
                          status.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
    if (status.ok() || !waitable) { return status; }
  }
  auto status = grpc_call(call, reply, generation);
  if (status.ok() && reply != nullptr) { status = from_daemon(*reply, generation); }
  return status;
}

grpc::Status session_channel::grpc_call(v1::SessionCall const& call,
                                        v1::SessionReply* reply,
                                        std::uint32_t generation) const
{
  v1::SessionReply ignored;
  auto& out = reply != nullptr ? *reply : ignored;
  auto ctx  = context_for(generation);
  if (!ctx) { return {grpc::StatusCode::ABORTED, reconnected_meanwhile}; }
  switch (call.call_case()) {
    case v1::SessionCall::kAllocate:
      return stub().Allocate(ctx.get(), call.allocate(), out.mutable_allocate());
    case v1::SessionCall::kFree:
      return stub().Free(ctx.get(), call.free(), out.mutable_free());
    case v1::SessionCall::kCreateBuffer:
      return stub().CreateBuffer(ctx.get(), call.create_buffer(), out.mutable_create_buffer());
    case v1::SessionCall::kPublishBuffer:
      return stub().PublishBuffer(ctx.get(), call.publish_buffer(), out.mutable_publish_buffer());
    case v1::SessionCall::kCloseBuffer:
      return stub().CloseBuffer(ctx.get(), call.close_buffer(), out.mutable_close_buffer());
    case v1::SessionCall::kOpenBuffer:
      // The daemon may wait up to wait_ms for the buffer: so may we.
      ctx->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(call.open_buffer().wait_ms()) +
                        options_.call_timeout);
      return stub().OpenBuffer(ctx.get(), call.open_buffer(), out.mutable_open_buffer());
    case v1::SessionCall::kPing:
      return {grpc::StatusCode::FAILED_PRECONDITION, "this session makes no session-socket calls"};
    case v1::SessionCall::kBufferFd:
      return {grpc::StatusCode::FAILED_PRECONDITION,
              "this daemon takes no calls on the session socket, the only way an fd travels"};
    case v1::SessionCall::kBlocksDropped:
    case v1::SessionCall::CALL_NOT_SET:
      break;
  }
  // Packed blocks come only to sessions that call on the session socket.
  return {grpc::StatusCode::UNIMPLEMENTED, "no gRPC method carries this session call"};
}

grpc::Status session_channel::socket_call(v1::SessionCall& call,
                                          v1::SessionReply* reply,
                                          std::vector<int>* fds,
                                          std::uint32_t generation)
{
  grpc::Status status;
  std::vector<std::uint32_t> reclaims;
  std::vector<std::uint64_t> retired;
  {
    call_lock lock(*this);
    // The call's ids are that generation's: a reconnect came between.
    if (this->generation() != generation) {
      return {grpc::StatusCode::ABORTED, reconnected_meanwhile};
    }
    {
      // Calls that streams reached go first: the daemon handles a session's
      // calls in order, so this call sees their memory back.
      std::vector<queued_call> calls;
      {
        std::lock_guard queue_lock(releases_->mutex);
        calls.swap(releases_->calls);
      }
      send_releases_locked(calls);
    }
    status = call_locked(call, reply, fds);
    if (status.ok()) { status = from_daemon(*reply, generation); }
    if (status.ok() && reply->has_allocate() && reply->allocate().block_id() != 0) {
      // A packed lease is live in its block from its grant on: a RetireBlocks
      // this call heard (acted on below) must not take the block from under
      // it. Every packed grant comes through here: packing is asked only on
      // the session socket. A lease that fails later is freed, which forgets it.
      packed_->count_lease(reply->allocate().allocation_id(), reply->allocate().block_id());
    }
    free_orphans_locked();
    reclaims.swap(reclaims_heard_);
    retired.swap(retired_heard_);
  }
  act_on_unasked(retired, reclaims);
  return status;
}

void session_channel::free_orphans_locked()
{
  // Leases granted to calls that had given up waiting: nobody will free them
  // but us (they would count against our quota until the session ends).
  while (!orphans_.empty()) {
    v1::SessionCall free_call;
    free_call.mutable_free()->set_allocation_id(orphans_.back());
    orphans_.pop_back();
    v1::SessionReply ignored;
    static_cast<void>(call_locked(free_call, &ignored, nullptr));
  }
}

void session_channel::act_on_unasked(std::vector<std::uint64_t> const& retired,
                                     std::vector<std::uint32_t> const& reclaims) noexcept
{
  if (!retired.empty()) { packed_->drop(retired); }
  if (!reclaims.empty()) { reports_->run_watches(reclaims); }
}

void session_channel::drain_releases() noexcept
{
  // A host function that found the socket taken left its call queued for the
  // holder; the holder looks again once it has let go (here), so no call is
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

void session_channel::send_when_reached(release_queue& queue, queued_call call) noexcept
{
  std::lock_guard queue_lock(queue.mutex);
  auto* self = queue.channel;
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

namespace {

char const* queued_what(session_channel::queued_call::kind what)
{
  using kind = session_channel::queued_call::kind;
  switch (what) {
    case kind::free:
      return "freeing allocation";
    case kind::publish_buffer:
      return "publishing buffer";
    case kind::close_buffer:
      return "closing buffer";
    case kind::drop_block:
      return "dropping packed block";
  }
  return "sending";
}

}  // namespace

void session_channel::send_releases_locked(std::vector<queued_call>& calls) noexcept
{
  using kind = queued_call::kind;
  for (auto const& q : calls) {
    try {
      v1::SessionCall c;
      switch (q.what) {
        case kind::free:
          packed_->forget_lease(q.id);
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
      if (q.what == kind::close_buffer) { note_holds(c, v1::SessionReply{}); }
      // About an earlier daemon's allocation, buffer or block: nothing to send.
      auto const generation = this->generation();
      if (to_daemon(c, generation)) { continue; }
      grpc::Status sent;
      if (uses_session_calls()) {
        // The daemon answers only if the call fails; call_locked prints that.
        c.set_reply_only_on_error(true);
        sent = send_locked(c, std::chrono::steady_clock::now() + options_.call_timeout);
      } else if (q.what != kind::drop_block) {
        sent = grpc_call(c, nullptr, generation);
      }
      // UNAVAILABLE: the daemon is gone, and with it the lease or the hold.
      if (!sent.ok() && sent.error_code() != grpc::StatusCode::UNAVAILABLE) {
        rmmd::detail::stderr_line("rmmd: %s %llu failed (%s)%s\n",
                                  queued_what(q.what),
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

void session_channel::take_unasked_locked(v1::SessionReply const& reply)
{
  if (reply.has_reclaim() || reply.has_retire_blocks()) {
    v1::SessionReply ours = reply;
    if (!from_daemon(ours, generation()).ok()) { return; }  // a pool it did not describe
    if (ours.has_reclaim()) {
      reclaims_heard_.push_back(ours.reclaim().pool_id());
    } else {
      auto const& ids = ours.retire_blocks().block_ids();
      retired_heard_.insert(retired_heard_.end(), ids.begin(), ids.end());
    }
  } else if (reply.has_error()) {
    // The answer to an earlier call that did not wait: a queued call sent
    // with reply_only_on_error that failed, or a call that timed out.
    rmmd::detail::stderr_line("rmmd: an earlier call on the session socket failed: %s\n",
                              reply.error().message().c_str());
  } else if (reply.has_allocate()) {
    // A lease granted to a call that timed out is ours to give back.
    orphans_.push_back(reply.allocate().allocation_id());
  }
}

void session_channel::start_reader()
{
  std::lock_guard lock(reader_mutex_);
  if (reader_.joinable()) { return; }
  reader_wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (reader_wake_fd_ < 0) {
    throw rmm::bad_alloc(std::string("rmmd: eventfd for the session's reader: ") +
                         std::strerror(errno));
  }
  reader_ = std::jthread([this](std::stop_token stop) { read_unasked(std::move(stop)); });
}

bool session_channel::on_reader_thread() noexcept
{
  return reader_thread;
}

void session_channel::read_unasked(std::stop_token stop) noexcept
{
  reader_thread = true;
  while (!stop.stop_requested()) {
    auto const generation = this->generation();
    std::array<pollfd, 2> watched{pollfd{.fd = socket_fd_, .events = POLLIN, .revents = 0},
                                  pollfd{.fd = reader_wake_fd_, .events = POLLIN, .revents = 0}};
    if (::poll(watched.data(), watched.size(), -1) < 0) {
      if (errno == EINTR) { continue; }
      return;
    }
    if (watched[1].revents != 0) { return; }
    // The daemon is gone: reconnect now (so that a keeper's reports and
    // reclaims go on), or the next call says so.
    if ((watched[0].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) {
      if (!stop.stop_requested() && reconnect_after(generation)) { continue; }
      return;
    }
    if ((watched[0].revents & POLLIN) == 0) { continue; }
    std::vector<std::uint32_t> reclaims;
    std::vector<std::uint64_t> retired;
    try {
      // A call in progress reads its own reply (and whatever came before it):
      // this waits for it, then takes what is left.
      call_lock lock(*this);
      read_waiting_locked();
      reclaims.swap(reclaims_heard_);
      retired.swap(retired_heard_);
    } catch (std::exception const&) {
      continue;  // out of memory: the request's deadline passes, nothing worse
    }
    act_on_unasked(retired, reclaims);
  }
}

void session_channel::read_waiting_locked()
{
  std::array<char, 4096> buffer;
  std::array<int, 4> attached{};
  while (true) {
    auto const got = fd_passing::receive_datagram(socket_fd_, buffer, attached, MSG_DONTWAIT);
    fd_passing::close_fds(attached, got.fd_count);
    if (got.bytes < 0 && errno == EINTR) { continue; }
    if (got.bytes <= 0) { return; }  // nothing more now, or closed (poll says so next)
    v1::SessionReply reply;
    if (!reply.ParseFromArray(buffer.data(), static_cast<int>(got.bytes))) { continue; }
    take_unasked_locked(reply);
  }
}

bool session_channel::wait_socket(short events,
                                  std::chrono::steady_clock::time_point deadline) const
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

grpc::Status session_channel::send_locked(v1::SessionCall& call,
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

grpc::Status session_channel::timed_out() const
{
  return {grpc::StatusCode::DEADLINE_EXCEEDED,
          "no reply on the session socket within " + std::to_string(options_.call_timeout.count()) +
              " ms"};
}

grpc::Status session_channel::call_locked(v1::SessionCall& call,
                                          v1::SessionReply* reply,
                                          std::vector<int>* fds)
{
  auto const deadline = std::chrono::steady_clock::now() + options_.call_timeout;
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
      take_unasked_locked(*reply);
      continue;
    }
    if (fds != nullptr) { fds->assign(attached.begin(), attached.begin() + got.fd_count); }
    return read.status;
  }
}

bool session_channel::daemon_replaced(grpc::StatusCode code, std::uint32_t generation)
{
  // UNAVAILABLE: nobody answers. UNAUTHENTICATED: a daemon answers that does
  // not know the token, which is a new daemon when the session socket to
  // the old one is closed (a gRPC call can reach it before this session's
  // reader has seen the old one go); reconnect_after checks that.
  return (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::UNAUTHENTICATED) &&
         reconnect_after(generation);
}

bool session_channel::reconnect_after(std::uint32_t generation)
{
  if (options_.reconnect.count() <= 0 || closing_.load()) { return false; }
  call_lock lock(*this);
  if (this->generation() != generation) { return true; }  // another call reconnected
  if (gone_ || !socket_closed()) { return false; }
  return reconnect_locked();
}

}  // namespace rmmd::detail
