// session_channel's reconnect to a restarted daemon (session_channel.hpp
// says when and under which locks): the one decision every call makes, the
// new hello, and the parts and held buffers moved to the new daemon.

#include "client/detail/session_channel.hpp"
#include "client/detail/session_hello.hpp"
#include "client/detail/stderr_line.hpp"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <unordered_map>

namespace rmmd::detail {

namespace {

/// The message of reconnected_meanwhile().
constexpr char const* reconnected_meanwhile_message = "rmmd: reconnected meanwhile";

}  // namespace

grpc::Status session_channel::reconnected_meanwhile()
{
  return {grpc::StatusCode::ABORTED, reconnected_meanwhile_message};
}

bool session_channel::is_reconnected_meanwhile(grpc::Status const& s)
{
  return s.error_code() == grpc::StatusCode::ABORTED &&
         s.error_message() == reconnected_meanwhile_message;
}

grpc::Status session_channel::reconnecting(bool look_first, attempt_ref attempt)
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
  if (options_.reconnect.count() <= 0 || closing_.load() || !socket_.closed()) { return; }
  static_cast<void>(reconnect_after(generation()));
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
  if (gone_ || !socket_.closed()) { return false; }
  return reconnect_locked();
}

int session_channel::connect_again_locked(session_welcome& welcome, std::uint32_t count)
{
  using clock         = std::chrono::steady_clock;
  auto const deadline = clock::now() + options_.reconnect;
  auto const previous = session_id();
  auto wait           = clock::duration(std::chrono::milliseconds(50));
  std::string why;
  while (true) {
    try {
      int const fd = connect_session_socket(options_.runtime_dir);
      say_hello(fd, options_.client_name, welcome, previous, count);  // closes fd when it throws
      return fd;
    } catch (std::exception const& e) {
      why = e.what();
    }
    auto const now = clock::now();
    if (now >= deadline || closing_.load()) {
      gone_ = true;
      rmmd::detail::stderr_line(
          "rmmd: the daemon went away and none came back at %s within %lld ms (%s); "
          "this session is over: memory it holds stays mapped, and every call fails\n",
          options_.runtime_dir.c_str(),
          static_cast<long long>(options_.reconnect.count()),
          why.c_str());
      return -1;
    }
    // The reader's eventfd cuts the wait short when the session closes.
    reader_.wait_a_while(std::min(wait, deadline - now));
    wait = std::min<clock::duration>(wait * 2, std::chrono::seconds(2));
  }
}

bool session_channel::reconnect_locked()
{
  using clock         = std::chrono::steady_clock;
  auto const started  = clock::now();
  auto const previous = session_id();
  auto const count    = reconnects() + 1;
  session_welcome welcome;
  int const fd = connect_again_locked(welcome, count);
  if (fd < 0) { return false; }
  // The new daemon's pools, matched to the first welcome's by name and GPU.
  auto pools                = ids_.match_pools(welcome.welcome);
  auto const old_generation = generation();
  auto const generation     = (old_generation + 1) % generation_count;
  auto const welcome_copy   = welcome.welcome;
  // The pools first: a call that sees the new generation finds them.
  if (hooks_.adopt_pools) {
    hooks_.adopt_pools(generation, std::move(welcome), pools.to_daemon);
  } else {
    for (int f : welcome.pool_fds) {
      if (f >= 0) { ::close(f); }
    }
  }
  socket_.replace(fd);
  orphans_.clear();  // the old daemon's, gone with it
  reclaims_heard_.clear();
  retired_heard_.clear();
  ids_.adopt(welcome_copy, generation, std::move(pools));
  reconnects_.store(count, std::memory_order_release);

  reconnect_info info{
      .previous_session_id = previous, .session_id = session_id(), .reconnects = count};
  std::string unknown;
  hold_again_locked(info, unknown);
  auto const took = std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - started);
  rmmd::detail::stderr_line(
      "rmmd: the daemon went away; reconnected to the daemon at %s after %lld ms "
      "(session %llu, was %llu; reconnect %u): memory held from before stays valid and "
      "is freed here without a request, new allocations come from the new daemon; %zu "
      "open shared buffer(s) held again%s%s\n",
      options_.runtime_dir.c_str(),
      static_cast<long long>(took.count()),
      static_cast<unsigned long long>(info.session_id),
      static_cast<unsigned long long>(previous),
      count,
      info.buffers_held_again,
      unknown.empty() ? "" : "; not known to the new daemon, kept mapped here: ",
      unknown.c_str());
  ids_.note_untold(info, old_generation);
  return true;
}

void session_channel::hold_again_locked(reconnect_info& info, std::string& unknown)
{
  auto const held       = ids_.take_held();
  auto const generation = this->generation();
  std::unordered_map<std::uint64_t, std::uint64_t> renamed;  // id of the old daemon -> new
  session_ids::held_map held_now;
  for (auto const& [old_id, h] : held) {
    std::uint64_t new_id = 0;
    for (std::size_t i = 0; i < h.opens; ++i) {
      v1::SessionCall open;
      open.mutable_open_buffer()->set_name(h.name);
      open.mutable_open_buffer()->set_peer(h.peer);
      v1::SessionReply reply;
      auto status = daemon_takes_calls() && h.peer.empty()
                        ? round_trip_locked(open, &reply, nullptr)
                        : grpc_call(open, &reply, generation);
      if (status.ok()) { status = ids_.from_daemon(reply, generation); }
      if (!status.ok() || !reply.has_open_buffer()) { break; }
      new_id = reply.open_buffer().buffer_id();
    }
    if (new_id == 0) {
      ++info.buffers_unknown;
      unknown += (unknown.empty() ? "" : ", ") + (h.peer.empty() ? "" : h.peer + ":") + h.name;
      continue;
    }
    ++info.buffers_held_again;
    renamed[old_id]  = new_id;
    held_now[new_id] = h;
  }
  ids_.held_again(std::move(renamed), std::move(held_now));
}

void session_channel::tell_reconnects() noexcept
{
  thread_local bool telling = false;  // on_reconnect that calls the session
  if (telling) { return; }
  while (true) {
    if (!ids_.has_untold()) { return; }
    // Another thread tells: it looks again once done.
    if (!tell_mutex_.try_lock()) { return; }
    telling = true;
    while (true) {
      auto const untold = ids_.take_untold();
      if (untold.empty()) { break; }
      for (auto const& [info, old_generation] : untold) {
        if (hooks_.forget_generation) { hooks_.forget_generation(old_generation); }
        if (!options_.on_reconnect) { continue; }
        try {
          options_.on_reconnect(info);
        } catch (std::exception const& e) {
          rmmd::detail::stderr_line("rmmd: on_reconnect threw: %s\n", e.what());
        } catch (...) {
          rmmd::detail::stderr_line("rmmd: on_reconnect threw\n");
        }
      }
    }
    telling = false;
    tell_mutex_.unlock();
  }
}

}  // namespace rmmd::detail
