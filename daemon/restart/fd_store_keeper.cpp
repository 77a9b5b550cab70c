#include "daemon/restart/fd_store_keeper.hpp"

#include "daemon/log.hpp"
#include "daemon/restart/state_file.hpp"
#include "daemon/wire/proto_convert.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace rmmd::restart {

v1::StoredBuffer stored_record(core::kept_buffer const& buffer)
{
  auto const& info = buffer.info;
  v1::StoredBuffer r;
  r.set_name(info.name);
  r.set_size(info.size);
  r.set_allocation_bytes(buffer.allocation_bytes);
  r.set_pool_name(info.pool_name);
  r.set_gpu_uuid(buffer.host_memfd ? std::string() : buffer.gpu_uuid);
  r.set_kind(buffer.host_memfd ? v1::STORED_BUFFER_KIND_HOST_MEMFD
                               : v1::STORED_BUFFER_KIND_VMM_POSIX_FD);
  r.set_creator_uid(info.creator_uid);
  r.set_creator_pid(info.creator_pid);
  if (info.gid) { r.set_gid(*info.gid); }
  r.set_allow_writers(info.allow_writers);
  r.set_persistent(info.persistent);
  r.set_state(v1::BUFFER_STATE_PUBLISHED);
  r.set_created_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(info.created.time_since_epoch())
          .count());
  r.set_fabric(!buffer.fabric_handle.empty());
  if (!buffer.fabric_handle.empty()) {
    r.set_fabric_handle(reinterpret_cast<char const*>(buffer.fabric_handle.data()),
                        buffer.fabric_handle.size());
  }
  if (buffer.manifest) { wire::to_proto(*buffer.manifest, r.mutable_manifest()); }
  return r;
}

v1::StoredBackup stored_record(core::kept_backup const& backup)
{
  v1::StoredBackup r;
  r.set_backup_name(backup.backup_name);
  r.set_uid(backup.uid);
  r.set_gid(backup.gid);
  r.set_pid(backup.pid);
  r.set_command(backup.command);
  r.set_tag(backup.tag);
  r.set_size(backup.size);
  r.set_allocation_bytes(backup.bytes);
  r.set_pool_name(backup.pool_name);
  r.set_gpu_uuid(backup.gpu_uuid);
  r.set_host_pool_name(backup.host_pool_name);
  r.set_backup_bytes(backup.backup_bytes);
  r.set_asleep_since_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(backup.asleep_since.time_since_epoch())
          .count());
  return r;
}

namespace {

/// A dup of `fd` for the store, or an empty one after saying why `what`
/// will not outlive this daemon.
owned_fd dup_for_store(int fd, std::string const& what) noexcept
{
  int const copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (copy < 0) {
    log::error("%s will not outlive this daemon: cannot duplicate its fd (%s)",
               what,
               std::strerror(errno));
  }
  return owned_fd(copy);
}

}  // namespace

fd_store_keeper::fd_store_keeper(options opts, fd_store& store)
    : options_(std::move(opts)),
      store_(store),
      next_fd_id_(std::max<std::uint64_t>(options_.next_fd_id, 1))
{
  thread_ = std::thread([this] { run(); });
}

fd_store_keeper::~fd_store_keeper()
{
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

bool fd_store_keeper::enqueue(event e) noexcept
{
  try {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(e));
    ++queued_;
  } catch (...) {
    return false;  // out of memory: `e` (and any fd it holds) is dropped
  }
  wake_.notify_one();
  return true;
}

void fd_store_keeper::keep(core::kept_buffer const& buffer) noexcept
{
  try {
    auto fd = dup_for_store(buffer.fd, "buffer '" + buffer.info.name + "'");
    if (fd) { enqueue(keep_event{.buffer = buffer, .fd = std::move(fd)}); }
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory: served, not kept
  }
}

void fd_store_keeper::forget(core::buffer_id id) noexcept
{
  // Not queued (out of memory): the next start finds its fd without a use
  // and drops it then.
  enqueue(forget_event{.id = id});
}

void fd_store_keeper::keep_backup(core::kept_backup const& backup) noexcept
{
  try {
    auto fd = dup_for_store(backup.fd, "sleep backup '" + backup.backup_name + "'");
    if (fd) { enqueue(keep_backup_event{.backup = backup, .fd = std::move(fd)}); }
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory: kept while this daemon lives
  }
}

void fd_store_keeper::forget_backup(core::stable_id id) noexcept
{
  enqueue(forget_backup_event{.id = id});
}

bool fd_store_keeper::wait_until_kept(std::chrono::steady_clock::time_point deadline) noexcept
{
  std::unique_lock lock(mutex_);
  auto const target = queued_;
  if (applied_changed_.wait_until(lock, deadline, [&] { return applied_ >= target; })) {
    return true;
  }
  log::warn(
      "a published buffer or a sleep backup is not yet kept across a restart: the fd store "
      "and the state file (%s) are slow to take it",
      options_.state_file.string());
  return false;
}

void fd_store_keeper::adopted(core::buffer_id id, v1::StoredBuffer record)
{
  std::lock_guard lock(records_mutex_);
  next_fd_id_ = std::max(next_fd_id_, record.fd_id() + 1);
  records_.emplace(id, std::move(record));
}

void fd_store_keeper::adopted_backup(core::stable_id id, v1::StoredBackup record)
{
  std::lock_guard lock(records_mutex_);
  next_fd_id_ = std::max(next_fd_id_, record.fd_id() + 1);
  backup_records_.emplace(id, std::move(record));
}

absl::Status fd_store_keeper::write_now()
{
  std::lock_guard lock(records_mutex_);
  return write_locked_records();
}

absl::Status fd_store_keeper::write_locked_records()
{
  v1::BufferRegistryState state;
  state.set_format_version(state_format_version);
  state.set_daemon_generation(options_.generation);
  state.set_next_fd_id(next_fd_id_);
  state.set_written_unix_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count());
  for (auto const& [id, record] : records_) { *state.add_buffers() = record; }
  for (auto const& [id, record] : backup_records_) { *state.add_backups() = record; }
  return write_state_file(options_.state_file, state);
}

void fd_store_keeper::run()
{
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) { return; }  // stopping, and nothing left to do
    auto batch = std::move(queue_);
    queue_.clear();
    auto const count = batch.size();
    lock.unlock();
    apply(std::move(batch));
    lock.lock();
    applied_ += count;
    applied_changed_.notify_all();
  }
}

bool fd_store_keeper::apply_locked(event& e, std::vector<std::string>& to_remove)
{
  // Stores `fd` under the next fd_id's name (`fd_name_for(fd_id, name)`) with
  // `record`, kept in `records` under `id`; the fd name it replaces, if any,
  // leaves the store.
  auto store = [&](auto& records,
                   auto id,
                   auto record,
                   auto fd_name_for,
                   std::string const& name,
                   owned_fd const& fd,
                   char const* kind) {
    auto const fd_id   = next_fd_id_++;
    auto const fd_name = fd_name_for(fd_id, name);
    record.set_fd_id(fd_id);
    record.set_fd_name(fd_name);
    if (auto stored = store_.store(fd_name, fd.get()); !stored.ok()) {
      log::error("%s '%s' will not outlive this daemon: %s", kind, name, stored.message());
      return false;
    }
    if (auto old = records.find(id); old != records.end()) {
      to_remove.push_back(old->second.fd_name());
    }
    records[id] = std::move(record);
    return true;
  };
  auto forget = [&](auto& records, auto id) {
    auto r = records.find(id);
    if (r == records.end()) { return false; }
    to_remove.push_back(r->second.fd_name());
    records.erase(r);
    return true;
  };
  if (auto* k = std::get_if<keep_event>(&e)) {
    return store(records_,
                 k->buffer.info.id,
                 stored_record(k->buffer),
                 buffer_fd_name,
                 k->buffer.info.name,
                 k->fd,
                 "buffer");
  }
  if (auto* k = std::get_if<keep_backup_event>(&e)) {
    return store(backup_records_,
                 k->backup.id,
                 stored_record(k->backup),
                 backup_fd_name,
                 k->backup.backup_name,
                 k->fd,
                 "sleep backup");
  }
  if (auto* f = std::get_if<forget_event>(&e)) { return forget(records_, f->id); }
  return forget(backup_records_, std::get<forget_backup_event>(e).id);
}

void fd_store_keeper::apply(std::deque<event> batch)
{
  std::lock_guard lock(records_mutex_);
  std::vector<std::string> to_remove;
  bool changed = false;
  for (auto& e : batch) { changed = apply_locked(e, to_remove) || changed; }
  if (changed) {
    if (auto written = write_locked_records(); !written.ok()) {
      log::error(
          "the state file was not written, so the buffers published and the backups slept since "
          "it last was will not be kept after a restart: %s",
          written.message());
    }
  }
  for (auto const& name : to_remove) {
    if (auto removed = store_.remove(name); !removed.ok()) {
      log::warn("the fd store may keep %s: %s (the next start drops it)", name, removed.message());
    }
  }
}

}  // namespace rmmd::restart
