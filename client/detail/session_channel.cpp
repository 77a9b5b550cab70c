#include "client/detail/session_channel.hpp"

#include "client/detail/process_exit.hpp"
#include "client/detail/session_hello.hpp"
#include "client/detail/stderr_line.hpp"
#include "client/detail/usage_reports.hpp"
#include "client/packed_block_imports.hpp"

#include <string>
#include <utility>

namespace rmmd::detail {
namespace {

/// Connects to the session socket and says hello: the socket.
int say_hello_at(session::options const& options, session_welcome& welcome)
{
  int const fd = connect_session_socket(options.runtime_dir);
  say_hello(fd, options.client_name, welcome);  // closes fd when it throws
  return fd;
}

}  // namespace

session_channel::session_channel(session::options const& options, session_welcome& welcome)
    : options_(options),
      socket_(say_hello_at(options, welcome), options.call_timeout),
      ids_(options, welcome.welcome),
      reader_(session_reader::listener{
          .socket_fd   = [this] { return socket_.fd(); },
          .generation  = [this] { return generation(); },
          .daemon_gone = [this](std::uint32_t generation) { return reconnect_after(generation); },
          .readable    = [this] { read_unasked(); }})
{
  releases_->sender = this;
}

// The socket's destructor closes it: that ends the session in the daemon.
session_channel::~session_channel() = default;

void session_channel::close() noexcept
{
  closing_.store(true);
  reader_.stop();
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
  releases_->sender = nullptr;
}

std::unique_ptr<grpc::ClientContext> session_channel::context()
{
  reconnect_if_gone();
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("rmmd-token", token_hex());
  ctx->set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  return ctx;
}

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
    if (auto answered = ids_.to_daemon(call, generation)) { return *answered; }
    auto tried = route(call, reply, fds, generation);
    if (may_reconnect && lets_go && tried.error_code() == grpc::StatusCode::UNAVAILABLE &&
        this->generation() == generation && socket_.closed()) {
      return grpc::Status::OK;
    }
    return tried;
  });
  if (may_reconnect && (status.ok() || kind == v1::SessionCall::kCloseBuffer)) {
    ids_.note_holds(asked, *reply);
  }
  return status;
}

grpc::Status session_channel::call(unary_rpc const& rpc)
{
  return reconnecting(true, [&](std::uint32_t generation) -> grpc::Status {
    auto target = ids_.target(generation);
    if (!target.context) { return reconnected_meanwhile(); }
    return rpc(*target.stub, target.context.get(), generation);
  });
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
  if (!remote_open && (uses_session_calls() || ((kind == v1::SessionCall::kBufferFd ||
                                                 kind == v1::SessionCall::kStableFds) &&
                                                daemon_takes_calls()))) {
    if (kind != v1::SessionCall::kOpenBuffer || call.open_buffer().wait_ms() == 0) {
      return socket_call(call, reply, fds, generation);
    }
    // The daemon waits for a buffer only on gRPC (its session-socket call
    // threads wait for no one): ask without waiting first.
    auto const wait_ms = call.open_buffer().wait_ms();
    call.mutable_open_buffer()->set_wait_ms(0);
    auto status = socket_call(call, reply, fds, generation);
    call.mutable_open_buffer()->set_wait_ms(wait_ms);
    // Missing or unpublished; or, for an exclusive open, its write lease
    // held by another session (the daemon's DEADLINE_EXCEEDED of no wait).
    bool const waitable = status.error_code() == grpc::StatusCode::NOT_FOUND ||
                          status.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                          (call.open_buffer().exclusive() &&
                           status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
    if (status.ok() || !waitable) { return status; }
  }
  auto status = grpc_call(call, reply, generation);
  if (status.ok() && reply != nullptr) { status = ids_.from_daemon(*reply, generation); }
  return status;
}

grpc::Status session_channel::grpc_call(v1::SessionCall const& call,
                                        v1::SessionReply* reply,
                                        std::uint32_t generation) const
{
  v1::SessionReply ignored;
  auto& out   = reply != nullptr ? *reply : ignored;
  auto target = ids_.target(generation);
  auto* ctx   = target.context.get();
  if (ctx == nullptr) { return reconnected_meanwhile(); }
  auto& stub = *target.stub;
  switch (call.call_case()) {
    case v1::SessionCall::kAllocate:
      return stub.Allocate(ctx, call.allocate(), out.mutable_allocate());
    case v1::SessionCall::kFree:
      return stub.Free(ctx, call.free(), out.mutable_free());
    case v1::SessionCall::kCreateBuffer:
      return stub.CreateBuffer(ctx, call.create_buffer(), out.mutable_create_buffer());
    case v1::SessionCall::kPublishBuffer:
      return stub.PublishBuffer(ctx, call.publish_buffer(), out.mutable_publish_buffer());
    case v1::SessionCall::kCloseBuffer:
      return stub.CloseBuffer(ctx, call.close_buffer(), out.mutable_close_buffer());
    case v1::SessionCall::kOpenBuffer:
      // The daemon may wait up to wait_ms for the buffer: so may we.
      ctx->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(call.open_buffer().wait_ms()) +
                        options_.call_timeout);
      return stub.OpenBuffer(ctx, call.open_buffer(), out.mutable_open_buffer());
    case v1::SessionCall::kPing:
      return {grpc::StatusCode::FAILED_PRECONDITION, "this session makes no session-socket calls"};
    case v1::SessionCall::kBufferFd:
    case v1::SessionCall::kStableFds:
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
    if (this->generation() != generation) { return reconnected_meanwhile(); }
    // Calls that streams reached go first: the daemon handles a session's
    // calls in order, so this call sees their memory back.
    auto calls = releases_->take();
    send_releases_locked(calls);
    status = round_trip_locked(call, reply, fds);
    if (status.ok()) { status = ids_.from_daemon(*reply, generation); }
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

grpc::Status session_channel::round_trip_locked(v1::SessionCall& call,
                                                v1::SessionReply* reply,
                                                std::vector<int>* fds)
{
  return socket_.round_trip(
      call, *reply, fds, [this](v1::SessionReply const& r) { take_unasked_locked(r); });
}

void session_channel::take_unasked_locked(v1::SessionReply const& reply)
{
  if (reply.has_reclaim() || reply.has_retire_blocks()) {
    v1::SessionReply ours = reply;
    if (!ids_.from_daemon(ours, generation()).ok()) { return; }  // a pool it did not describe
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

void session_channel::free_orphans_locked()
{
  // Leases granted to calls that had given up waiting: nobody will free them
  // but us (they would count against our quota until the session ends).
  while (!orphans_.empty()) {
    v1::SessionCall free_call;
    free_call.mutable_free()->set_allocation_id(orphans_.back());
    orphans_.pop_back();
    v1::SessionReply ignored;
    static_cast<void>(round_trip_locked(free_call, &ignored, nullptr));
  }
}

void session_channel::act_on_unasked(std::vector<std::uint64_t> const& retired,
                                     std::vector<std::uint32_t> const& reclaims) noexcept
{
  if (!retired.empty()) { packed_->drop(retired); }
  if (!reclaims.empty()) { reports_->run_watches(reclaims); }
}

void session_channel::read_unasked() noexcept
{
  std::vector<std::uint32_t> reclaims;
  std::vector<std::uint64_t> retired;
  try {
    // A call in progress reads its own reply (and whatever came before it):
    // this waits for it, then takes what is left.
    call_lock lock(*this);
    socket_.read_waiting([this](v1::SessionReply const& r) { take_unasked_locked(r); });
    reclaims.swap(reclaims_heard_);
    retired.swap(retired_heard_);
  } catch (std::exception const&) {
    return;  // out of memory: the request's deadline passes, nothing worse
  }
  act_on_unasked(retired, reclaims);
}

bool session_channel::try_send_now(std::vector<queued_call>& calls) noexcept
{
  // Whoever holds the socket sends the queue before letting go of it.
  if (!call_mutex_.try_lock()) { return false; }
  send_releases_locked(calls);
  call_mutex_.unlock();
  return true;
}

void session_channel::drain_releases() noexcept
{
  // A host function that found the socket taken left its call queued for the
  // holder; the holder looks again once it has let go (here), so no call is
  // left behind.
  while (true) {
    std::lock_guard queue_lock(releases_->mutex);
    if (releases_->calls.empty() || !call_mutex_.try_lock()) { return; }
    send_releases_locked(releases_->calls);
    call_mutex_.unlock();
  }
}

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
          c.mutable_close_buffer()->set_hold(static_cast<v1::BufferHold>(q.hold));
          break;
        case kind::drop_block:
          c.mutable_blocks_dropped()->add_block_ids(q.id);
          break;
      }
      if (q.what == kind::close_buffer) { ids_.note_holds(c, v1::SessionReply{}); }
      // About an earlier daemon's allocation, buffer or block: nothing to send.
      auto const generation = this->generation();
      if (ids_.to_daemon(c, generation)) { continue; }
      grpc::Status sent;
      if (uses_session_calls()) {
        // The daemon answers only if the call fails; a later round trip prints that.
        c.set_reply_only_on_error(true);
        sent = socket_.send(c, std::chrono::steady_clock::now() + options_.call_timeout);
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

}  // namespace rmmd::detail
