#include "daemon/restart/buffer_adoption.hpp"

#include <absl/strings/str_format.h>

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

namespace rmmd::restart {
namespace {

/// A record of either kind, as the rule sees it.
struct record_view {
  std::string_view fd_name;
  std::string what;        // "buffer 'x'", "backup 'n' of uid 1000": for the problems
  char const* not_used{};  // "not served", "not kept"
  bool host_memfd{false};
  std::uint64_t bytes{};  // a memfd's exact size
  bool backup{false};
  std::size_t index{};  // into state.buffers or state.backups
};

std::vector<record_view> records_of(v1::BufferRegistryState const* state)
{
  std::vector<record_view> out;
  if (state == nullptr) { return out; }
  for (int i = 0; i < state->buffers_size(); ++i) {
    auto const& r = state->buffers(i);
    out.push_back({.fd_name    = r.fd_name(),
                   .what       = absl::StrFormat("buffer '%s'", r.name()),
                   .not_used   = "not served",
                   .host_memfd = r.kind() == v1::STORED_BUFFER_KIND_HOST_MEMFD,
                   .bytes      = r.allocation_bytes(),
                   .backup     = false,
                   .index      = static_cast<std::size_t>(i)});
  }
  for (int i = 0; i < state->backups_size(); ++i) {
    auto const& r = state->backups(i);
    out.push_back({.fd_name    = r.fd_name(),
                   .what       = absl::StrFormat("backup '%s' of uid %d", r.backup_name(), r.uid()),
                   .not_used   = "not kept",
                   .host_memfd = true,
                   .bytes      = r.backup_bytes(),
                   .backup     = true,
                   .index      = static_cast<std::size_t>(i)});
  }
  return out;
}

/// Why `facts` is not what `record` describes, or nullopt.
std::optional<std::string> mismatch(record_view const& record, fd_facts const& facts)
{
  if (!facts.open) { return std::string("the fd cannot be examined (fstat failed)"); }
  if (record.host_memfd) {
    if (!facts.memfd) { return std::string("the record is a host memfd, the fd is not a memfd"); }
    if (!facts.sealed_size) {
      return std::string("the memfd is not sealed against resizing, as rmmd seals every one");
    }
    if (facts.bytes != record.bytes) {
      return absl::StrFormat("the memfd has %d bytes, the record %d", facts.bytes, record.bytes);
    }
    return std::nullopt;
  }
  if (facts.memfd) { return std::string("the record is a CUDA allocation, the fd is a memfd"); }
  return std::nullopt;
}

}  // namespace

fd_facts inspect_fd(int fd) noexcept
{
  fd_facts facts;
  struct stat st {};
  if (::fstat(fd, &st) != 0) { return facts; }
  facts.open = true;
  if (!S_ISREG(st.st_mode)) { return facts; }
  int const seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) { return facts; }
  facts.memfd       = true;
  facts.sealed_size = (seals & F_SEAL_SHRINK) != 0 && (seals & F_SEAL_GROW) != 0;
  facts.bytes       = static_cast<std::uint64_t>(st.st_size);
  return facts;
}

adoption_decision decide_adoption(v1::BufferRegistryState const* state,
                                  std::span<stored_fd_view const> fds)
{
  adoption_decision d;
  if (state != nullptr) {
    d.next_fd_id = std::max<std::uint64_t>(d.next_fd_id, state->next_fd_id());
  }
  std::unordered_map<std::string_view, std::vector<std::size_t>> fds_by_name;
  for (std::size_t i = 0; i < fds.size(); ++i) {
    fds_by_name[fds[i].fd_name].push_back(i);
    if (fds[i].fd_id >= d.next_fd_id) { d.next_fd_id = fds[i].fd_id + 1; }
  }
  std::vector<bool> fd_used(fds.size(), false);
  for (auto const& record : records_of(state)) {
    auto& adopt        = record.backup ? d.adopt_backups : d.adopt;
    auto& drop_records = record.backup ? d.drop_backup_records : d.drop_records;
    auto const it      = fds_by_name.find(record.fd_name);
    if (it == fds_by_name.end()) {
      d.problems.push_back(absl::StrFormat(
          "%s (fd '%s'): the fd store passed no fd for it, so its memory is gone: %s",
          record.what,
          record.fd_name,
          record.not_used));
      drop_records.push_back(record.index);
      continue;
    }
    for (auto f : it->second) { fd_used[f] = true; }
    if (it->second.size() > 1) {
      d.problems.push_back(absl::StrFormat(
          "%s (fd '%s'): the fd store passed %d fds of that name, which should be unique: "
          "%s, all removed from the store",
          record.what,
          record.fd_name,
          it->second.size(),
          record.not_used));
      drop_records.push_back(record.index);
      for (auto f : it->second) { d.drop_fds.push_back(f); }
      continue;
    }
    auto const f = it->second.front();
    if (auto why = mismatch(record, fds[f].facts)) {
      d.problems.push_back(absl::StrFormat("%s (fd '%s'): %s: %s, removed from the store",
                                           record.what,
                                           record.fd_name,
                                           *why,
                                           record.not_used));
      drop_records.push_back(record.index);
      d.drop_fds.push_back(f);
      continue;
    }
    adopt.emplace_back(record.index, f);
  }
  for (std::size_t f = 0; f < fds.size(); ++f) {
    if (fd_used[f]) { continue; }
    d.problems.push_back(absl::StrFormat(
        "fd '%s' from the fd store: %s: closed, removed from the store",
        fds[f].fd_name,
        state != nullptr ? "no record of the state file names it (stored just before a crash?)"
                         : "there is no usable state file to say whose it is"));
    d.drop_fds.push_back(f);
  }
  std::sort(d.drop_fds.begin(), d.drop_fds.end());
  return d;
}

adoption_result reconcile(std::optional<v1::BufferRegistryState> const& state,
                          std::vector<passed_stored_fd> fds)
{
  std::vector<stored_fd_view> views;
  views.reserve(fds.size());
  for (auto const& f : fds) {
    views.push_back(
        stored_fd_view{.fd_id = f.fd_id, .fd_name = f.name, .facts = inspect_fd(f.fd.get())});
  }
  auto const d = decide_adoption(state ? &*state : nullptr, views);
  adoption_result result;
  result.problems   = d.problems;
  result.next_fd_id = d.next_fd_id;
  for (auto [r, f] : d.adopt) {
    result.adopted.push_back(
        adopted_buffer{.record = state->buffers(static_cast<int>(r)), .fd = std::move(fds[f].fd)});
  }
  for (auto [r, f] : d.adopt_backups) {
    result.adopted_backups.push_back(
        adopted_backup{.record = state->backups(static_cast<int>(r)), .fd = std::move(fds[f].fd)});
  }
  for (auto f : d.drop_fds) {
    if (std::find(result.remove_from_store.begin(), result.remove_from_store.end(), fds[f].name) ==
        result.remove_from_store.end()) {
      result.remove_from_store.push_back(fds[f].name);
    }
    fds[f].fd = owned_fd();
  }
  return result;
}

}  // namespace rmmd::restart
