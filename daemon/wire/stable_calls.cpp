#include "daemon/wire/calls.hpp"

#include "rmmd/v1/rmmd.pb.h"

#include <absl/strings/str_format.h>

#include <algorithm>
#include <chrono>
#include <span>
#include <string>
#include <vector>

// Address-stable memory, sleep and wake (docs/sleep.md): StableAllocate,
// StableFree, Sleep, SleepDone, Wake, WakeDone, RestoreBackups, DropBackups,
// ListSleepers, and StableFds (the session socket only: it carries fds).

namespace rmmd::wire {
namespace {

/// Longest wait a wake may ask for.
constexpr std::uint32_t max_wake_deadline_ms = 10 * 60 * 1000;

void to_proto(core::stable_grant const& g, v1::StableAllocation* out)
{
  out->set_allocation_id(g.id);
  out->set_size(g.size);
  out->set_mapping_bytes(g.bytes);
  out->set_tag(g.tag);
  out->set_awake(g.awake);
  out->set_has_backup(g.has_backup);
  out->set_backup_serial(g.backup_serial);
  for (auto bytes : g.pieces) { out->add_piece_bytes(bytes); }
}

/// How many pieces the client maps an allocation's memory in.
std::size_t max_pieces(bool maps_pieces)
{
  return maps_pieces ? core::max_stable_pieces : 1;
}

template <class Message>
void to_proto(std::vector<core::stable_grant> const& grants, Message* reply)
{
  for (auto const& g : grants) { to_proto(g, reply->add_allocations()); }
}

std::vector<std::string> tags_of(google::protobuf::RepeatedPtrField<std::string> const& tags)
{
  return {tags.begin(), tags.end()};
}

template <class Field>
std::span<core::stable_id const> ids_of(Field const& ids)
{
  return {ids.data(), static_cast<std::size_t>(ids.size())};
}

absl::Status stable_allocate(call_context const& c,
                             v1::StableAllocateRequest const& request,
                             v1::StableAllocation* reply)
{
  auto grant = c.core.stables().allocate(c.session,
                                         request.pool_id(),
                                         request.size(),
                                         request.tag(),
                                         max_pieces(request.maps_pieces()));
  if (!grant.ok()) { return grant.status(); }
  to_proto(*grant, reply);
  return absl::OkStatus();
}

absl::Status sleep(call_context const& c, v1::SleepRequest const& request, v1::SleepResponse* reply)
{
  if (request.backup() != v1::SLEEP_BACKUP_NONE && request.backup() != v1::SLEEP_BACKUP_HOST) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sleep: backup %d is not a SleepBackup this daemon knows (NONE or HOST)",
                        request.backup()));
  }
  auto const tags = tags_of(request.tags());
  auto grants     = c.core.stables().begin_sleep(c.session,
                                             tags,
                                             request.backup() == v1::SLEEP_BACKUP_HOST,
                                             request.backup_name(),
                                             ids_of(request.allocation_ids()));
  if (!grants.ok()) { return grants.status(); }
  to_proto(*grants, reply);
  return absl::OkStatus();
}

absl::Status sleep_done(call_context const& c,
                        v1::SleepDoneRequest const& request,
                        v1::SleepDoneResponse* reply)
{
  auto bytes =
      c.core.stables().finish_sleep(c.session, ids_of(request.allocation_ids()), request.cancel());
  if (!bytes.ok()) { return bytes.status(); }
  reply->set_released_bytes(*bytes);
  return absl::OkStatus();
}

absl::Status wake(call_context const& c, v1::WakeRequest const& request, v1::WakeResponse* reply)
{
  if (request.deadline_ms() > max_wake_deadline_ms) {
    return absl::InvalidArgumentError(
        absl::StrFormat("wake: deadline_ms %d is longer than the %d ms a wake may wait",
                        request.deadline_ms(),
                        max_wake_deadline_ms));
  }
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(request.deadline_ms());
  if (c.deadline) {  // never past the caller's own deadline
    auto const left = *c.deadline - std::chrono::system_clock::now();
    deadline        = std::min(deadline, std::chrono::steady_clock::now() + left);
  }
  auto const tags = tags_of(request.tags());
  auto grants     = c.core.stables().wake(c.session,
                                      tags,
                                      ids_of(request.allocation_ids()),
                                      deadline,
                                      max_pieces(request.maps_pieces()));
  if (!grants.ok()) { return grants.status(); }
  to_proto(*grants, reply);
  return absl::OkStatus();
}

absl::Status stable_fds(call_context const& c,
                        v1::StableFdsRequest const& request,
                        v1::StableFdsResponse* reply)
{
  if (c.fds == nullptr) {
    return absl::FailedPreconditionError("this connection cannot carry fds");
  }
  auto fds = c.core.stables().fds(c.session, ids_of(request.allocation_ids()), request.backup());
  if (!fds.ok()) { return fds.status(); }
  c.fds->insert(c.fds->end(), fds->begin(), fds->end());
  reply->set_fd_count(static_cast<std::int32_t>(fds->size()));
  return absl::OkStatus();
}

absl::Status list_sleepers(call_context const& c,
                           v1::ListSleepersRequest const&,
                           v1::ListSleepersResponse* reply)
{
  for (auto const& s : c.core.stables().sleepers()) {
    auto* out = reply->add_sleepers();
    out->set_session_id(s.session);
    out->set_uid(s.uid);
    out->set_pid(s.pid);
    out->set_command(s.command);
    out->set_backup_name(s.backup_name);
    for (auto const& tag : s.tags) { out->add_tags(tag); }
    out->set_sleeping_allocations(s.sleeping_allocations);
    out->set_sleeping_bytes(s.sleeping_bytes);
    out->set_backup_bytes(s.backup_bytes);
    out->set_awake_bytes(s.awake_bytes);
    out->set_asleep_since_unix_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(s.asleep_since.time_since_epoch())
            .count());
  }
  auto const totals = c.core.stables().totals();
  reply->set_wake_waits(totals.wake_waits);
  reply->set_wake_failures(totals.wake_failures);
  return absl::OkStatus();
}

}  // namespace

std::vector<call> stable_calls()
{
  return {
      make_call<v1::StableAllocateRequest, v1::StableAllocation>(
          "StableAllocate", {}, &stable_allocate),
      make_call<v1::StableFreeRequest, v1::StableFreeResponse>(
          "StableFree",
          {},
          [](call_context const& c, auto const& request, auto*) {
            return c.core.stables().free(c.session, request.allocation_id());
          }),
      make_call<v1::SleepRequest, v1::SleepResponse>("Sleep", {}, &sleep),
      make_call<v1::SleepDoneRequest, v1::SleepDoneResponse>("SleepDone", {}, &sleep_done),
      make_call<v1::WakeRequest, v1::WakeResponse>("Wake", {}, &wake),
      make_call<v1::WakeDoneRequest, v1::WakeDoneResponse>(
          "WakeDone",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            auto bytes = c.core.stables().finish_wake(
                c.session, ids_of(request.allocation_ids()), request.keep_backups());
            if (!bytes.ok()) { return bytes.status(); }
            reply->set_dropped_backup_bytes(*bytes);
            return absl::OkStatus();
          }),
      make_call<v1::RestoreBackupsRequest, v1::RestoreBackupsResponse>(
          "RestoreBackups",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            auto grants = c.core.stables().restore(c.session, request.backup_name());
            if (!grants.ok()) { return grants.status(); }
            to_proto(*grants, reply);
            return absl::OkStatus();
          }),
      make_call<v1::DropBackupsRequest, v1::DropBackupsResponse>(
          "DropBackups",
          {},
          [](call_context const& c, auto const& request, auto* reply) {
            auto bytes = c.core.stables().drop_backups(c.session, request.backup_name());
            if (!bytes.ok()) { return bytes.status(); }
            reply->set_dropped_bytes(*bytes);
            return absl::OkStatus();
          }),
      make_call<v1::ListSleepersRequest, v1::ListSleepersResponse>(
          "ListSleepers", {}, &list_sleepers),
      make_call<v1::StableFdsRequest, v1::StableFdsResponse>(
          "StableFds",
          {.grpc = false,
           .session =
               on_session<&v1::SessionCall::stable_fds, &v1::SessionReply::mutable_stable_fds>(
                   "stable_fds")},
          &stable_fds),
  };
}

}  // namespace rmmd::wire
