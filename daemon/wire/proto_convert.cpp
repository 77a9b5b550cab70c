#include "daemon/wire/proto_convert.hpp"

#include <absl/container/flat_hash_set.h>

#include <chrono>

namespace rmmd::wire {
namespace {

/// The wire names the memory space (how a client maps a pool), whatever
/// kind of backend serves it.
v1::Backend to_proto(core::memory_space space)
{
  switch (space) {
    case core::memory_space::host:
      return v1::BACKEND_HOST;
    case core::memory_space::device:
      return v1::BACKEND_CUDA;
  }
  return v1::BACKEND_UNSPECIFIED;
}

v1::HandleType to_proto(core::handle_type type)
{
  switch (type) {
    case core::handle_type::posix_fd:
      return v1::HANDLE_TYPE_POSIX_FD;
    case core::handle_type::fabric:
      return v1::HANDLE_TYPE_FABRIC;
    case core::handle_type::host_offset:
      return v1::HANDLE_TYPE_HOST_OFFSET;
  }
  return v1::HANDLE_TYPE_UNSPECIFIED;
}

}  // namespace

void to_proto(core::pool_description const& in, int fd_index, v1::PoolDescription* out)
{
  out->set_id(in.id);
  out->set_name(in.name);
  out->set_device(in.device);
  out->set_gpu_uuid(in.gpu_uuid);
  out->set_pci_bus_id(in.pci_bus_id);
  out->set_backend(to_proto(in.backend.space));
  for (auto t : in.handle_types) { out->add_handle_types(to_proto(t)); }
  out->set_capacity_bytes(in.capacity_bytes);
  out->set_fd_index(fd_index);
  out->set_max_alignment(in.max_alignment);
  out->set_pinnable(in.pinnable);
  if (!in.fabric_handle.empty()) {
    out->set_fabric_handle(in.fabric_handle.data(), in.fabric_handle.size());
  }
}

void to_proto(core::session_info const& in, v1::SessionInfo* out)
{
  out->set_session_id(in.id);
  out->set_pid(in.peer.pid);
  out->set_uid(in.peer.uid);
  out->set_gid(in.peer.gid);
  out->set_command(in.command);
  out->set_client_name(in.client_name);
  out->set_bytes(in.bytes);
  out->set_allocation_count(in.allocation_count);
  out->set_carved_bytes(in.carved_bytes);
  out->set_carved_allocations(in.carved_allocations);
  out->set_idle_bytes(in.idle_bytes);
  out->set_reclaimable_bytes(in.reclaimable_bytes);
  out->set_shared_bytes(in.shared_bytes);
  out->set_buffers_held(in.buffers_held);
  out->set_reconnects(in.reconnects);
  out->set_previous_session_id(in.previous_session);
  out->set_started_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(in.started.time_since_epoch()).count());
}

void to_proto(core::pool_stats const& p, v1::PoolStats* out)
{
  to_proto(p.pool, -1, out->mutable_pool());
  out->set_in_use_bytes(p.in_use_bytes);
  out->set_high_water_bytes(p.high_water_bytes);
  out->set_allocation_count(p.allocation_count);
  out->set_total_allocations(p.total_allocations);
  if (p.backend_reserved_bytes) { out->set_backend_reserved_bytes(*p.backend_reserved_bytes); }
  if (p.backend_used_bytes) { out->set_backend_used_bytes(*p.backend_used_bytes); }
  if (p.release_threshold_bytes) { out->set_release_threshold_bytes(*p.release_threshold_bytes); }
  out->set_carved_bytes(p.carved_bytes);
  out->set_carved_allocations(p.carved_allocations);
  out->set_shared_buffers(p.shared_buffers);
  out->set_shared_bytes(p.shared_bytes);
  out->set_shared_holders(p.shared_holders);
  out->set_idle_bytes(p.idle_bytes);
  out->set_reclaimable_bytes(p.reclaimable_bytes);
  out->set_reclaim_waits(p.reclaim_waits);
  out->set_reclaim_served(p.reclaim_served);
  out->set_reclaim_refused(p.reclaim_refused);
  for (auto const& t : p.tenants) {
    auto* row = out->add_tenants();
    row->set_tenant(t.tenant);
    row->set_in_use_bytes(t.in_use_bytes);
    row->set_high_water_bytes(t.high_water_bytes);
    if (t.backend_reserved_bytes) { row->set_backend_reserved_bytes(*t.backend_reserved_bytes); }
    if (t.backend_used_bytes) { row->set_backend_used_bytes(*t.backend_used_bytes); }
    row->set_shared_buffers(t.shared_buffers);
  }
}

void to_proto(core::stats_snapshot const& in, v1::Stats* out)
{
  for (auto const& p : in.pools) { to_proto(p, out->add_pools()); }
  for (auto const& s : in.sessions) { to_proto(s, out->add_sessions()); }
  out->set_session_count(in.session_count);
  out->set_unlisted_session_bytes(in.unlisted_bytes);
  out->set_unlisted_session_allocations(in.unlisted_allocations);
  auto* r = out->mutable_restart();
  r->set_restarts(in.restart.restarts);
  r->set_readopted_buffers(in.restart.adopted_buffers);
  r->set_readopted_bytes(in.restart.adopted_bytes);
  r->set_dropped_at_start(in.restart.dropped);
  r->set_keeping_buffers(in.restart.keeping);
  r->set_reconnected_sessions(in.restart.reconnected_sessions);
  for (auto const& g : in.gpu_memory) {
    auto* m = out->add_gpu_memory();
    m->set_gpu_uuid(g.gpu_uuid);
    m->set_device(g.device);
    m->set_driver_used_bytes(g.driver_used_bytes);
    m->set_ledger_bytes(g.ledger_bytes);
    m->set_unaccounted_bytes(g.unaccounted_bytes);
    m->set_spare_bytes(g.spare_bytes);
  }
}

void to_proto(core::session_listing const& in, v1::ListSessionsResponse* out)
{
  for (auto const& s : in.sessions) { to_proto(s, out->add_sessions()); }
  out->set_session_count(in.session_count);
  out->set_unlisted_session_bytes(in.unlisted_bytes);
  out->set_unlisted_session_allocations(in.unlisted_allocations);
}

void to_proto(core::pool_trim const& in, v1::PoolTrim* out)
{
  out->set_pool_id(in.pool);
  out->set_name(in.name);
  out->set_released_bytes(in.released_bytes);
  if (in.backend_reserved_before) {
    out->set_backend_reserved_bytes_before(*in.backend_reserved_before);
  }
  if (in.backend_reserved_after) {
    out->set_backend_reserved_bytes_after(*in.backend_reserved_after);
  }
}

void to_proto(core::lease_grant const& in, v1::AllocateResponse* out)
{
  out->set_allocation_id(in.id);
  out->set_size(in.bytes);
  if (in.block.export_data.empty()) {
    out->mutable_host()->set_offset(in.block.offset);
  } else {
    out->mutable_cuda()->set_export_data(in.block.export_data.data(), in.block.export_data.size());
  }
  if (in.packed_block != 0) {
    out->set_block_id(in.packed_block);
    out->set_block_offset(in.block_offset);
  }
}

v1::BufferState to_proto(core::buffer_state state)
{
  switch (state) {
    case core::buffer_state::writing:
      return v1::BUFFER_STATE_WRITING;
    case core::buffer_state::published:
      return v1::BUFFER_STATE_PUBLISHED;
    case core::buffer_state::deleted:
      return v1::BUFFER_STATE_DELETED;
  }
  return v1::BUFFER_STATE_UNSPECIFIED;
}

void to_proto(core::buffer_grant const& in, v1::BufferGrant* out)
{
  out->set_buffer_id(in.id);
  out->set_pool_id(in.pool);
  out->set_size(in.size);
  out->set_name(in.name);
  out->set_state(to_proto(in.state));
  out->set_persistent(in.persistent);
  out->set_access(in.access == core::buffer_access::read_write ? v1::BUFFER_ACCESS_READ_WRITE
                                                               : v1::BUFFER_ACCESS_READ);
  if (in.manifest && !in.manifest->empty()) { to_proto(*in.manifest, out->mutable_manifest()); }
  out->set_lease_generation(in.lease_generation);
  auto const& memory = in.block;
  if (memory.host_memfd) {
    out->mutable_host_memfd()->set_mapping_bytes(memory.block.bytes);
  } else if (memory.fd >= 0 || !memory.fabric_handle.empty()) {
    auto* vmm = out->mutable_vmm();
    vmm->set_allocation_bytes(memory.block.bytes);
    vmm->set_has_fd(memory.fd >= 0);
    if (!memory.fabric_handle.empty()) {
      vmm->set_fabric_handle(memory.fabric_handle.data(), memory.fabric_handle.size());
    }
  } else if (memory.block.export_data.empty()) {
    out->mutable_host()->set_offset(memory.block.offset);
  } else {
    out->mutable_cuda()->set_export_data(memory.block.export_data.data(),
                                         memory.block.export_data.size());
  }
}

void to_proto(std::map<std::string, std::string> const& in,
              google::protobuf::RepeatedPtrField<v1::Label>* out)
{
  out->Reserve(static_cast<int>(in.size()));
  for (auto const& [key, value] : in) {
    auto* label = out->Add();
    label->set_key(key);
    label->set_value(value);
  }
}

std::map<std::string, std::string> from_proto(
    google::protobuf::RepeatedPtrField<v1::Label> const& in)
{
  std::map<std::string, std::string> out;
  for (auto const& label : in) { out.try_emplace(label.key(), label.value()); }
  return out;
}

std::optional<std::string> repeated_label_key(
    google::protobuf::RepeatedPtrField<v1::Label> const& labels)
{
  absl::flat_hash_set<std::string_view> seen;
  for (auto const& label : labels) {
    if (!seen.insert(label.key()).second) { return label.key(); }
  }
  return std::nullopt;
}

void to_proto(core::buffer_info const& in, v1::BufferInfo* out)
{
  out->set_buffer_id(in.id);
  out->set_name(in.name);
  out->set_pool_id(in.pool);
  out->set_pool_name(in.pool_name);
  out->set_size(in.size);
  out->set_reserved_bytes(in.reserved_bytes);
  out->set_creator_uid(in.creator_uid);
  out->set_creator_pid(in.creator_pid);
  out->set_creator_session_id(in.creator_session);
  if (in.gid) { out->set_gid(*in.gid); }
  out->set_holders(static_cast<std::uint32_t>(in.holders));
  out->set_state(to_proto(in.state));
  out->set_persistent(in.persistent);
  out->set_created_unix_ms(
      std::chrono::duration_cast<std::chrono::milliseconds>(in.created.time_since_epoch()).count());
  out->set_allow_writers(in.allow_writers);
  to_proto(in.labels, out->mutable_labels());
  out->set_tensor_count(static_cast<std::uint32_t>(in.tensor_count));
  if (in.lease) { to_proto(*in.lease, out->mutable_lease()); }
}

void to_proto(core::buffer_lease_info const& in, v1::BufferLease* out)
{
  auto const unix_ms = [](std::chrono::system_clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
  };
  out->set_generation(in.generation);
  out->set_holder_session_id(in.holder);
  if (in.holder != 0) {
    out->set_holder_pid(in.holder_pid);
    out->set_holder_uid(in.holder_uid);
    out->set_granted_unix_ms(unix_ms(in.granted));
  }
  for (auto const& w : in.waiters) {
    auto* waiter = out->add_waiters();
    waiter->set_session_id(w.session);
    waiter->set_pid(w.pid);
    waiter->set_uid(w.uid);
    waiter->set_since_unix_ms(unix_ms(w.since));
  }
  out->set_plain_writers(static_cast<std::uint32_t>(in.plain_writers));
}

core::buffer_options from_proto(v1::CreateBufferRequest const& in)
{
  return core::buffer_options{.alignment  = in.alignment(),
                              .persistent = in.persistent(),
                              .gid = in.has_gid() ? std::optional<gid_t>(in.gid()) : std::nullopt,
                              .allow_writers = in.allow_writers()};
}

void to_proto(core::buffer_manifest const& in, v1::BufferManifest* out)
{
  out->mutable_tensors()->Reserve(static_cast<int>(in.tensors.size()));
  for (auto const& t : in.tensors) {
    auto* e = out->add_tensors();
    e->set_name(t.name);
    e->set_dtype(static_cast<v1::DType>(t.dtype));
    e->mutable_shape()->Add(t.shape.begin(), t.shape.end());
    e->set_byte_offset(t.byte_offset);
    e->mutable_strides()->Add(t.strides.begin(), t.strides.end());
    for (auto const& alias : t.aliases) { e->add_aliases(alias); }
  }
  to_proto(in.labels, out->mutable_labels());
}

core::buffer_manifest from_proto(v1::BufferManifest const& in)
{
  core::buffer_manifest out;
  out.tensors.reserve(static_cast<std::size_t>(in.tensors_size()));
  for (auto const& e : in.tensors()) {
    out.tensors.push_back(core::tensor_entry{.name        = e.name(),
                                             .dtype       = static_cast<std::int32_t>(e.dtype()),
                                             .shape       = {e.shape().begin(), e.shape().end()},
                                             .byte_offset = e.byte_offset(),
                                             .strides = {e.strides().begin(), e.strides().end()},
                                             .aliases = {e.aliases().begin(), e.aliases().end()}});
  }
  out.labels = from_proto(in.labels());
  return out;
}

core::buffer_open_options from_proto(v1::OpenBufferRequest const& in)
{
  return core::buffer_open_options{.access        = in.access() == v1::BUFFER_ACCESS_READ_WRITE
                                                        ? core::buffer_access::read_write
                                                        : core::buffer_access::read,
                                   .expect_labels = from_proto(in.expect_labels()),
                                   .exclusive     = in.exclusive(),
                                   .standby       = in.standby()};
}

core::buffer_filter from_proto(v1::ListBuffersRequest const& in)
{
  return core::buffer_filter{.name_prefix = in.name_prefix(), .labels = from_proto(in.labels())};
}

}  // namespace rmmd::wire
