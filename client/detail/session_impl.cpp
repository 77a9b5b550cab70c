#include "client/detail/session_impl.hpp"

#include <algorithm>

#include "client/detail/daemon_message_checks.hpp"

#include <cstring>
#include <string>

namespace rmmd::detail {

session_impl::session_impl(session::options opts)
    : options(std::move(opts)),
      channel_(options, welcome_),
      mappings_(take_welcome(), options.import_by_fabric),
      reports_(channel_),
      packed_(channel_, mappings_),
      buffers_(channel_, mappings_, options.import_by_fabric)
{
  channel_.connect_parts(
      packed_,
      reports_,
      reconnect_hooks{
          .adopt_pools =
              [this](std::uint32_t generation,
                     session_welcome&& welcome,
                     std::vector<std::int64_t> const& daemon_pool) {
                mappings_.adopt(generation, std::move(welcome), daemon_pool);
              },
          .forget_generation = [this](std::uint32_t old) { packed_.forget_generation(old); }});
}

session_welcome&& session_impl::take_welcome() noexcept
{
  return std::move(welcome_);
}

session_impl::~session_impl()
{
  // No unasked message and no queued call may reach a part once it is going.
  channel_.close();
}

session_impl::granted_lease session_impl::lease_memory(std::uint32_t pool_id,
                                                       std::size_t bytes,
                                                       std::size_t alignment,
                                                       bool may_pack)
{
  v1::SessionCall call;
  auto* request = call.mutable_allocate();
  request->set_pool_id(pool_id);
  request->set_size(bytes);
  request->set_alignment(alignment);
  // Packed blocks are retired on the session socket, and dropped there.
  bool const packable = may_pack && channel_.uses_session_calls();
  request->set_may_pack(packable);
  v1::SessionReply reply;
  auto status = channel_.call(call, &reply);
  if (!status.ok()) { throw_status(status, "allocate " + std::to_string(bytes) + " bytes"); }
  auto const& response  = reply.allocate();
  auto const generation = generation_of(response.allocation_id());
  auto const pool       = mappings_.described(pool_id, generation);
  auto checked          = pool ? check_allocation(response,
                                         {.host_pool     = pool->backend == backend_kind::host,
                                                   .pool_capacity = pool->capacity_bytes,
                                                   .bytes         = bytes,
                                                   .alignment     = alignment,
                                                   .may_pack      = packable})
                               : grpc::Status(grpc::StatusCode::INTERNAL,
                                     "the daemon granted a pool it did not describe");
  if (!checked.ok()) {
    v1::FreeRequest give_back;  // not usable, and ours to free all the same
    give_back.set_allocation_id(response.allocation_id());
    static_cast<void>(free(give_back));
    throw_status(checked, "allocate " + std::to_string(bytes) + " bytes");
  }
  granted_lease granted{
      .granted      = {.id          = response.allocation_id(),
                       .bytes       = response.size(),
                       .host_offset = response.has_host() ? response.host().offset() : 0},
      .generation   = generation,
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

grpc::Status session_impl::allocate(v1::AllocateRequest const& request,
                                    v1::AllocateResponse* response)
{
  v1::SessionCall call;
  *call.mutable_allocate() = request;
  v1::SessionReply reply;
  auto status = channel_.call(call, &reply);
  if (status.ok()) { *response = std::move(*reply.mutable_allocate()); }
  return status;
}

grpc::Status session_impl::free(v1::FreeRequest const& request)
{
  // Before the call: a RetireBlocks that the call hears is acted on before
  // it returns, and must find this lease gone from its block.
  packed_.forget_lease(request.allocation_id());
  v1::SessionCall call;
  *call.mutable_free() = request;
  v1::SessionReply reply;
  return channel_.call(call, &reply);
}

grpc::Status session_impl::create_buffer(v1::CreateBufferRequest const& request,
                                         v1::BufferGrant* grant)
{
  v1::SessionCall call;
  *call.mutable_create_buffer() = request;
  v1::SessionReply reply;
  auto status = channel_.call(call, &reply);
  if (status.ok()) { *grant = std::move(*reply.mutable_create_buffer()); }
  return status;
}

grpc::Status session_impl::open_buffer(std::string const& name,
                                       std::chrono::milliseconds wait,
                                       v1::BufferGrant* grant)
{
  v1::OpenBufferRequest request;
  request.set_name(name);
  auto const wait_ms = std::min<std::chrono::milliseconds::rep>(
      std::max<std::chrono::milliseconds::rep>(wait.count(), 0), 0xffffffff);
  request.set_wait_ms(static_cast<std::uint32_t>(wait_ms));
  return open_buffer(request, grant);
}

grpc::Status session_impl::open_buffer(v1::OpenBufferRequest const& request, v1::BufferGrant* grant)
{
  v1::SessionCall call;
  *call.mutable_open_buffer() = request;
  v1::SessionReply reply;
  auto status = channel_.call(call, &reply);
  if (status.ok()) { *grant = std::move(*reply.mutable_open_buffer()); }
  return status;
}

namespace {

grpc::Status buffer_unknown_now()
{
  return {grpc::StatusCode::NOT_FOUND,
          "the daemon that served this buffer went away, and the one serving now does not know it"};
}

}  // namespace

grpc::Status session_impl::set_buffer_manifest(v1::SetBufferManifestRequest const& request)
{
  return channel_.call([&](v1::Rmmd::Stub& stub, grpc::ClientContext* ctx, std::uint32_t) {
    auto id = channel_.daemon_buffer(request.buffer_id());
    if (!id) { return buffer_unknown_now(); }
    auto ours = request;
    ours.set_buffer_id(*id);
    v1::SetBufferManifestResponse response;
    return stub.SetBufferManifest(ctx, ours, &response);
  });
}

grpc::Status session_impl::get_buffer_manifest(std::uint64_t id, v1::BufferManifest* manifest)
{
  return channel_.call([&](v1::Rmmd::Stub& stub, grpc::ClientContext* ctx, std::uint32_t) {
    auto theirs = channel_.daemon_buffer(id);
    if (!theirs) { return buffer_unknown_now(); }
    v1::GetBufferManifestRequest request;
    request.set_buffer_id(*theirs);
    return stub.GetBufferManifest(ctx, request, manifest);
  });
}

grpc::Status session_impl::wait_buffer_lease(std::uint64_t id,
                                             std::chrono::milliseconds wait,
                                             v1::WaitBufferLeaseResponse* response)
{
  auto const wait_ms = std::clamp<std::chrono::milliseconds::rep>(wait.count(), 0, 0xffffffff);
  return channel_.call([&](v1::Rmmd::Stub& stub, grpc::ClientContext* ctx, std::uint32_t) {
    auto theirs = channel_.daemon_buffer(id);
    if (!theirs) { return buffer_unknown_now(); }
    v1::WaitBufferLeaseRequest request;
    request.set_buffer_id(*theirs);
    request.set_wait_ms(static_cast<std::uint32_t>(wait_ms));
    // The daemon may hold the call up to wait_ms: so may we.
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(wait_ms) +
                      options.call_timeout);
    response->Clear();
    return stub.WaitBufferLease(ctx, request, response);
  });
}

grpc::Status session_impl::describe_buffer(std::string const& name,
                                           v1::DescribeBufferResponse* response)
{
  v1::DescribeBufferRequest request;
  request.set_name(name);
  return unary(&v1::Rmmd::Stub::DescribeBuffer, request, response);
}

grpc::Status session_impl::list_buffers(v1::ListBuffersRequest const& request,
                                        v1::ListBuffersResponse* response)
{
  return unary(&v1::Rmmd::Stub::ListBuffers, request, response);
}

grpc::Status session_impl::list_peers(v1::ListPeersResponse* response)
{
  auto status = unary(&v1::Rmmd::Stub::ListPeers, v1::ListPeersRequest{}, response);
  // A daemon built without peering has no peers: the same answer as one
  // whose rmmd.conf configures none.
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    response->Clear();
    return grpc::Status::OK;
  }
  return status;
}

grpc::Status session_impl::publish_buffer(std::uint64_t id)
{
  v1::SessionCall call;
  call.mutable_publish_buffer()->set_buffer_id(id);
  v1::SessionReply reply;
  return channel_.call(call, &reply);
}

grpc::Status session_impl::close_buffer(std::uint64_t id, v1::BufferHold hold)
{
  v1::SessionCall call;
  call.mutable_close_buffer()->set_buffer_id(id);
  call.mutable_close_buffer()->set_hold(hold);
  v1::SessionReply reply;
  return channel_.call(call, &reply);
}

grpc::Status session_impl::ping()
{
  v1::SessionCall call;
  call.mutable_ping();
  v1::SessionReply reply;
  return channel_.call(call, &reply);
}

}  // namespace rmmd::detail
