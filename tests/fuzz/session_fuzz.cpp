// The session socket's handling, driven with what a client could send: a
// hello, then calls, into a real core with host pools, through the very
// functions the listener calls for each datagram (daemon/session/
// session_protocol.hpp). No sockets: the kernel's part (credentials, cutting
// a datagram to the buffer) is played by the input.
//
// Input: one byte choosing the peer (bit 0: an allowed uid, else a refused
// one), then records: the hello, then the calls of the session. A record
// longer than the listener's buffer arrives cut, with MSG_TRUNC, as it would.
//
// Checked: every answer is a message of the right type; a refused hello
// opens no session; each reply carries its call's tag; and when the session
// ends, the ledger is empty again (nothing leaked, nothing double-counted);
// a Free naming an interprocess event is refused.

#include "daemon/session/session_protocol.hpp"
#include "daemon/wire/calls.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/fuzz/fuzz_input.hpp"

#include <cstddef>
#include <cstdint>

namespace {

using namespace rmmd;

constexpr std::size_t max_hello_bytes = 4096;  // listener_options' defaults
constexpr std::size_t max_call_bytes  = 4096;

session_socket::datagram_view as_received(std::span<char const> bytes, std::size_t buffer)
{
  if (bytes.size() <= buffer) { return {.bytes = bytes, .truncated = false}; }
  return {.bytes = bytes.first(buffer), .truncated = true};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  auto const owned = fuzz::make_host_core();
  auto& core       = *owned;
  static metrics::request_metrics call_metrics(wire::call_names(wire::transport::session_socket));
  fuzz::input_reader in({data, size});

  auto const who = in.byte();
  core::peer_credentials peer{.pid = 4242,
                              .uid = (who & 1) != 0 ? fuzz::allowed_uid() : fuzz::refused_uid,
                              .gid = 4242,
                              .supplementary_gids = {}};
  auto hello = in.record();
  if (!hello) { return 0; }

  auto answer = session_socket::handle_hello(
      core,
      as_received(*hello, max_hello_bytes),
      peer,
      "fuzz",
      {.max_hello_bytes = max_hello_bytes, .max_message_bytes = 1 << 16});
  v1::SessionWelcome welcome;
  RMMD_FUZZ_CHECK(welcome.ParseFromString(answer.message));
  if (!answer.grant) {
    RMMD_FUZZ_CHECK(welcome.has_error() && welcome.error().code() != 0);
    RMMD_FUZZ_CHECK(answer.fds.empty());
    RMMD_FUZZ_CHECK(fuzz::ledger_is_empty(core));
    return 0;
  }
  RMMD_FUZZ_CHECK(!welcome.has_error());
  RMMD_FUZZ_CHECK(welcome.session_id() == answer.grant->id);
  RMMD_FUZZ_CHECK(welcome.token().size() == answer.grant->token.size());
  RMMD_FUZZ_CHECK(welcome.pools_size() == 2 && answer.fds.size() == 2);

  auto const id = answer.grant->id;
  while (auto bytes = in.record()) {
    auto const call = as_received(*bytes, max_call_bytes);
    auto reply      = session_socket::handle_call(core, id, call, max_call_bytes, &call_metrics);
    v1::SessionCall parsed;
    bool const valid =
        !call.truncated &&
        parsed.ParseFromArray(call.bytes.data(), static_cast<int>(call.bytes.size()));
    if (!reply) {
      // Only a Free, PublishBuffer, CloseBuffer or BlocksDropped that asked
      // for no reply and succeeded goes unanswered.
      RMMD_FUZZ_CHECK(valid && parsed.reply_only_on_error() &&
                      (parsed.has_free() || parsed.has_publish_buffer() ||
                       parsed.has_close_buffer() || parsed.has_blocks_dropped()));
      RMMD_FUZZ_CHECK(!parsed.has_free() || parsed.free().removed_release_event().empty());
      continue;
    }
    v1::SessionReply r;
    RMMD_FUZZ_CHECK(r.ParseFromString(*reply));
    RMMD_FUZZ_CHECK(r.tag() == (valid ? parsed.tag() : 0));
    RMMD_FUZZ_CHECK(r.has_error() != (r.reply_case() != v1::SessionReply::REPLY_NOT_SET));
    if (valid && parsed.has_free() && !parsed.free().removed_release_event().empty()) {
      // The interprocess-event field is refused, whatever else the Free says.
      RMMD_FUZZ_CHECK(r.error().code() == static_cast<int>(absl::StatusCode::kInvalidArgument));
    }
    if (r.has_allocate()) {
      // A host pool's lease lies inside the pool.
      auto const& a    = r.allocate();
      auto const pools = core.pools().list();
      auto const pool  = parsed.allocate().pool_id();
      RMMD_FUZZ_CHECK(pool < pools.size());
      RMMD_FUZZ_CHECK(a.has_host() && a.size() >= parsed.allocate().size());
      RMMD_FUZZ_CHECK(a.host().offset() + a.size() <= pools[pool].capacity_bytes);
    }
    for (auto const* g : {r.has_create_buffer() ? &r.create_buffer() : nullptr,
                          r.has_open_buffer() ? &r.open_buffer() : nullptr}) {
      if (g == nullptr) { continue; }
      // A host pool's buffer is a memfd of its own, at least as large as asked.
      auto const pools = core.pools().list();
      RMMD_FUZZ_CHECK(g->pool_id() < pools.size() && g->has_host_memfd());
      RMMD_FUZZ_CHECK(g->host_memfd().mapping_bytes() >= g->size());
    }
  }
  core.close_session(id);
  fuzz::delete_persistent_buffers(core, peer);
  RMMD_FUZZ_CHECK(core.buffers().all().empty());
  RMMD_FUZZ_CHECK(fuzz::ledger_is_empty(core));
  return 0;
}
