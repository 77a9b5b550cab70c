// session_channel's reconnect to a restarted daemon, and the translation of
// ids between the session's parts (client ids, the first welcome's pool ids)
// and the daemon of now (session_channel.hpp says how).

#include "client/detail/session_channel.hpp"
#include "client/detail/session_hello.hpp"
#include "client/detail/stderr_line.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <unordered_map>

namespace rmmd::detail {

std::optional<std::uint32_t> session_channel::daemon_pool(std::uint32_t pool_id) const
{
  std::lock_guard lock(ids_mutex_);
  if (pool_id >= to_daemon_pool_.size()) { return pool_id; }  // no welcome described it
  if (to_daemon_pool_[pool_id] < 0) { return std::nullopt; }
  return static_cast<std::uint32_t>(to_daemon_pool_[pool_id]);
}

std::optional<std::uint32_t> session_channel::session_pool(std::uint32_t daemon_pool_id) const
{
  std::lock_guard lock(ids_mutex_);
  if (daemon_pool_id >= from_daemon_pool_.size()) { return daemon_pool_id; }
  if (from_daemon_pool_[daemon_pool_id] < 0) { return std::nullopt; }
  return static_cast<std::uint32_t>(from_daemon_pool_[daemon_pool_id]);
}

std::optional<std::uint64_t> session_channel::daemon_buffer(std::uint64_t id) const
{
  std::lock_guard lock(ids_mutex_);
  auto const now = generation_.load(std::memory_order_relaxed);
  if (generation_of(id) != now) {
    auto it = renamed_.find(id);
    if (it == renamed_.end()) { return std::nullopt; }
    id = it->second;
  }
  return id & daemon_id_mask;
}

std::optional<grpc::Status> session_channel::to_daemon(v1::SessionCall& call,
                                                       std::uint32_t generation) const
{
  std::lock_guard lock(ids_mutex_);
  // An id no welcome described goes as it is: the daemon says what is wrong.
  auto pool = [&](std::uint32_t id) -> std::optional<std::uint32_t> {
    if (id >= to_daemon_pool_.size()) { return id; }
    if (to_daemon_pool_[id] < 0) { return std::nullopt; }
    return static_cast<std::uint32_t>(to_daemon_pool_[id]);
  };
  auto no_pool = [](std::uint32_t id) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "pool " + std::to_string(id) +
                            " of this session is not served by the daemon it reconnected to "
                            "(no pool of that name and GPU; rmmctl pools lists what it serves)");
  };
  // A buffer id of now, or the new id of a buffer held again.
  auto buffer = [&](std::uint64_t id) -> std::optional<std::uint64_t> {
    if (generation_of(id) != generation) {
      auto it = renamed_.find(id);
      if (it == renamed_.end() || generation_of(it->second) != generation) { return std::nullopt; }
      id = it->second;
    }
    return id & daemon_id_mask;
  };
  switch (call.call_case()) {
    case v1::SessionCall::kAllocate: {
      auto id = pool(call.allocate().pool_id());
      if (!id) { return no_pool(call.allocate().pool_id()); }
      call.mutable_allocate()->set_pool_id(*id);
      break;
    }
    case v1::SessionCall::kCreateBuffer: {
      auto id = pool(call.create_buffer().pool_id());
      if (!id) { return no_pool(call.create_buffer().pool_id()); }
      call.mutable_create_buffer()->set_pool_id(*id);
      break;
    }
    case v1::SessionCall::kFree: {
      // An earlier daemon's lease went with it: freed here, nothing to ask.
      auto const id = call.free().allocation_id();
      if (generation_of(id) != generation) { return grpc::Status::OK; }
      call.mutable_free()->set_allocation_id(id & daemon_id_mask);
      break;
    }
    case v1::SessionCall::kPublishBuffer: {
      auto id = buffer(call.publish_buffer().buffer_id());
      if (!id) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "the daemon that served this buffer went away before it was "
                            "published, and an unpublished buffer goes with its daemon; create "
                            "it again");
      }
      call.mutable_publish_buffer()->set_buffer_id(*id);
      break;
    }
    case v1::SessionCall::kCloseBuffer: {
      auto id = buffer(call.close_buffer().buffer_id());
      if (!id) { return grpc::Status::OK; }  // the daemon holding it went away
      call.mutable_close_buffer()->set_buffer_id(*id);
      break;
    }
    case v1::SessionCall::kBufferFd: {
      auto id = buffer(call.buffer_fd().buffer_id());
      if (!id) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            "the daemon that served this buffer went away, and the one serving "
                            "now does not know it");
      }
      call.mutable_buffer_fd()->set_buffer_id(*id);
      break;
    }
    case v1::SessionCall::kBlocksDropped: {
      auto* ids = call.mutable_blocks_dropped()->mutable_block_ids();
      auto kept = std::remove_if(ids->begin(), ids->end(), [&](std::uint64_t id) {
        return generation_of(id) != generation;
      });
      ids->erase(kept, ids->end());
      if (ids->empty()) { return grpc::Status::OK; }
      for (auto& id : *ids) { id &= daemon_id_mask; }
      break;
    }
    default:
      break;
  }
  return std::nullopt;
}

grpc::Status session_channel::from_daemon(v1::SessionReply& reply, std::uint32_t generation) const
{
  auto const too_large =
      grpc::Status(grpc::StatusCode::INTERNAL,
                   "the daemon sent an id of 2^48 or more, which this client cannot take");
  auto ours = [&](std::uint64_t& id) {
    if ((id & ~daemon_id_mask) != 0) { return false; }
    id = client_id(id, generation);
    return true;
  };
  std::lock_guard lock(ids_mutex_);
  auto pool = [&](std::uint32_t id) -> std::optional<std::uint32_t> {
    if (id >= from_daemon_pool_.size()) { return id; }  // one the welcome did not describe
    if (from_daemon_pool_[id] < 0) { return std::nullopt; }
    return static_cast<std::uint32_t>(from_daemon_pool_[id]);
  };
  auto const unknown_pool = grpc::Status(grpc::StatusCode::INTERNAL,
                                         "the daemon named a pool this session does not know");
  auto grant              = [&](v1::BufferGrant& g) {
    std::uint64_t id = g.buffer_id();
    if (!ours(id)) { return too_large; }
    g.set_buffer_id(id);
    if (!g.peer().empty()) { return grpc::Status::OK; }  // its pool is the other node's
    auto p = pool(g.pool_id());
    if (!p) { return unknown_pool; }
    g.set_pool_id(*p);
    return grpc::Status::OK;
  };
  switch (reply.reply_case()) {
    case v1::SessionReply::kAllocate: {
      auto* a             = reply.mutable_allocate();
      std::uint64_t id    = a->allocation_id();
      std::uint64_t block = a->block_id();
      if (!ours(id) || (block != 0 && !ours(block))) { return too_large; }
      a->set_allocation_id(id);
      a->set_block_id(block);
      break;
    }
    case v1::SessionReply::kCreateBuffer:
      return grant(*reply.mutable_create_buffer());
    case v1::SessionReply::kOpenBuffer:
      return grant(*reply.mutable_open_buffer());
    case v1::SessionReply::kReclaim: {
      auto p = pool(reply.reclaim().pool_id());
      if (!p) { return unknown_pool; }
      reply.mutable_reclaim()->set_pool_id(*p);
      break;
    }
    case v1::SessionReply::kRetireBlocks: {
      auto* r = reply.mutable_retire_blocks();
      auto p  = pool(r->pool_id());
      if (!p) { return unknown_pool; }
      r->set_pool_id(*p);
      for (auto& id : *r->mutable_block_ids()) {
        if (!ours(id)) { return too_large; }
      }
      break;
    }
    default:
      break;
  }
  return grpc::Status::OK;
}

void session_channel::note_holds(v1::SessionCall const& call, v1::SessionReply const& reply)
{
  auto const kind = call.call_case();
  if (kind != v1::SessionCall::kCreateBuffer && kind != v1::SessionCall::kOpenBuffer &&
      kind != v1::SessionCall::kCloseBuffer) {
    return;  // Allocate and Free: no lock
  }
  try {
    std::lock_guard lock(ids_mutex_);
    switch (call.call_case()) {
      case v1::SessionCall::kCreateBuffer:
      case v1::SessionCall::kOpenBuffer: {
        auto const& grant = reply.has_create_buffer() ? reply.create_buffer() : reply.open_buffer();
        auto& held        = held_[grant.buffer_id()];
        held.name =
            call.has_create_buffer() ? call.create_buffer().name() : call.open_buffer().name();
        if (call.has_open_buffer()) { held.peer = call.open_buffer().peer(); }
        ++held.opens;
        break;
      }
      case v1::SessionCall::kCloseBuffer: {
        auto id = call.close_buffer().buffer_id();
        if (auto it = renamed_.find(id); it != renamed_.end()) { id = it->second; }
        if (auto it = held_.find(id); it != held_.end() && --it->second.opens == 0) {
          held_.erase(it);
          renamed_.erase(call.close_buffer().buffer_id());
        }
        break;
      }
      default:
        break;
    }
  } catch (std::bad_alloc const&) {
    // Out of memory: a reconnect does not hold this buffer again.
  }
}

bool session_channel::socket_closed() const noexcept
{
  pollfd p{.fd = socket_fd_.load(), .events = POLLIN | POLLRDHUP, .revents = 0};
  if (::poll(&p, 1, 0) < 0) { return false; }
  return (p.revents & (POLLHUP | POLLERR | POLLNVAL | POLLRDHUP)) != 0;
}

void session_channel::wait_to_retry(std::chrono::steady_clock::duration wait) const noexcept
{
  auto const ms = std::max<std::int64_t>(
      1, std::chrono::duration_cast<std::chrono::milliseconds>(wait).count());
  // The reader's eventfd wakes a wait of the reader's when the session closes.
  pollfd p{.fd = reader_wake_fd_.load(), .events = POLLIN, .revents = 0};
  if (p.fd >= 0) {
    ::poll(&p, 1, static_cast<int>(ms));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
}

bool session_channel::reconnect_locked()
{
  using clock         = std::chrono::steady_clock;
  auto const started  = clock::now();
  auto const deadline = started + options_.reconnect;
  auto const previous = session_id();
  auto const count    = reconnects() + 1;
  auto wait           = clock::duration(std::chrono::milliseconds(50));
  session_welcome welcome;
  int fd = -1;
  std::string why;
  while (true) {
    try {
      fd = connect_session_socket(options_.runtime_dir);
      say_hello(fd, options_.client_name, welcome, previous, count);  // closes fd when it throws
      break;
    } catch (std::exception const& e) {
      why = e.what();
      fd  = -1;
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
      return false;
    }
    wait_to_retry(std::min(wait, deadline - now));
    wait = std::min<clock::duration>(wait * 2, std::chrono::seconds(2));
  }
  set_receive_slice(fd, options_.call_timeout);
  // The new daemon's pools, matched to the first welcome's by name and GPU.
  std::vector<std::int64_t> to(first_pool_keys_.size(), -1);
  std::vector<std::int64_t> from(static_cast<std::size_t>(welcome.welcome.pools_size()), -1);
  for (auto const& p : welcome.welcome.pools()) {
    auto it = std::find(first_pool_keys_.begin(), first_pool_keys_.end(), pool_key(p));
    if (it == first_pool_keys_.end() || p.id() >= from.size()) { continue; }
    auto const ours = static_cast<std::size_t>(it - first_pool_keys_.begin());
    to[ours]        = p.id();
    from[p.id()]    = static_cast<std::int64_t>(ours);
  }
  auto const old_generation = generation();
  auto const generation     = (old_generation + 1) % generation_count;
  auto const welcome_copy   = welcome.welcome;
  // The pools first: a call that sees the new generation finds them.
  if (hooks_.adopt_pools) {
    hooks_.adopt_pools(generation, std::move(welcome), to);
  } else {
    for (int f : welcome.pool_fds) {
      if (f >= 0) { ::close(f); }
    }
  }
  old_fds_.push_back(socket_fd_.load());
  socket_fd_.store(fd);
  orphans_.clear();  // the old daemon's, gone with it
  reclaims_heard_.clear();
  retired_heard_.clear();
  {
    std::lock_guard lock(ids_mutex_);
    to_daemon_pool_   = std::move(to);
    from_daemon_pool_ = std::move(from);
  }
  adopt_welcome_locked(welcome_copy, generation);
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
  try {
    std::lock_guard lock(ids_mutex_);
    untold_.emplace_back(info, old_generation);
  } catch (std::bad_alloc const&) {
  }
  return true;
}

void session_channel::hold_again_locked(reconnect_info& info, std::string& unknown)
{
  std::unordered_map<std::uint64_t, held_buffer> held;
  {
    std::lock_guard lock(ids_mutex_);
    held.swap(held_);
  }
  auto const generation = this->generation();
  std::unordered_map<std::uint64_t, std::uint64_t> renamed;  // id of the old daemon -> new
  std::unordered_map<std::uint64_t, held_buffer> held_now;
  for (auto const& [old_id, h] : held) {
    std::uint64_t new_id = 0;
    for (std::size_t i = 0; i < h.opens; ++i) {
      v1::SessionCall open;
      open.mutable_open_buffer()->set_name(h.name);
      open.mutable_open_buffer()->set_peer(h.peer);
      v1::SessionReply reply;
      auto status = daemon_takes_calls() && h.peer.empty() ? call_locked(open, &reply, nullptr)
                                                           : grpc_call(open, &reply, generation);
      if (status.ok()) { status = from_daemon(reply, generation); }
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
  std::lock_guard lock(ids_mutex_);
  // Ids of earlier daemons that named a buffer held again name its new id.
  for (auto& [earlier, now] : renamed_) {
    if (auto it = renamed.find(now); it != renamed.end()) { now = it->second; }
  }
  renamed_.merge(renamed);
  held_.swap(held_now);
}

void session_channel::tell_reconnects() noexcept
{
  thread_local bool telling = false;  // on_reconnect that calls the session
  if (telling) { return; }
  while (true) {
    {
      std::lock_guard lock(ids_mutex_);
      if (untold_.empty()) { return; }
    }
    // Another thread tells: it looks again once done.
    if (!tell_mutex_.try_lock()) { return; }
    telling = true;
    while (true) {
      std::vector<std::pair<reconnect_info, std::uint32_t>> untold;
      {
        std::lock_guard lock(ids_mutex_);
        untold.swap(untold_);
      }
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
