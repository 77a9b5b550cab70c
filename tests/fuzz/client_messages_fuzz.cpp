// The client's side of the session socket: what it makes of a welcome and
// of the replies to its calls (client/detail/daemon_message_checks.hpp), with what a
// broken or hostile daemon could send. The session relies on what these
// checks accept: a crash here, or an accepted message that breaks the
// promises below, would be a crash or a stray write in every client process.
//
// Input: a mode byte, a parameter byte, then the message.
//   mode bit 0 clear: a welcome, with (parameter % 8) fds attached (numbers
//     only: nothing here opens, reads or closes an fd);
//   mode bit 0 set: a reply to a call tagged 7 of kind (parameter % 4:
//     none, allocate, free, ping), whose allocation, if any, is checked as
//     one of 1000 bytes aligned to 256 from a 1 MiB pool, a host pool when
//     mode bit 1 is set, a CUDA pool otherwise; asked with may_pack when
//     mode bit 2 is set.

#include "client/detail/daemon_message_checks.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  using namespace rmmd;
  fuzz::input_reader in({data, size});
  auto const mode  = in.byte();
  auto const param = in.byte();
  auto const bytes = in.rest();

  if ((mode & 1) == 0) {
    std::array<int, 8> const attached{100, 101, 102, 103, 104, 105, 106, 107};
    auto const fds = std::span(attached).first(param % 8);
    v1::SessionWelcome welcome;
    auto const result = detail::read_welcome(bytes, fds, welcome);
    if (result.status != detail::welcome_status::ok) {
      RMMD_FUZZ_CHECK(!result.message.empty());
      return 0;
    }
    // What the session goes on to rely on.
    RMMD_FUZZ_CHECK(!welcome.has_error());
    RMMD_FUZZ_CHECK(result.pool_fds.size() == static_cast<std::size_t>(welcome.pools_size()));
    for (int i = 0; i < welcome.pools_size(); ++i) {
      RMMD_FUZZ_CHECK(welcome.pools(i).id() == static_cast<std::uint32_t>(i));
      auto const fd = result.pool_fds[static_cast<std::size_t>(i)];
      RMMD_FUZZ_CHECK(fd == -1 || std::find(fds.begin(), fds.end(), fd) != fds.end());
      RMMD_FUZZ_CHECK(fd == -1 ||
                      std::count(result.pool_fds.begin(), result.pool_fds.end(), fd) == 1);
    }
    return 0;
  }

  constexpr std::uint64_t tag = 7;
  auto const call = static_cast<v1::SessionCall::CallCase>(param % 4 == 0 ? 0 : param % 4 + 1);
  v1::SessionReply reply;
  auto const result = detail::read_reply(bytes, tag, call, reply);
  if (result.kind != detail::reply_kind::answer) {
    RMMD_FUZZ_CHECK(result.kind == detail::reply_kind::earlier || !result.status.ok());
    return 0;
  }
  auto const code = result.status.error_code();
  RMMD_FUZZ_CHECK(code >= grpc::StatusCode::OK && code <= grpc::StatusCode::UNAUTHENTICATED);
  RMMD_FUZZ_CHECK(result.status.ok() != reply.has_error());
  if (!result.status.ok() || call != v1::SessionCall::kAllocate) { return 0; }
  RMMD_FUZZ_CHECK(reply.has_allocate());
  detail::allocation_request const request{.host_pool     = (mode & 2) != 0,
                                           .pool_capacity = 1 << 20,
                                           .bytes         = 1000,
                                           .alignment     = 256,
                                           .may_pack      = (mode & 4) != 0};
  auto const& grant  = reply.allocate();
  auto const checked = detail::check_allocation(grant, request);
  if (checked.ok() && request.host_pool) {
    auto const offset = grant.host().offset();
    RMMD_FUZZ_CHECK(offset % 256 == 0 && offset + request.bytes <= request.pool_capacity);
  }
  if (checked.ok() && !request.host_pool) {
    // What the resource hands out: base + block_offset, inside the block.
    RMMD_FUZZ_CHECK((grant.allocation_id() >> 63) == 0);
    RMMD_FUZZ_CHECK(grant.block_id() != 0 || grant.block_offset() == 0);
    RMMD_FUZZ_CHECK(grant.block_id() == 0 ||
                    (request.may_pack && grant.block_offset() % 256 == 0 &&
                     grant.block_offset() + grant.size() <= detail::packed_block_bytes));
  }
  return 0;
}
