#include "client/detail/daemon_message_checks.hpp"

#include <sys/stat.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

namespace rmmd::detail {
namespace {

/// Largest max_alignment a host pool may ask its mapping to have.
constexpr std::uint64_t max_host_alignment = std::uint64_t{1} << 30;

std::string pool_text(int index, v1::PoolDescription const& p)
{
  return "pool " + std::to_string(index) + " ('" + p.name() + "')";
}

welcome_result malformed(std::string why)
{
  return {.status   = welcome_status::malformed,
          .message  = "rmmd: the daemon's welcome is not valid: " + std::move(why),
          .pool_fds = {}};
}

/// The gRPC code an error reply's `code` stands for; UNKNOWN for one that
/// names no error.
grpc::StatusCode error_code(std::int32_t code)
{
  if (code <= 0 || code > static_cast<int>(grpc::StatusCode::UNAUTHENTICATED)) {
    return grpc::StatusCode::UNKNOWN;
  }
  return static_cast<grpc::StatusCode>(code);
}

v1::SessionReply::ReplyCase reply_for(v1::SessionCall::CallCase call)
{
  switch (call) {
    case v1::SessionCall::kAllocate:
      return v1::SessionReply::kAllocate;
    case v1::SessionCall::kFree:
      return v1::SessionReply::kFree;
    case v1::SessionCall::kPing:
      return v1::SessionReply::kPing;
    case v1::SessionCall::kCreateBuffer:
      return v1::SessionReply::kCreateBuffer;
    case v1::SessionCall::kPublishBuffer:
      return v1::SessionReply::kPublishBuffer;
    case v1::SessionCall::kOpenBuffer:
      return v1::SessionReply::kOpenBuffer;
    case v1::SessionCall::kCloseBuffer:
      return v1::SessionReply::kCloseBuffer;
    case v1::SessionCall::kBufferFd:
      return v1::SessionReply::kBufferFd;
    case v1::SessionCall::kBlocksDropped:
      return v1::SessionReply::kBlocksDropped;
    case v1::SessionCall::kStableFds:
      return v1::SessionReply::kStableFds;
    case v1::SessionCall::CALL_NOT_SET:
      break;
  }
  return v1::SessionReply::REPLY_NOT_SET;
}

}  // namespace

welcome_result read_welcome(std::span<char const> bytes,
                            std::span<int const> fds,
                            v1::SessionWelcome& welcome)
{
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !welcome.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return {.status   = welcome_status::malformed,
            .message  = "rmmd: the daemon's welcome is not a valid SessionWelcome",
            .pool_fds = {}};
  }
  if (welcome.has_error()) {
    auto const& e = welcome.error();
    return {.status   = e.code() == static_cast<int>(grpc::StatusCode::PERMISSION_DENIED)
                            ? welcome_status::permission_denied
                            : welcome_status::refused,
            .message  = "rmmd: the daemon refused the session: " + e.message(),
            .pool_fds = {}};
  }
  welcome_result result{.status = welcome_status::ok, .message = {}, .pool_fds = {}};
  result.pool_fds.assign(static_cast<std::size_t>(welcome.pools_size()), -1);
  std::vector<bool> fd_taken(fds.size(), false);
  for (int i = 0; i < welcome.pools_size(); ++i) {
    auto const& p = welcome.pools(i);
    if (p.id() != static_cast<std::uint32_t>(i)) {
      return malformed(pool_text(i, p) + " has id " + std::to_string(p.id()) +
                       "; pool ids must be 0, 1, 2... in order");
    }
    if (p.fd_index() >= 0) {
      auto const index = static_cast<std::size_t>(p.fd_index());
      if (index >= fds.size()) {
        return malformed(pool_text(i, p) + " names fd " + std::to_string(index) + " of " +
                         std::to_string(fds.size()) + " attached");
      }
      if (fd_taken[index]) {
        return malformed(pool_text(i, p) + " names fd " + std::to_string(index) +
                         ", which another pool names too");
      }
      fd_taken[index]                              = true;
      result.pool_fds[static_cast<std::size_t>(i)] = fds[index];
    } else if (p.fd_index() != -1) {
      return malformed(pool_text(i, p) + " has fd_index " + std::to_string(p.fd_index()));
    }
    if (p.backend() == v1::BACKEND_HOST) {
      auto const align = p.max_alignment();
      if (p.capacity_bytes() == 0) { return malformed(pool_text(i, p) + " has no capacity"); }
      if (align != 0 && (!std::has_single_bit(align) || align > max_host_alignment)) {
        return malformed(pool_text(i, p) + " has max_alignment " + std::to_string(align) +
                         "; a power of two up to 1 GiB was expected");
      }
      // The session reserves capacity + alignment of address space to map it.
      if (p.capacity_bytes() > std::numeric_limits<std::uintptr_t>::max() / 2) {
        return malformed(pool_text(i, p) + " has a capacity of " +
                         std::to_string(p.capacity_bytes()) + " bytes, beyond any address space");
      }
    }
  }
  return result;
}

reply_result read_reply(std::span<char const> bytes,
                        std::uint64_t tag,
                        v1::SessionCall::CallCase call,
                        v1::SessionReply& reply)
{
  auto invalid = [](std::string why) {
    return reply_result{.kind   = reply_kind::invalid,
                        .status = grpc::Status(grpc::StatusCode::INTERNAL, std::move(why))};
  };
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()) ||
      !reply.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return invalid("the daemon's reply is not a valid SessionReply");
  }
  if (reply.tag() != tag) { return {.kind = reply_kind::earlier, .status = grpc::Status::OK}; }
  if (reply.has_error()) {
    return {.kind   = reply_kind::answer,
            .status = grpc::Status(error_code(reply.error().code()), reply.error().message())};
  }
  if (reply.reply_case() != reply_for(call)) {
    return invalid("the daemon's reply answers another kind of call than the one sent");
  }
  return {.kind = reply_kind::answer, .status = grpc::Status::OK};
}

grpc::Status check_allocation(v1::AllocateResponse const& response,
                              allocation_request const& request)
{
  auto invalid = [&](std::string why) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "the daemon's answer to an allocation of " + std::to_string(request.bytes) +
                            " bytes " + why);
  };
  if (response.size() < request.bytes) {
    return invalid("grants only " + std::to_string(response.size()) + " bytes");
  }
  auto const alignment = request.alignment == 0 ? std::size_t{256} : request.alignment;
  auto const block     = response.block_id();
  auto const in_block  = response.block_offset();
  if ((block != 0 || in_block != 0) && (request.host_pool || !request.may_pack)) {
    return invalid("names packed block " + std::to_string(block) + " at offset " +
                   std::to_string(in_block) + ", which this call did not ask for");
  }
  if (!request.host_pool) {
    if (!response.has_cuda()) { return invalid("carries no CUDA export data"); }
    if ((response.allocation_id() >> 63) != 0) {
      return invalid("has allocation id " + std::to_string(response.allocation_id()) +
                     ", not below 2^63");
    }
    if (block == 0) {
      if (in_block != 0) { return invalid("has a block offset but no block"); }
      return grpc::Status::OK;
    }
    if (in_block % alignment != 0) {
      return invalid("has block offset " + std::to_string(in_block) + ", not aligned to " +
                     std::to_string(alignment));
    }
    if (in_block > packed_block_bytes || response.size() > packed_block_bytes - in_block) {
      return invalid("has " + std::to_string(response.size()) + " bytes at block offset " +
                     std::to_string(in_block) + ", past its block's " +
                     std::to_string(packed_block_bytes) + " bytes");
    }
    return grpc::Status::OK;
  }
  if (!response.has_host()) { return invalid("carries no host pool offset"); }
  auto const offset = response.host().offset();
  if (offset % alignment != 0) {
    return invalid("has offset " + std::to_string(offset) + ", not aligned to " +
                   std::to_string(alignment));
  }
  if (offset > request.pool_capacity || request.bytes > request.pool_capacity - offset) {
    return invalid("has offset " + std::to_string(offset) + ", past the pool's " +
                   std::to_string(request.pool_capacity) + " bytes");
  }
  return grpc::Status::OK;
}

grpc::Status check_buffer_grant(v1::BufferGrant const& grant,
                                std::span<pool_shape const> pools,
                                std::size_t bytes)
{
  auto invalid = [&](std::string why) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "the daemon's answer for buffer '" + grant.name() + "' " + why);
  };
  if (grant.pool_id() >= pools.size()) {
    return invalid("names pool " + std::to_string(grant.pool_id()) + ", which it did not describe");
  }
  auto const& pool = pools[grant.pool_id()];
  if (grant.size() == 0 || (bytes != 0 && grant.size() != bytes)) {
    return invalid("has " + std::to_string(grant.size()) + " bytes");
  }
  if (!pool.host_pool) {
    if (grant.has_vmm()) {
      auto const& v = grant.vmm();
      if (v.allocation_bytes() < grant.size()) {
        return invalid("maps " + std::to_string(v.allocation_bytes()) + " bytes, fewer than its " +
                       std::to_string(grant.size()));
      }
      if (!v.has_fd() && v.fabric_handle().empty()) { return invalid("carries no handle"); }
      if (!v.fabric_handle().empty() && v.fabric_handle().size() != 64) {
        return invalid("has a fabric handle of " + std::to_string(v.fabric_handle().size()) +
                       " bytes, not 64");
      }
      return grpc::Status::OK;
    }
    if (!grant.has_cuda()) { return invalid("carries no CUDA export data"); }
    return grpc::Status::OK;
  }
  if (grant.has_host_memfd()) {
    if (grant.host_memfd().mapping_bytes() < grant.size()) {
      return invalid("maps " + std::to_string(grant.host_memfd().mapping_bytes()) +
                     " bytes, fewer than its " + std::to_string(grant.size()));
    }
    return grpc::Status::OK;
  }
  if (!grant.has_host()) { return invalid("carries no host pool offset"); }
  auto const offset = grant.host().offset();
  if (offset > pool.capacity || grant.size() > pool.capacity - offset) {
    return invalid("has offset " + std::to_string(offset) + ", past the pool's " +
                   std::to_string(pool.capacity) + " bytes");
  }
  return grpc::Status::OK;
}

grpc::Status check_peer_buffer_grant(v1::BufferGrant const& grant)
{
  auto invalid = [&](std::string why) {
    return grpc::Status(
        grpc::StatusCode::INTERNAL,
        "the daemon's answer for buffer '" + grant.peer() + ":" + grant.name() + "' " + why);
  };
  if (grant.size() == 0) { return invalid("has 0 bytes"); }
  if (!grant.has_vmm()) { return invalid("carries no allocation of its own (vmm)"); }
  auto const& v = grant.vmm();
  if (v.allocation_bytes() < grant.size()) {
    return invalid("maps " + std::to_string(v.allocation_bytes()) + " bytes, fewer than its " +
                   std::to_string(grant.size()));
  }
  if (v.fabric_handle().size() != 64) {
    return invalid("has a fabric handle of " + std::to_string(v.fabric_handle().size()) +
                   " bytes, not 64");
  }
  return grpc::Status::OK;
}

std::optional<std::string> check_host_pool_fd(int fd, std::uint64_t capacity)
{
  struct stat st {};
  if (::fstat(fd, &st) != 0) { return std::string("fstat: ") + std::strerror(errno); }
  if (st.st_size < 0 || static_cast<std::uint64_t>(st.st_size) < capacity) {
    return "its fd holds " + std::to_string(st.st_size) + " bytes, less than its capacity of " +
           std::to_string(capacity);
  }
  return std::nullopt;
}

}  // namespace rmmd::detail
