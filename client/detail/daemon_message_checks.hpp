#pragma once

// The client's reading of what the daemon sends on the session socket: the
// welcome, the replies to its calls and the allocations they grant. A daemon
// that is broken (or not rmmd at all) must cost the client an exception, not
// a crash or a write outside its memory later: whatever the session will
// index or address by is checked here, once, before it is used.
//
// No CUDA and no RMM in here (RMM's headers do not compile with clang 14):
// the fuzzer tests/fuzz/client_messages_fuzz.cpp drives these functions with
// arbitrary bytes. Thread safety: pure functions.

#include "rmmd/v1/rmmd.pb.h"

#include <grpcpp/support/status.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace rmmd::detail {

enum class welcome_status {
  ok,
  malformed,          ///< not a SessionWelcome, or one that contradicts itself
  refused,            ///< the daemon refused the session (`error` set)
  permission_denied,  ///< refused with PERMISSION_DENIED
};

struct welcome_result {
  welcome_status status{welcome_status::malformed};
  std::string message;  ///< why, when not ok: the text of the exception to throw
  /// By pool id: the attached fd that carries the pool, -1 where none. Every
  /// attached fd that no pool names is the caller's to close (all of them
  /// when the welcome is not ok).
  std::vector<int> pool_fds;
};

/// Parses `bytes`, which came with `fds` attached, into `welcome` and checks
/// what the session relies on: the pools' ids are 0, 1, 2... in order (the
/// session indexes its pools by id); each fd_index is -1 or names an attached
/// fd, and no fd serves two pools (the session closes each once); a host
/// pool has a capacity, and a max_alignment that is 0 or a power of two no
/// larger than 1 GiB, which fit in an address space beside each other.
welcome_result read_welcome(std::span<char const> bytes,
                            std::span<int const> fds,
                            v1::SessionWelcome& welcome);

/// What a datagram read while waiting for the reply to a call is.
enum class reply_kind {
  answer,   ///< the reply to this call: its status is the call's
  earlier,  ///< a late reply to an earlier call (another tag)
  invalid,  ///< not a SessionReply, or not the reply this call can have
};

struct reply_result {
  reply_kind kind{reply_kind::invalid};
  /// For an answer: OK, or the daemon's error (never OK: a code the client
  /// does not know, or 0, reads as UNKNOWN). For an invalid one: INTERNAL
  /// saying why.
  grpc::Status status;
};

/// Parses `bytes` into `reply` and says what it is, for the call tagged `tag`
/// that asked for `call`. An answer without an error carries the reply of
/// that call (an Allocate's reply holds an allocation, and so on).
reply_result read_reply(std::span<char const> bytes,
                        std::uint64_t tag,
                        v1::SessionCall::CallCase call,
                        v1::SessionReply& reply);

/// The size of a block that packed leases are carved from (protocol.md,
/// Allocate: `may_pack`).
inline constexpr std::uint64_t packed_block_bytes = std::uint64_t{2} << 20;

/// The pool an allocation was asked of, as the welcome described it.
struct allocation_request {
  bool host_pool{};
  std::uint64_t pool_capacity{};
  std::size_t bytes{};
  std::size_t alignment{};  ///< 0: the daemon's default (256)
  bool may_pack{};          ///< the call said may_pack: the grant may be a packed lease
};

/// Checks that `response` grants `request`: at least the bytes asked for
/// and, from a host pool, an offset aligned as asked whose range lies in the
/// pool; from a CUDA pool, export data, an allocation id below 2^63 (the
/// client marks packed leases with that bit) and, for a packed lease (only
/// where `may_pack` was asked), a block offset aligned as asked whose range
/// lies in the block's 2 MiB. INTERNAL saying why otherwise.
grpc::Status check_allocation(v1::AllocateResponse const& response,
                              allocation_request const& request);

/// A pool as far as check_buffer_grant needs it.
struct pool_shape {
  bool host_pool{};
  std::uint64_t capacity{};
};

/// Checks that `grant` (a created or opened buffer) names a pool of `pools`
/// (indexed by id), carries the handle that pool's kind needs, and, from a
/// host pool, an offset whose `size()` bytes lie in the pool; `bytes`, when
/// not 0, is the size the creator asked for. INTERNAL saying why otherwise.
grpc::Status check_buffer_grant(v1::BufferGrant const& grant,
                                std::span<pool_shape const> pools,
                                std::size_t bytes);

/// Checks a grant of another node's buffer (`peer()` set): a size, and the
/// buffer's own allocation of at least that size with a 64-byte fabric
/// handle (the only handle that crosses nodes); its pool id is the other
/// node's and not checked. INTERNAL saying why otherwise.
grpc::Status check_peer_buffer_grant(v1::BufferGrant const& grant);

/// Whether the host pool fd `fd` holds at least `capacity` bytes (a mapping
/// past its end would fault on first use); the reason when not.
std::optional<std::string> check_host_pool_fd(int fd, std::uint64_t capacity);

}  // namespace rmmd::detail
