#pragma once

// What the fuzzers share: the framing of their inputs (records with a
// little-endian 16-bit length), the world they drive (a real daemon core with
// host pools), and the check that fails a run loudly.
//
// Framing: an input is a few header bytes, then records. A record is a
// 2-byte little-endian length and that many bytes; a length past the end of
// the input takes what is left. tests/fuzz/make_corpus.cpp writes inputs in
// this form from real messages.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/daemon_core.hpp"

#include <google/protobuf/stubs/logging.h>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace rmmd::fuzz {

/// libprotobuf's own lines on stderr (a string field that is not UTF-8, and
/// so on) say nothing a fuzzer needs, millions of times: off in every fuzzer.
inline bool const protobuf_logs_off = (google::protobuf::SetLogHandler(nullptr), true);

/// Reads an input front to back.
class input_reader {
 public:
  explicit input_reader(std::span<std::uint8_t const> data) : data_(data) {}

  /// The next byte; 0 once the input is spent.
  std::uint8_t byte() noexcept
  {
    if (data_.empty()) { return 0; }
    auto b = data_.front();
    data_  = data_.subspan(1);
    return b;
  }

  /// The next record; nullopt once the input is spent.
  std::optional<std::span<char const>> record() noexcept
  {
    if (data_.size() < 2) { return std::nullopt; }
    std::size_t length = data_[0] | (std::size_t{data_[1]} << 8);
    data_              = data_.subspan(2);
    length             = std::min(length, data_.size());
    auto out           = std::span(reinterpret_cast<char const*>(data_.data()), length);
    data_              = data_.subspan(length);
    return out;
  }

  /// What is left, as one record.
  std::span<char const> rest() noexcept
  {
    auto out = std::span(reinterpret_cast<char const*>(data_.data()), data_.size());
    data_    = {};
    return out;
  }

 private:
  std::span<std::uint8_t const> data_;
};

/// Appends one record to `out` (the generator's side of input_reader).
inline void append_record(std::string& out, std::string const& bytes)
{
  auto const n = std::min<std::size_t>(bytes.size(), 0xffff);
  out.push_back(static_cast<char>(n & 0xff));
  out.push_back(static_cast<char>(n >> 8));
  out.append(bytes, 0, n);
}

/// Ends the run with a message libFuzzer keeps beside the crashing input.
[[noreturn]] inline void fail(char const* what)
{
  std::fprintf(stderr, "fuzz check failed: %s\n", what);
  std::abort();
}

#define RMMD_FUZZ_CHECK(cond)                   \
  do {                                          \
    if (!(cond)) { ::rmmd::fuzz::fail(#cond); } \
  } while (false)

/// The uid every fuzzer's core allows (and makes its admin).
inline uid_t allowed_uid()
{
  return ::geteuid();
}

/// A uid the core refuses.
inline constexpr uid_t refused_uid = 4242;

/// A core as the daemon builds one with --backend=host: a plain host pool and
/// a small pinnable one, a per-session and a per-uid quota, so that requests
/// can reach every refusal. A fresh one for each input (about 0.1 ms), so
/// that an input does the same on every run: session and allocation ids
/// start at 1, and a crash found in a long run reproduces from its input.
inline std::unique_ptr<core::daemon_core> make_host_core()
{
  auto core = std::make_unique<core::daemon_core>(core::core_options{
      .access = {.uids = {allowed_uid()}, .gids = {}},
      .quotas = {.per_session_bytes = 3 << 20, .per_uid_bytes = 5 << 20, .per_uid_overrides = {}},
      .admin_uid = allowed_uid()});
  core->pools().add_pool({.name = "host", .handle_types = {core::handle_type::host_offset}},
                         std::make_unique<backends::host::host_backend>("host", 4 << 20));
  // No limit_bytes: the daemon sets none on host pools (the welcome's
  // capacity is the size of the memfd that clients map).
  core->pools().add_pool({.name          = "pinned",
                          .handle_types  = {core::handle_type::host_offset},
                          .max_alignment = 1 << 16,
                          .pinnable      = true},
                         std::make_unique<backends::host::host_backend>("pinned", 1 << 20, true));
  return core;
}

/// No session, no lease, nothing in use in any pool.
inline bool ledger_is_empty(core::daemon_core& core)
{
  auto const stats = core.pools().stats();
  if (!stats.sessions.empty()) { return false; }
  for (auto const& p : stats.pools) {
    if (p.in_use_bytes != 0 || p.allocation_count != 0 || p.carved_bytes != 0) { return false; }
  }
  return true;
}

/// Persistent buffers outlive their sessions, until deleted: deletes them
/// (each must be published and unheld by then).
inline void delete_persistent_buffers(core::daemon_core& core, core::peer_credentials const& peer)
{
  auto cleaner = core.sessions().open_session(peer, "fuzz", "cleaner");
  RMMD_FUZZ_CHECK(cleaner.ok());
  auto left = core.buffers().list_buffers(cleaner->id);
  RMMD_FUZZ_CHECK(left.ok());
  for (auto const& b : *left) {
    RMMD_FUZZ_CHECK(b.persistent && b.state == core::buffer_state::published && b.holders == 0);
    RMMD_FUZZ_CHECK(core.buffers().delete_buffer(cleaner->id, b.name).ok());
  }
  core.close_session(cleaner->id);
}

}  // namespace rmmd::fuzz
