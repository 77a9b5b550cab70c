// The state file's reader (restart::decode_state: what rmmd runs at start
// on the file that says which buffers its fd store holds), with arbitrary
// bytes, then the adoption rule on what it accepts.
//
// Input: the file's bytes.
//
// Checked: a state is returned only if it keeps every rule (state_problem
// finds nothing) and encodes back to bytes that decode to the same state; an
// error has a message. On an accepted state, with one fd per record (facts
// from the record, some made to disagree) plus one stray fd: every record
// (buffer or sleep backup) is adopted or dropped exactly once, every fd
// adopted or dropped exactly once, each drop has a problem in words, and the
// next fd id is above every id.

#include "daemon/restart/buffer_adoption.hpp"
#include "daemon/restart/state_file.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(std::uint8_t const* data, std::size_t size)
{
  using namespace rmmd;
  std::string_view const bytes(reinterpret_cast<char const*>(data), size);
  auto const state = restart::decode_state(bytes);
  if (!state.ok()) {
    RMMD_FUZZ_CHECK(!state.status().message().empty());
    return 0;
  }
  RMMD_FUZZ_CHECK(!restart::state_problem(*state).has_value());
  auto const again = restart::decode_state(restart::encode_state(*state));
  RMMD_FUZZ_CHECK(again.ok());
  RMMD_FUZZ_CHECK(again->SerializeAsString() == state->SerializeAsString());

  std::vector<std::string> names;
  std::vector<restart::stored_fd_view> fds;
  for (int i = 0; i < state->buffers_size(); ++i) { names.push_back(state->buffers(i).fd_name()); }
  names.push_back(restart::buffer_fd_name(state->next_fd_id() + 5, "stray"));
  for (int i = 0; i < state->buffers_size(); ++i) {
    auto const& b   = state->buffers(i);
    bool const host = b.kind() == v1::STORED_BUFFER_KIND_HOST_MEMFD;
    restart::fd_facts facts{.open        = true,
                            .memfd       = host,
                            .sealed_size = host,
                            .bytes       = b.allocation_bytes() + (i % 3 == 2 ? 1 : 0)};
    fds.push_back({b.fd_id(), names[static_cast<std::size_t>(i)], facts});
  }
  fds.push_back({state->next_fd_id() + 5, names.back(), restart::fd_facts{.open = true}});
  for (int i = 0; i < state->backups_size(); ++i) {
    auto const& b = state->backups(i);
    restart::fd_facts facts{.open        = true,
                            .memfd       = true,
                            .sealed_size = i % 4 != 3,
                            .bytes       = b.backup_bytes() + (i % 3 == 1 ? 1 : 0)};
    fds.push_back({b.fd_id(), b.fd_name(), facts});
  }
  auto const d = restart::decide_adoption(&*state, fds);
  std::vector<int> record_seen(static_cast<std::size_t>(state->buffers_size()), 0);
  std::vector<int> backup_seen(static_cast<std::size_t>(state->backups_size()), 0);
  std::vector<int> fd_seen(fds.size(), 0);
  for (auto [r, f] : d.adopt) {
    RMMD_FUZZ_CHECK(r < record_seen.size() && f < fd_seen.size());
    ++record_seen[r];
    ++fd_seen[f];
  }
  for (auto [r, f] : d.adopt_backups) {
    RMMD_FUZZ_CHECK(r < backup_seen.size() && f < fd_seen.size());
    ++backup_seen[r];
    ++fd_seen[f];
  }
  for (auto r : d.drop_records) { ++record_seen.at(r); }
  for (auto r : d.drop_backup_records) { ++backup_seen.at(r); }
  for (auto f : d.drop_fds) { ++fd_seen.at(f); }
  for (int n : record_seen) { RMMD_FUZZ_CHECK(n == 1); }
  for (int n : backup_seen) { RMMD_FUZZ_CHECK(n == 1); }
  for (int n : fd_seen) { RMMD_FUZZ_CHECK(n == 1); }
  RMMD_FUZZ_CHECK(d.problems.size() >= d.drop_records.size() + d.drop_backup_records.size());
  for (auto const& p : d.problems) { RMMD_FUZZ_CHECK(!p.empty()); }
  for (auto const& f : fds) { RMMD_FUZZ_CHECK(d.next_fd_id > f.fd_id); }
  return 0;
}
