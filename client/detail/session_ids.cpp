#include "client/detail/session_ids.hpp"

#include "client/detail/session_hello.hpp"
#include "common/hex.hpp"

#include <algorithm>
#include <string>

namespace rmmd::detail {
namespace {

/// The largest gRPC answer taken: a manifest's 4 MiB bound with room to
/// spare, and a listing of many buffers with their labels.
constexpr int max_receive_bytes = 64 << 20;

}  // namespace

grpc::Status stable_of_gone_daemon()
{
  return grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      "the address-stable allocation was made by a daemon that went away (rmmd restarted and "
      "the session reconnected): the daemon serving now does not know it. Memory still mapped "
      "stays valid until it is freed (locally); host backups slept under a name were kept by "
      "the daemon: restore(name) maps them again, at new addresses");
}

session_ids::session_ids(session::options const& options, v1::SessionWelcome const& first)
    : options_(options)
{
  pool_match pools;
  for (auto const& p : first.pools()) {
    first_pool_keys_.push_back(pool_key(p));
    pools.to_daemon.push_back(p.id());
    pools.from_daemon.push_back(p.id());
  }
  adopt(first, 0, std::move(pools));
}

session_ids::pool_match session_ids::match_pools(v1::SessionWelcome const& welcome) const
{
  pool_match m{
      .to_daemon   = std::vector<std::int64_t>(first_pool_keys_.size(), -1),
      .from_daemon = std::vector<std::int64_t>(static_cast<std::size_t>(welcome.pools_size()), -1)};
  for (auto const& p : welcome.pools()) {
    auto it = std::find(first_pool_keys_.begin(), first_pool_keys_.end(), pool_key(p));
    if (it == first_pool_keys_.end() || p.id() >= m.from_daemon.size()) { continue; }
    auto const ours       = static_cast<std::size_t>(it - first_pool_keys_.begin());
    m.to_daemon[ours]     = p.id();
    m.from_daemon[p.id()] = static_cast<std::int64_t>(ours);
  }
  return m;
}

void session_ids::adopt(v1::SessionWelcome const& w, std::uint32_t generation, pool_match pools)
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
  std::lock_guard lock(mutex_);
  pools_     = std::move(pools);
  token_hex_ = common::to_hex(w.token());
  daemon_takes_calls_.store(w.session_calls());
  session_calls_.store(w.session_calls() && options_.lease_calls == call_transport::session_socket);
  session_id_.store(w.session_id(), std::memory_order_release);
  generation_.store(generation, std::memory_order_release);
  grpc_channels_.push_back(std::move(channel));
  stubs_.push_back(std::move(stub));
  stub_.store(stubs_.back().get(), std::memory_order_release);
}

std::optional<std::uint32_t> session_ids::daemon_pool(std::uint32_t pool_id) const
{
  std::lock_guard lock(mutex_);
  if (pool_id >= pools_.to_daemon.size()) { return pool_id; }  // no welcome described it
  if (pools_.to_daemon[pool_id] < 0) { return std::nullopt; }
  return static_cast<std::uint32_t>(pools_.to_daemon[pool_id]);
}

std::optional<std::uint32_t> session_ids::session_pool(std::uint32_t daemon_pool_id) const
{
  std::lock_guard lock(mutex_);
  if (daemon_pool_id >= pools_.from_daemon.size()) { return daemon_pool_id; }
  if (pools_.from_daemon[daemon_pool_id] < 0) { return std::nullopt; }
  return static_cast<std::uint32_t>(pools_.from_daemon[daemon_pool_id]);
}

std::optional<std::uint64_t> session_ids::daemon_buffer(std::uint64_t id) const
{
  std::lock_guard lock(mutex_);
  auto const now = generation_.load(std::memory_order_relaxed);
  if (generation_of(id) != now) {
    auto it = renamed_.find(id);
    if (it == renamed_.end()) { return std::nullopt; }
    id = it->second;
  }
  return id & daemon_id_mask;
}

std::optional<grpc::Status> session_ids::to_daemon(v1::SessionCall& call,
                                                   std::uint32_t generation) const
{
  std::lock_guard lock(mutex_);
  // An id no welcome described goes as it is: the daemon says what is wrong.
  auto pool = [&](std::uint32_t id) -> std::optional<std::uint32_t> {
    if (id >= pools_.to_daemon.size()) { return id; }
    if (pools_.to_daemon[id] < 0) { return std::nullopt; }
    return static_cast<std::uint32_t>(pools_.to_daemon[id]);
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
    case v1::SessionCall::kStableFds: {
      // Address-stable allocations are the daemon's that made them: one
      // that went away took them with it (their named backups it kept).
      auto* ids = call.mutable_stable_fds()->mutable_allocation_ids();
      for (auto& id : *ids) {
        if (generation_of(id) != generation) { return stable_of_gone_daemon(); }
        id &= daemon_id_mask;
      }
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

grpc::Status session_ids::from_daemon(v1::SessionReply& reply, std::uint32_t generation) const
{
  auto const too_large =
      grpc::Status(grpc::StatusCode::INTERNAL,
                   "the daemon sent an id of 2^48 or more, which this client cannot take");
  auto ours = [&](std::uint64_t& id) {
    if ((id & ~daemon_id_mask) != 0) { return false; }
    id = client_id(id, generation);
    return true;
  };
  std::lock_guard lock(mutex_);
  auto pool = [&](std::uint32_t id) -> std::optional<std::uint32_t> {
    if (id >= pools_.from_daemon.size()) { return id; }  // one the welcome did not describe
    if (pools_.from_daemon[id] < 0) { return std::nullopt; }
    return static_cast<std::uint32_t>(pools_.from_daemon[id]);
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

void session_ids::note_holds(v1::SessionCall const& call, v1::SessionReply const& reply)
{
  auto const kind = call.call_case();
  if (kind != v1::SessionCall::kCreateBuffer && kind != v1::SessionCall::kOpenBuffer &&
      kind != v1::SessionCall::kCloseBuffer) {
    return;  // Allocate and Free: no lock
  }
  try {
    std::lock_guard lock(mutex_);
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

session_ids::grpc_target session_ids::target(std::uint32_t generation) const
{
  grpc_target t;
  std::lock_guard lock(mutex_);
  t.stub = stubs_.back().get();
  if (generation_.load(std::memory_order_relaxed) != generation) { return t; }
  t.context = std::make_unique<grpc::ClientContext>();
  t.context->AddMetadata("rmmd-token", token_hex_);
  t.context->set_deadline(std::chrono::system_clock::now() + options_.call_timeout);
  return t;
}

std::string session_ids::token_hex() const
{
  std::lock_guard lock(mutex_);
  return token_hex_;
}

session_ids::held_map session_ids::take_held()
{
  held_map out;
  std::lock_guard lock(mutex_);
  out.swap(held_);
  return out;
}

void session_ids::held_again(std::unordered_map<std::uint64_t, std::uint64_t> renamed,
                             held_map held_now)
{
  std::lock_guard lock(mutex_);
  // Ids of earlier daemons that named a buffer held again name its new id.
  for (auto& [earlier, now] : renamed_) {
    if (auto it = renamed.find(now); it != renamed.end()) { now = it->second; }
  }
  renamed_.merge(renamed);
  held_.swap(held_now);
}

void session_ids::note_untold(reconnect_info const& info, std::uint32_t old_generation) noexcept
{
  try {
    std::lock_guard lock(mutex_);
    untold_.emplace_back(info, old_generation);
  } catch (std::bad_alloc const&) {
  }
}

std::vector<session_ids::untold_reconnect> session_ids::take_untold()
{
  std::vector<untold_reconnect> out;
  std::lock_guard lock(mutex_);
  out.swap(untold_);
  return out;
}

bool session_ids::has_untold() const
{
  std::lock_guard lock(mutex_);
  return !untold_.empty();
}

}  // namespace rmmd::detail
