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

void fd_store_keeper::keep(core::kept_buffer const& buffer) noexcept
{
  int const copy = ::fcntl(buffer.fd, F_DUPFD_CLOEXEC, 3);
  if (copy < 0) {
    log::error("buffer '%s' will not outlive this daemon: cannot duplicate its fd (%s)",
               buffer.info.name,
               std::strerror(errno));
    return;
  }
  try {
    std::lock_guard lock(mutex_);
    queue_.emplace_back(keep_event{.buffer = buffer, .fd = owned_fd(copy)});
    ++queued_;
  } catch (...) {
    ::close(copy);  // out of memory: the buffer is served, not kept
    return;
  }
  wake_.notify_one();
}

void fd_store_keeper::forget(core::buffer_id id) noexcept
{
  try {
    std::lock_guard lock(mutex_);
    queue_.emplace_back(forget_event{.id = id});
    ++queued_;
  } catch (...) {
    return;  // the next start finds its fd without a use: it drops it then
  }
  wake_.notify_one();
}

bool fd_store_keeper::wait_until_kept(std::chrono::steady_clock::time_point deadline) noexcept
{
  std::unique_lock lock(mutex_);
  auto const target = queued_;
  if (applied_changed_.wait_until(lock, deadline, [&] { return applied_ >= target; })) {
    return true;
  }
  log::warn(
      "a published buffer is served but not yet kept across a restart: the fd store and the "
      "state file (%s) are slow to take it",
      options_.state_file.string());
  return false;
}

void fd_store_keeper::adopted(core::buffer_id id, v1::StoredBuffer record)
{
  std::lock_guard lock(records_mutex_);
  next_fd_id_ = std::max(next_fd_id_, record.fd_id() + 1);
  records_.emplace(id, std::move(record));
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

void fd_store_keeper::apply(std::deque<event> batch)
{
  std::lock_guard lock(records_mutex_);
  std::vector<std::string> to_remove;
  bool changed = false;
  for (auto& e : batch) {
    if (auto* k = std::get_if<keep_event>(&e)) {
      auto record      = stored_record(k->buffer);
      auto const fd_id = next_fd_id_++;
      auto const name  = buffer_fd_name(fd_id, k->buffer.info.name);
      record.set_fd_id(fd_id);
      record.set_fd_name(name);
      if (auto stored = store_.store(name, k->fd.get()); !stored.ok()) {
        log::error(
            "buffer '%s' will not outlive this daemon: %s", k->buffer.info.name, stored.message());
        continue;
      }
      records_[k->buffer.info.id] = std::move(record);
      changed                     = true;
    } else {
      auto const id = std::get<forget_event>(e).id;
      if (auto r = records_.find(id); r != records_.end()) {
        to_remove.push_back(r->second.fd_name());
        records_.erase(r);
        changed = true;
      }
    }
  }
  if (changed) {
    if (auto written = write_locked_records(); !written.ok()) {
      log::error(
          "the state file was not written, so the buffers published since it last was "
          "will not be served after a restart: %s",
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
