#include <rmmd/stable_memory_resource.hpp>

#include "client/detail/call_status.hpp"
#include "client/detail/device_scope.hpp"
#include "client/detail/process_exit.hpp"
#include "client/detail/session_access.hpp"
#include "client/detail/session_ids.hpp"
#include "client/detail/session_impl.hpp"
#include "client/detail/stable_mapping.hpp"
#include "common/fd_passing.hpp"

#include <rmm/error.hpp>

#include <algorithm>
#include <iterator>
#include <set>
#include <span>
#include <string>
#include <utility>

namespace rmmd {
namespace {

thread_local std::string thread_tag;

}  // namespace

scoped_stable_tag::scoped_stable_tag(std::string tag) : previous_(std::move(thread_tag))
{
  thread_tag = std::move(tag);
}

scoped_stable_tag::~scoped_stable_tag()
{
  thread_tag = std::move(previous_);
}

std::string const& scoped_stable_tag::current() noexcept
{
  return thread_tag;
}

namespace detail {
namespace {

using entry = stable_memory_resource_impl::entry;

/// The pieces the daemon gave `a`'s memory in (empty: one).
std::span<std::uint64_t const> pieces_of(v1::StableAllocation const& a)
{
  return {a.piece_bytes().data(), static_cast<std::size_t>(a.piece_bytes().size())};
}

bool selected(std::vector<std::string> const& tags, std::string const& tag)
{
  return tags.empty() || std::find(tags.begin(), tags.end(), tag) != tags.end();
}

void throw_if_failed(grpc::Status const& status, std::string const& what)
{
  if (!status.ok()) { throw_status(status, what); }
}

// Allocation ids. The resource holds client ids (session_ids.hpp): the
// daemon's id with the generation of the daemon that made it, so that an id
// of a daemon before a reconnect is never taken for one of the daemon of
// now. A request's ids go as that daemon knows them (to_daemon: false when
// one is an earlier daemon's), a response's come back as client ids
// (from_daemon: false for an id too large to carry a generation).

using id_list = google::protobuf::RepeatedField<std::uint64_t>;

bool to_daemon(id_list& ids, std::uint32_t generation)
{
  for (auto& id : ids) {
    if (generation_of(id) != generation) { return false; }
    id &= daemon_id_mask;
  }
  return true;
}
bool to_daemon(v1::StableAllocateRequest&, std::uint32_t)
{
  return true;
}
bool to_daemon(v1::RestoreBackupsRequest&, std::uint32_t)
{
  return true;
}
bool to_daemon(v1::StableFreeRequest& r, std::uint32_t generation)
{
  if (generation_of(r.allocation_id()) != generation) { return false; }
  r.set_allocation_id(r.allocation_id() & daemon_id_mask);
  return true;
}
template <class Request>
requires requires(Request r)
{
  r.mutable_allocation_ids();
}
bool to_daemon(Request& r, std::uint32_t generation)
{
  return to_daemon(*r.mutable_allocation_ids(), generation);
}

bool from_daemon(v1::StableAllocation& a, std::uint32_t generation)
{
  if ((a.allocation_id() & ~daemon_id_mask) != 0) { return false; }
  a.set_allocation_id(client_id(a.allocation_id(), generation));
  return true;
}
template <class Response>
bool from_daemon(Response& r, std::uint32_t generation)
{
  if constexpr (requires { r.mutable_allocations(); }) {
    for (auto& a : *r.mutable_allocations()) {
      if (!from_daemon(a, generation)) { return false; }
    }
  }
  return true;
}

/// Calls `method` through the channel with a deadline `extra` past the
/// session's call timeout (a wake may wait that long in the daemon), its
/// ids translated (above); a request about an earlier daemon's allocations
/// is answered `gone` without asking.
template <class Request, class Response>
grpc::Status call_with(session_impl& s,
                       grpc::Status (v1::Rmmd::Stub::*method)(grpc::ClientContext*,
                                                              Request const&,
                                                              Response*),
                       Request const& request,
                       Response* response,
                       std::chrono::milliseconds extra = {},
                       grpc::Status const& gone        = stable_of_gone_daemon())
{
  return s.channel().call(
      [&](v1::Rmmd::Stub& stub, grpc::ClientContext* ctx, std::uint32_t generation) {
        response->Clear();
        Request ours = request;
        if (!to_daemon(ours, generation)) { return gone; }
        ctx->set_deadline(std::chrono::system_clock::now() + s.options.call_timeout + extra);
        auto status = (stub.*method)(ctx, ours, response);
        if (status.ok() && !from_daemon(*response, generation)) {
          return grpc::Status(grpc::StatusCode::INTERNAL,
                              "the daemon sent an allocation id of 2^48 or more, which this "
                              "client cannot take");
        }
        return status;
      });
}

}  // namespace

stable_memory_resource_impl::stable_memory_resource_impl(session s,
                                                         pool_info const& pool,
                                                         std::string default_tag)
    : session_(std::move(s)), pool_(pool), default_tag_(std::move(default_tag))
{
  if (pool_.backend != backend_kind::cuda) {
    throw rmmd::logic_error("rmmd: pool '" + pool_.name +
                            "' is not a CUDA pool; address-stable memory lives in CUDA pools");
  }
  if (pool_.device < 0) {
    throw rmmd::logic_error("rmmd: pool '" + pool_.name + "' is on GPU " + pool_.gpu_uuid +
                            ", which this process cannot see; use the pool of a GPU it sees");
  }
  if (!impl_of(session_).channel().daemon_pool(pool_.id)) {
    throw rmmd::session_error("rmmd: the daemon serving now has no pool '" + pool_.name + "'");
  }
  watch_process_exit();
}

stable_memory_resource_impl::~stable_memory_resource_impl()
{
  if (process_is_exiting()) { return; }  // the daemon frees what a closed session held
  std::lock_guard lock(mutex_);
  device_scope on(pool_.device);
  if (cudaDeviceSynchronize() != cudaSuccess) { cudaGetLastError(); }
  for (auto& [address, e] : entries_) {
    if (e.kept) {
      // Asleep under a backup name: the daemon keeps it once the session
      // ends; only this process's addresses and mappings go.
      stable::unmap_backup(e);
      stable::unreserve(e.address, e.bytes);
      continue;
    }
    free_entry(e);
  }
  entries_.clear();
}

void* stable_memory_resource_impl::allocate(cuda::stream_ref, std::size_t bytes, std::size_t)
{
  auto const& scoped = scoped_stable_tag::current();
  return allocate_tagged(scoped.empty() ? default_tag_ : scoped, bytes);
}

void* stable_memory_resource_impl::allocate_sync(std::size_t bytes, std::size_t alignment)
{
  return allocate(cuda::stream_ref{cudaStream_t{}}, bytes, alignment);
}

void* stable_memory_resource_impl::allocate_tagged(std::string const& tag, std::size_t bytes)
{
  if (bytes == 0) { return nullptr; }  // as RMM's resources do: no request
  auto& s          = impl_of(session_);
  auto daemon_pool = s.channel().daemon_pool(pool_.id);  // the daemon of now's
  if (!daemon_pool) {
    throw rmmd::session_error("rmmd: the daemon serving now has no pool '" + pool_.name + "'");
  }
  v1::StableAllocateRequest request;
  request.set_pool_id(*daemon_pool);
  request.set_size(bytes);
  request.set_tag(tag);
  request.set_maps_pieces(true);
  v1::StableAllocation granted;
  auto const what = "rmmd: address-stable allocation of " + std::to_string(bytes) +
                    " bytes tagged '" + tag + "' in pool '" + pool_.name + "'";
  throw_if_failed(call_with(s, &v1::Rmmd::Stub::StableAllocate, request, &granted), what);
  entry e{.id      = granted.allocation_id(),
          .address = 0,
          .bytes   = granted.mapping_bytes(),
          .size    = granted.size(),
          .tag     = tag,
          .mapped  = false};
  try {
    device_scope on(pool_.device);
    stable::check(on.error(), "cudaSetDevice");
    auto const ids    = std::vector<std::uint64_t>{e.id};
    auto const pieces = pieces_of(granted);
    auto const counts = std::vector<std::size_t>{stable::fd_count(pieces)};
    auto fds          = stable::fetch_fds(s, ids, counts, false);
    try {
      e.address = stable::reserve(e.bytes);
    } catch (...) {
      fd_passing::close_fds(fds.front(), fds.front().size());
      throw;
    }
    stable::map(e, std::move(fds.front()), pieces, pool_.device);
  } catch (...) {
    free_entry(e);
    throw;
  }
  std::lock_guard lock(mutex_);
  auto* ptr = reinterpret_cast<void*>(e.address);
  entries_.emplace(e.address, std::move(e));
  return ptr;
}

void stable_memory_resource_impl::deallocate(cuda::stream_ref stream,
                                             void* ptr,
                                             std::size_t,
                                             std::size_t) noexcept
{
  if (ptr == nullptr || process_is_exiting()) { return; }
  std::lock_guard lock(mutex_);
  auto it = entries_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == entries_.end()) { return; }
  // Unmapping is not stream-ordered: the stream's work on it must be done.
  if (cudaStreamSynchronize(stream.get()) != cudaSuccess) { cudaGetLastError(); }
  free_entry(it->second);
  entries_.erase(it);
}

void stable_memory_resource_impl::deallocate_sync(void* ptr,
                                                  std::size_t bytes,
                                                  std::size_t alignment) noexcept
{
  deallocate(cuda::stream_ref{cudaStream_t{}}, ptr, bytes, alignment);
}

void stable_memory_resource_impl::free_entry(entry& e) noexcept
{
  stable::unmap(e);
  stable::unmap_backup(e);
  if (e.address != 0) { stable::unreserve(e.address, e.bytes); }
  e.address = 0;
  try {
    v1::StableFreeRequest request;
    request.set_allocation_id(e.id);
    v1::StableFreeResponse ignored;
    // A gone daemon freed it with the session; one before a reconnect is
    // asked nothing (done: the daemon of now never lent it).
    auto status = call_with(
        impl_of(session_), &v1::Rmmd::Stub::StableFree, request, &ignored, {}, grpc::Status::OK);
    (void)status;
  } catch (...) {  // NOLINT(bugprone-empty-catch): never throw from a free
  }
}

std::size_t stable_memory_resource_impl::sleep(std::vector<std::string> const& tags,
                                               sleep_backup backup,
                                               std::string const& backup_name,
                                               cudaStream_t stream)
{
  std::lock_guard lock(mutex_);
  auto& s = impl_of(session_);
  // This resource's own allocations only: a session may have several.
  v1::SleepRequest request;
  for (auto const& [address, e] : entries_) {
    if (e.mapped && selected(tags, e.tag)) { request.add_allocation_ids(e.id); }
  }
  if (request.allocation_ids().empty()) { return 0; }
  request.set_backup(backup == sleep_backup::host ? v1::SLEEP_BACKUP_HOST : v1::SLEEP_BACKUP_NONE);
  request.set_backup_name(backup_name);
  v1::SleepResponse chosen;
  throw_if_failed(call_with(s, &v1::Rmmd::Stub::Sleep, request, &chosen), "rmmd: sleep");
  std::map<std::uint64_t, entry*> by_id;
  for (auto& [address, e] : entries_) { by_id.emplace(e.id, &e); }
  std::vector<std::uint64_t> ids;
  std::vector<entry*> backed;
  std::vector<std::uint64_t> backed_serials;
  for (auto const& a : chosen.allocations()) {
    ids.push_back(a.allocation_id());
    auto found = by_id.find(a.allocation_id());
    if (found == by_id.end()) { continue; }
    if (a.has_backup()) {
      backed.push_back(found->second);
      backed_serials.push_back(a.backup_serial());
    } else {
      stable::unmap_backup(*found->second);  // a sleep without one dropped it
    }
  }
  if (ids.empty()) { return 0; }
  auto cancel = [&] {
    v1::SleepDoneRequest undo;
    for (auto id : ids) { undo.add_allocation_ids(id); }
    undo.set_cancel(true);
    v1::SleepDoneResponse ignored;
    (void)call_with(s, &v1::Rmmd::Stub::SleepDone, undo, &ignored);
    for (auto* e : backed) { stable::unmap_backup(*e); }  // the cancel dropped them
  };
  device_scope on(pool_.device);
  try {
    stable::check(on.error(), "cudaSetDevice");
    if (!backed.empty()) {
      // What other streams still write must be in the copy: all of the
      // device's work first, then the copies on `stream`.
      stable::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before the backup copies");
      stable::map_backups(s, backed, backed_serials);
      stable::copy_backups(backed, stable::direction::to_host, stream);
    }
    // Work on other streams may still use the memory: unmapping is not
    // stream-ordered.
    stable::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize before unmapping");
  } catch (...) {
    cancel();
    throw;
  }
  for (auto id : ids) {
    if (auto found = by_id.find(id); found != by_id.end()) { stable::unmap(*found->second); }
  }
  v1::SleepDoneRequest done;
  for (auto id : ids) { done.add_allocation_ids(id); }
  v1::SleepDoneResponse released;
  throw_if_failed(call_with(s, &v1::Rmmd::Stub::SleepDone, done, &released),
                  "rmmd: sleep (releasing the memory)");
  if (!backup_name.empty()) {
    for (auto* e : backed) { e->kept = true; }
  }
  return released.released_bytes();
}

std::size_t stable_memory_resource_impl::wake(std::vector<std::string> const& tags,
                                              std::chrono::milliseconds deadline,
                                              cudaStream_t stream)
{
  std::lock_guard lock(mutex_);
  // This resource's own allocations only: a session may have several.
  std::vector<std::uint64_t> ids;
  for (auto const& [address, e] : entries_) {
    if (!e.mapped && selected(tags, e.tag)) { ids.push_back(e.id); }
  }
  if (ids.empty()) { return 0; }
  return wake_locked(ids, deadline, stream);
}

std::size_t stable_memory_resource_impl::wake_locked(std::vector<std::uint64_t> const& ids,
                                                     std::chrono::milliseconds deadline,
                                                     cudaStream_t stream)
{
  auto& s = impl_of(session_);
  v1::WakeRequest request;
  for (auto id : ids) { request.add_allocation_ids(id); }
  request.set_deadline_ms(static_cast<std::uint32_t>(std::max<std::int64_t>(deadline.count(), 0)));
  request.set_maps_pieces(true);
  v1::WakeResponse woken;
  throw_if_failed(call_with(s, &v1::Rmmd::Stub::Wake, request, &woken, deadline), "rmmd: wake");
  std::map<std::uint64_t, entry*> by_id;
  for (auto& [address, e] : entries_) { by_id.emplace(e.id, &e); }
  std::vector<std::uint64_t> chosen;
  std::vector<entry*> mapped;
  std::vector<entry*> backed;
  std::vector<std::uint64_t> backed_serials;
  std::size_t bytes = 0;
  std::vector<std::size_t> counts;
  for (auto const& a : woken.allocations()) {
    chosen.push_back(a.allocation_id());
    counts.push_back(stable::fd_count(pieces_of(a)));
  }
  if (chosen.empty()) { return 0; }
  device_scope on(pool_.device);
  try {
    stable::check(on.error(), "cudaSetDevice");
    auto fds = stable::fetch_fds(s, chosen, counts, false);
    for (std::size_t i = 0; i < chosen.size(); ++i) {
      auto found = by_id.find(chosen[i]);
      if (found == by_id.end()) {  // not this resource's: give it back asleep below
        fd_passing::close_fds(fds[i], fds[i].size());
        continue;
      }
      try {
        stable::map(*found->second,
                    std::move(fds[i]),
                    pieces_of(woken.allocations(static_cast<int>(i))),
                    pool_.device);
      } catch (...) {
        for (auto j = i + 1; j < fds.size(); ++j) { fd_passing::close_fds(fds[j], fds[j].size()); }
        throw;
      }
      mapped.push_back(found->second);
      bytes += found->second->bytes;
      if (auto const& a = woken.allocations(static_cast<int>(i)); a.has_backup()) {
        backed.push_back(found->second);
        backed_serials.push_back(a.backup_serial());
      }
    }
    if (!backed.empty()) {
      stable::map_backups(s, backed, backed_serials);
      stable::copy_backups(backed, stable::direction::to_device, stream);
    }
  } catch (...) {
    // All or none: what this call mapped goes, and the daemon takes the
    // memory back (the backups stay, for the next wake).
    for (auto* e : mapped) { stable::unmap(*e); }
    v1::SleepDoneRequest undo;
    for (auto id : chosen) { undo.add_allocation_ids(id); }
    v1::SleepDoneResponse ignored;
    (void)call_with(s, &v1::Rmmd::Stub::SleepDone, undo, &ignored);
    throw;
  }
  // WakeDone is about backups alone: a wake of none (a KV cache) is done.
  bool const any_backup = std::any_of(woken.allocations().begin(),
                                      woken.allocations().end(),
                                      [](auto const& a) { return a.has_backup(); });
  if (!any_backup) { return bytes; }
  v1::WakeDoneRequest done;
  for (auto id : chosen) { done.add_allocation_ids(id); }
  done.set_keep_backups(keep_backups_);
  v1::WakeDoneResponse dropped;
  throw_if_failed(call_with(s, &v1::Rmmd::Stub::WakeDone, done, &dropped),
                  keep_backups_ ? "rmmd: wake (keeping the backups' room)"
                                : "rmmd: wake (dropping the backups)");
  if (!keep_backups_) {
    for (auto* e : mapped) { stable::unmap_backup(*e); }
  }
  return bytes;
}

std::vector<restored_allocation> stable_memory_resource_impl::restore(
    std::string const& backup_name, std::chrono::milliseconds deadline, cudaStream_t stream)
{
  std::lock_guard lock(mutex_);
  auto& s = impl_of(session_);
  v1::RestoreBackupsRequest request;
  request.set_backup_name(backup_name);
  v1::RestoreBackupsResponse kept;
  throw_if_failed(call_with(s, &v1::Rmmd::Stub::RestoreBackups, request, &kept),
                  "rmmd: restore backups '" + backup_name + "'");
  std::vector<std::uint64_t> ids;
  std::vector<restored_allocation> out;
  for (auto const& a : kept.allocations()) {
    entry e{.id      = a.allocation_id(),
            .address = 0,
            .bytes   = a.mapping_bytes(),
            .size    = a.size(),
            .tag     = a.tag(),
            .mapped  = false};
    e.address = stable::reserve(e.bytes);  // throws before anything is recorded for it
    out.push_back({.ptr = reinterpret_cast<void*>(e.address), .size = e.size, .tag = e.tag});
    ids.push_back(e.id);
    entries_.emplace(e.address, std::move(e));
  }
  // Asleep until woken here: a failed wake leaves them for wake() to retry.
  wake_locked(ids, deadline, stream);
  return out;
}

bool stable_memory_resource_impl::read_backup(void const* ptr, std::size_t bytes, void* out) const
{
  auto const at = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard lock(mutex_);
  auto it = entries_.upper_bound(at);
  if (it == entries_.begin() || bytes > std::prev(it)->second.size ||
      at - std::prev(it)->first > std::prev(it)->second.size - bytes) {
    throw rmmd::not_found_error("rmmd: " + std::to_string(bytes) + " bytes at " +
                                std::to_string(at) +
                                " are not inside an address-stable allocation of pool '" +
                                pool_.name + "' made by this process");
  }
  auto const& e = std::prev(it)->second;
  if (e.mapped) { return false; }  // awake: its backup, if any, is stale
  std::vector<std::vector<int>> fds;
  try {
    fds = stable::fetch_fds(
        impl_of(session_), std::vector<std::uint64_t>{e.id}, std::vector<std::size_t>{1}, true);
  } catch (rmmd::precondition_error const&) {
    return false;  // asleep without a backup
  }
  stable::read_backup(fds.front().front(), e.bytes, at - e.address, bytes, out);
  return true;
}

std::string stable_memory_resource_impl::tag_of(void const* ptr) const
{
  std::lock_guard lock(mutex_);
  auto it = entries_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return it == entries_.end() ? std::string() : it->second.tag;
}

bool stable_memory_resource_impl::is_awake(void const* ptr) const
{
  std::lock_guard lock(mutex_);
  auto it = entries_.find(reinterpret_cast<std::uintptr_t>(ptr));
  return it != entries_.end() && it->second.mapped;
}

}  // namespace detail
}  // namespace rmmd
