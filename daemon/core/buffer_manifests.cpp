// buffer_registry's manifests (docs/sharing.md, "Manifests"): set by a
// buffer's creating session before it publishes, read by any session that
// may see or holds the buffer, and the checks an open makes of the access
// it asks for and of the labels it expects (the fingerprint guard).
//
// A manifest is kept whole behind a shared pointer to const: a Set replaces
// the pointer, and grants and descriptions share it without copying a
// table that may hold a million tensors, under the core's lock.

#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/core/buffer_registry.hpp"
#include "daemon/core/core_entries.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

namespace rmmd::core {

std::optional<absl::Status> buffer_registry::open_refusal_locked(buffer_entry const& b,
                                                                 session_id session,
                                                                 buffer_open_options const& how,
                                                                 std::string_view request) const
{
  if (how.access == buffer_access::read_write && b.creator != session && !b.allow_writers) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s for writing: its creator did not allow writers (create it with allow_writers); open "
        "it for reading (the default)",
        std::string(request)));
  }
  static std::map<std::string, std::string> const none;
  auto const& labels = b.manifest ? b.manifest->labels : none;
  for (auto const& [key, want] : how.expect_labels) {  // in key order
    auto have = labels.find(key);
    if (have == labels.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "buffer %s: has no label %s", quoted_for_message(b.name), quoted_for_message(key)));
    }
    if (have->second != want) {
      return absl::FailedPreconditionError(absl::StrFormat("buffer %s: label %s is %s, expected %s",
                                                           quoted_for_message(b.name),
                                                           quoted_for_message(key),
                                                           quoted_for_message(have->second),
                                                           quoted_for_message(want)));
    }
  }
  return std::nullopt;
}

absl::Status buffer_registry::set_buffer_manifest(session_id session,
                                                  buffer_id id,
                                                  buffer_manifest manifest)
{
  std::unique_lock lock(state_.mutex);
  auto const request = absl::StrFormat("set the manifest of buffer %d", id);
  auto found         = writing_buffer_locked(session, id, request, "set its manifest");
  if (!found.ok()) { return found.status(); }
  auto const& b    = **found;
  auto const named = absl::StrFormat("%s (%s)", request, quoted_for_message(b.name));
  auto const size  = b.size;
  auto const pool  = b.pool;
  // The checks of a large table take a while: not under the lock. The
  // buffer may change meanwhile, so what was found is looked at again after.
  lock.unlock();
  auto problem = manifest_problem(manifest, size);
  if (problem) { return absl::InvalidArgumentError(absl::StrCat(named, ": ", *problem)); }
  lock.lock();
  auto it = state_.buffers.find(id);
  if (it == state_.buffers.end() || it->second->creator != session ||
      it->second->state != buffer_state::writing ||
      state_.find_session_locked(session) == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        named, ": the buffer was published, deleted or closed while its manifest was checked"));
  }
  if (auto const& uuid = state_.pools[pool]->config.gpu_uuid; !uuid.empty()) {
    manifest.labels[std::string(gpu_uuid_label)] = uuid;
  }
  it->second->manifest = std::make_shared<buffer_manifest const>(std::move(manifest));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<buffer_manifest const>> buffer_registry::buffer_manifest_of(
    session_id session, buffer_id id) const
{
  std::lock_guard lock(state_.mutex);
  auto const request = absl::StrFormat("manifest of buffer %d", id);
  auto found         = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto it = state_.buffers.find(id);
  if (it == state_.buffers.end() || !(*found)->holds.contains(id) || it->second->creating) {
    return absl::NotFoundError(absl::StrCat(
        request,
        ": this session does not hold it (open it first; never opened, or closed already)"));
  }
  return it->second->manifest;
}

absl::StatusOr<buffer_description> buffer_registry::describe_buffer(session_id session,
                                                                    std::string_view name) const
{
  std::lock_guard lock(state_.mutex);
  auto const request = absl::StrFormat("describe buffer %s", quoted_for_message(name));
  auto found         = state_.session_locked(session, request);
  if (!found.ok()) { return found.status(); }
  auto n = state_.buffer_names.find(std::string(name));
  // One answer for a missing buffer and one the caller may not see, so that
  // names do not leak.
  if (n == state_.buffer_names.end() ||
      !may_see_locked(*state_.buffers.at(n->second), session, (*found)->peer)) {
    return absl::NotFoundError(absl::StrCat(
        request, ": no buffer of this name that this session may see (see `rmmctl buffers`)"));
  }
  auto const& b = *state_.buffers.at(n->second);
  return buffer_description{.info = buffer_info_locked(b), .manifest = b.manifest};
}

}  // namespace rmmd::core
