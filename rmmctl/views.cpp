#include "rmmctl/views.hpp"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace rmmd::ctl {
namespace {

/// Rows of cells printed with each column as wide as its widest cell;
/// numbers right-aligned.
class table {
 public:
  explicit table(std::vector<std::string> header)
  {
    rows_.push_back(std::move(header));
  }
  void add(std::vector<std::string> row)
  {
    rows_.push_back(std::move(row));
  }

  [[nodiscard]] std::string str(std::vector<bool> const& right_aligned) const
  {
    std::vector<std::size_t> width(rows_[0].size(), 0);
    for (auto const& r : rows_) {
      for (std::size_t i = 0; i < r.size(); ++i) { width[i] = std::max(width[i], r[i].size()); }
    }
    std::ostringstream out;
    for (auto const& r : rows_) {
      std::string line;
      for (std::size_t i = 0; i < r.size(); ++i) {
        auto pad = std::string(width[i] - r[i].size(), ' ');
        line += (i == 0 ? "" : "  ") + (right_aligned[i] ? pad + r[i] : r[i] + pad);
      }
      line.erase(line.find_last_not_of(' ') + 1);
      out << line << '\n';
    }
    return out.str();
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string backend_name(v1::Backend b)
{
  switch (b) {
    case v1::BACKEND_HOST:
      return "host";
    case v1::BACKEND_CUDA:
      return "cuda";
    default:
      return "?";
  }
}

std::string handle_name(int h)
{
  switch (h) {
    case v1::HANDLE_TYPE_POSIX_FD:
      return "posix-fd";
    case v1::HANDLE_TYPE_FABRIC:
      return "fabric";
    case v1::HANDLE_TYPE_HOST_OFFSET:
      return "host-offset";
    default:
      return "?";
  }
}

/// Labels sorted by key (the daemon keeps them so; sorted here all the same).
std::vector<std::pair<std::string, std::string>> sorted_labels(
    google::protobuf::RepeatedPtrField<v1::Label> const& labels)
{
  std::vector<std::pair<std::string, std::string>> sorted;
  sorted.reserve(static_cast<std::size_t>(labels.size()));
  for (auto const& label : labels) { sorted.emplace_back(label.key(), label.value()); }
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

/// A manifest's labels as one cell: "k=v,k=v", cut to `most` bytes.
std::string labels_cell(google::protobuf::RepeatedPtrField<v1::Label> const& labels,
                        std::size_t most)
{
  auto const sorted = sorted_labels(labels);
  std::string out;
  for (auto const& [k, v] : sorted) { out += (out.empty() ? "" : ",") + k + "=" + v; }
  if (out.empty()) { return "-"; }
  if (out.size() > most) { out = out.substr(0, most - 3) + "..."; }
  return out;
}

/// Bytes per element of a protocol dtype (the table of rmmd.proto's DType).
std::uint64_t itemsize_of(v1::DType dtype)
{
  switch (dtype) {
    case v1::DTYPE_BOOL:
    case v1::DTYPE_UINT8:
    case v1::DTYPE_INT8:
    case v1::DTYPE_FLOAT8_E4M3FN:
    case v1::DTYPE_FLOAT8_E5M2:
      return 1;
    case v1::DTYPE_UINT16:
    case v1::DTYPE_INT16:
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_UINT32:
    case v1::DTYPE_INT32:
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_UINT64:
    case v1::DTYPE_INT64:
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_COMPLEX64:
      return 8;
    case v1::DTYPE_COMPLEX128:
      return 16;
    default:
      return 0;
  }
}

/// "float16": the dtype's protocol name in lower case, without its prefix.
std::string dtype_cell(v1::DType dtype)
{
  auto name = v1::DType_Name(dtype);
  if (name.empty()) { return std::to_string(static_cast<int>(dtype)); }
  if (name.starts_with("DTYPE_")) { name = name.substr(6); }
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  return name;
}

/// "[3, 4]".
std::string dims_cell(google::protobuf::RepeatedField<std::uint64_t> const& dims)
{
  std::string out = "[";
  for (int i = 0; i < dims.size(); ++i) { out += (i ? ", " : "") + std::to_string(dims[i]); }
  return out + "]";
}

/// The bytes a tensor spans (daemon checked: no overflow).
std::uint64_t tensor_bytes(v1::TensorEntry const& t)
{
  std::uint64_t last     = 0;
  std::uint64_t elements = 1;
  for (int i = 0; i < t.shape_size(); ++i) {
    if (t.shape(i) == 0) { return 0; }
    elements *= t.shape(i);
    if (t.strides_size() == t.shape_size()) { last += (t.shape(i) - 1) * t.strides(i); }
  }
  if (t.strides_size() != t.shape_size()) { last = elements - 1; }
  return (last + 1) * itemsize_of(t.dtype());
}

std::string state_name(v1::BufferState state)
{
  switch (state) {
    case v1::BUFFER_STATE_WRITING:
      return "writing";
    case v1::BUFFER_STATE_PUBLISHED:
      return "published";
    case v1::BUFFER_STATE_DELETED:
      return "deleted";
    default:
      return "?";
  }
}

/// The pool's GPU as every process names it (its UUID), with the daemon's
/// ordinal for it; "-" for host pools.
std::string gpu_text(v1::PoolDescription const& pool)
{
  if (pool.device() < 0) { return "-"; }
  if (pool.gpu_uuid().empty()) { return std::to_string(pool.device()); }  // an older daemon
  return pool.gpu_uuid() + " (" + std::to_string(pool.device()) + ")";
}

}  // namespace

std::string human_bytes(std::uint64_t bytes)
{
  static constexpr char const* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) { return std::to_string(bytes) + " B"; }
  double v = static_cast<double>(bytes);
  int u    = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

std::string human_duration(std::chrono::seconds duration)
{
  auto s       = std::max<long long>(duration.count(), 0);
  auto const d = s / 86400;
  auto const h = s % 86400 / 3600;
  auto const m = s % 3600 / 60;
  s %= 60;
  char buf[48];
  if (d > 0) {
    std::snprintf(buf, sizeof(buf), "%lldd %02lldh", d, h);
  } else if (h > 0) {
    std::snprintf(buf, sizeof(buf), "%lldh %02lldm", h, m);
  } else if (m > 0) {
    std::snprintf(buf, sizeof(buf), "%lldm %02llds", m, s);
  } else {
    std::snprintf(buf, sizeof(buf), "%llds", s);
  }
  return buf;
}

/// What fast-path sessions carved out of their slabs (a part of IN USE, which
/// counts slabs whole): "-" when nothing is carved.
std::string carved_text(std::uint64_t bytes, std::uint64_t allocations)
{
  if (bytes == 0 && allocations == 0) { return "-"; }
  return human_bytes(bytes) + " in " + std::to_string(allocations);
}

/// Slab bytes not carved (part of IN USE), and of those the slabs with
/// nothing carved that the daemon may ask back: "-" when none.
std::string idle_text(std::uint64_t idle, std::uint64_t reclaimable)
{
  if (idle == 0) { return "-"; }
  return human_bytes(idle) + " (" + human_bytes(reclaimable) + " free)";
}

/// A pool's named shared buffers (part of IN USE): "-" when it has none.
std::string shared_text(std::uint64_t bytes, std::uint64_t buffers)
{
  if (buffers == 0) { return "-"; }
  return human_bytes(bytes) + " in " + std::to_string(buffers);
}

/// The line under a table of sessions that leaves some out: how many more
/// there are and what they hold. Empty when none is left out.
template <typename Reply>
std::string unlisted_sessions_line(Reply const& reply)
{
  auto const listed = static_cast<std::uint64_t>(reply.sessions_size());
  if (reply.session_count() <= listed) { return ""; }
  auto const more = reply.session_count() - listed;
  return "... and " + std::to_string(more) + (more == 1 ? " more session" : " more sessions") +
         " holding " + human_bytes(reply.unlisted_session_bytes()) + " in " +
         std::to_string(reply.unlisted_session_allocations()) +
         " allocations (--top N lists more, --all every one)\n";
}

/// What the daemon took back at its start, and each GPU's memory beyond
/// the ledger: nothing where buffers are not kept and there is no GPU.
std::string restart_lines(v1::Stats const& stats)
{
  std::string out;
  auto const& r = stats.restart();
  if (r.keeping_buffers() || r.restarts() > 0 || r.reconnected_sessions() > 0) {
    out += "restarts: " + std::to_string(r.restarts()) +
           "; buffers served again after the last: " + std::to_string(r.readopted_buffers()) +
           " (" + human_bytes(r.readopted_bytes()) + ")" +
           "; sessions reconnected since: " + std::to_string(r.reconnected_sessions());
    if (r.dropped_at_start() > 0) {
      out +=
          "; not served: " + std::to_string(r.dropped_at_start()) + " (the daemon's log says why)";
    }
    out += r.keeping_buffers() ? "\n"
                               : "; buffers are not kept across a restart (no service manager)\n";
  }
  if (stats.gpu_memory_size() > 0) {
    table gpus({"GPU", "DEVICE", "DRIVER USED", "RMMD LEDGER", "UNACCOUNTED", "SPARE"});
    for (auto const& g : stats.gpu_memory()) {
      gpus.add({g.gpu_uuid(),
                std::to_string(g.device()),
                human_bytes(g.driver_used_bytes()),
                human_bytes(g.ledger_bytes()),
                human_bytes(g.unaccounted_bytes()),
                human_bytes(g.spare_bytes())});
    }
    out += "\n" + gpus.str({false, true, true, true, true, true}) +
           "(unaccounted: held from before a restart, CUDA contexts, other processes; spare: "
           "given back by a sleep or free, kept for its uid's next address-stable allocation)\n";
  }
  return out;
}

std::string format_stats(v1::Stats const& stats)
{
  table pools({"POOL",
               "ID",
               "BACKEND",
               "GPU (DAEMON'S ORDINAL)",
               "CAPACITY",
               "IN USE",
               "CARVED",
               "IDLE",
               "SHARED",
               "HIGH WATER",
               "ALLOCS",
               "DRIVER RESERVED",
               "DRIVER USED"});
  for (auto const& p : stats.pools()) {
    pools.add({p.pool().name(),
               std::to_string(p.pool().id()),
               backend_name(p.pool().backend()),
               gpu_text(p.pool()),
               human_bytes(p.pool().capacity_bytes()),
               human_bytes(p.in_use_bytes()),
               carved_text(p.carved_bytes(), p.carved_allocations()),
               idle_text(p.idle_bytes(), p.reclaimable_bytes()),
               shared_text(p.shared_bytes(), p.shared_buffers()),
               human_bytes(p.high_water_bytes()),
               std::to_string(p.allocation_count()),
               p.has_backend_reserved_bytes() ? human_bytes(p.backend_reserved_bytes()) : "-",
               p.has_backend_used_bytes() ? human_bytes(p.backend_used_bytes()) : "-"});
  }
  table sessions({"SESSION",
                  "PID",
                  "UID",
                  "COMMAND",
                  "CLIENT",
                  "BYTES",
                  "CARVED",
                  "IDLE",
                  "SHARED",
                  "BUFFERS",
                  "ALLOCS"});
  for (auto const& s : stats.sessions()) {
    sessions.add({std::to_string(s.session_id()),
                  std::to_string(s.pid()),
                  std::to_string(s.uid()),
                  s.command(),
                  s.client_name().empty() ? "-" : s.client_name(),
                  human_bytes(s.bytes()),
                  carved_text(s.carved_bytes(), s.carved_allocations()),
                  idle_text(s.idle_bytes(), s.reclaimable_bytes()),
                  human_bytes(s.shared_bytes()),
                  std::to_string(s.buffers_held()),
                  std::to_string(s.allocation_count())});
  }
  table tenants({"POOL", "TENANT", "IN USE", "HIGH WATER", "DRIVER RESERVED", "BUFFERS"});
  for (auto const& p : stats.pools()) {
    for (auto const& t : p.tenants()) {
      tenants.add({p.pool().name(),
                   t.tenant(),
                   human_bytes(t.in_use_bytes()),
                   human_bytes(t.high_water_bytes()),
                   t.has_backend_reserved_bytes() ? human_bytes(t.backend_reserved_bytes()) : "-",
                   std::to_string(t.shared_buffers())});
    }
  }
  return pools.str(
             {false, true, false, false, true, true, true, true, true, true, true, true, true}) +
         "\n" + tenants.str({false, false, true, true, true, true}) + "\n" +
         sessions.str({true, true, true, false, false, true, true, true, true, true, true}) +
         (stats.sessions().empty() && stats.session_count() == 0 ? "(no sessions)\n" : "") +
         unlisted_sessions_line(stats) + restart_lines(stats);
}

std::string format_pools(v1::ListPoolsResponse const& response)
{
  table pools({"POOL",
               "ID",
               "BACKEND",
               "GPU (DAEMON'S ORDINAL)",
               "PCI BUS ID",
               "HANDLES",
               "CAPACITY",
               "IN USE",
               "SHARED",
               "HIGH WATER",
               "ALLOCS",
               "TOTAL ALLOCS",
               "RELEASE THRESHOLD",
               "DRIVER RESERVED",
               "DRIVER USED"});
  for (auto const& p : response.pools()) {
    std::string handles;
    for (auto h : p.pool().handle_types()) {
      handles += (handles.empty() ? "" : ",") + handle_name(h);
    }
    pools.add({p.pool().name(),
               std::to_string(p.pool().id()),
               backend_name(p.pool().backend()),
               gpu_text(p.pool()),
               p.pool().pci_bus_id().empty() ? "-" : p.pool().pci_bus_id(),
               handles.empty() ? "-" : handles,
               human_bytes(p.pool().capacity_bytes()),
               human_bytes(p.in_use_bytes()),
               shared_text(p.shared_bytes(), p.shared_buffers()),
               human_bytes(p.high_water_bytes()),
               std::to_string(p.allocation_count()),
               std::to_string(p.total_allocations()),
               p.has_release_threshold_bytes() ? human_bytes(p.release_threshold_bytes()) : "-",
               p.has_backend_reserved_bytes() ? human_bytes(p.backend_reserved_bytes()) : "-",
               p.has_backend_used_bytes() ? human_bytes(p.backend_used_bytes()) : "-"});
  }
  // Figures right-aligned; POOL, BACKEND, GPU, PCI BUS ID and HANDLES are text.
  std::vector<bool> right_aligned(15, true);
  for (auto text : {0, 2, 3, 4, 5}) { right_aligned[text] = false; }
  return pools.str(right_aligned);
}

std::string format_sessions(v1::ListSessionsResponse const& response, std::int64_t now_unix_ms)
{
  table sessions({"SESSION",
                  "PID",
                  "UID",
                  "GID",
                  "COMMAND",
                  "CLIENT",
                  "BYTES",
                  "IDLE",
                  "SHARED",
                  "BUFFERS",
                  "ALLOCS",
                  "AGE"});
  for (auto const& s : response.sessions()) {
    sessions.add(
        {std::to_string(s.session_id()),
         std::to_string(s.pid()),
         std::to_string(s.uid()),
         std::to_string(s.gid()),
         s.command(),
         s.client_name().empty() ? "-" : s.client_name(),
         human_bytes(s.bytes()),
         idle_text(s.idle_bytes(), s.reclaimable_bytes()),
         human_bytes(s.shared_bytes()),
         std::to_string(s.buffers_held()),
         std::to_string(s.allocation_count()),
         human_duration(std::chrono::seconds((now_unix_ms - s.started_unix_ms()) / 1000))});
  }
  auto out =
      sessions.str({true, true, true, true, false, false, true, true, true, true, true, true});
  if (response.sessions().empty() && response.session_count() == 0) { out += "(no sessions)\n"; }
  return out + unlisted_sessions_line(response);
}

std::string format_trim(v1::TrimResponse const& response)
{
  table pools({"POOL", "ID", "RELEASED", "DRIVER RESERVED BEFORE", "DRIVER RESERVED AFTER"});
  for (auto const& p : response.pools()) {
    pools.add({p.name(),
               std::to_string(p.pool_id()),
               human_bytes(p.released_bytes()),
               p.has_backend_reserved_bytes_before()
                   ? human_bytes(p.backend_reserved_bytes_before())
                   : "-",
               p.has_backend_reserved_bytes_after() ? human_bytes(p.backend_reserved_bytes_after())
                                                    : "-"});
  }
  return pools.str({false, true, true, true, true});
}

void sort_buffers(v1::ListBuffersResponse* response)
{
  auto* buffers = response->mutable_buffers();
  std::sort(buffers->begin(), buffers->end(), [](v1::BufferInfo const& a, v1::BufferInfo const& b) {
    if (a.name() != b.name()) { return a.name() < b.name(); }
    return a.buffer_id() < b.buffer_id();
  });
}

/// A buffer's write lease in one cell: "gen 2 pid 1234" (its holder),
/// "gen 2 free", or "-" while nobody ever asked for it.
std::string lease_cell(v1::BufferInfo const& b)
{
  if (!b.has_lease()) { return "-"; }
  auto const& l = b.lease();
  auto out      = "gen " + std::to_string(l.generation());
  if (l.holder_session_id() != 0) { return out + " pid " + std::to_string(l.holder_pid()); }
  return out + " free";
}

/// A buffer's write lease in words (rmmctl buffers show).
std::string lease_words(v1::BufferInfo const& b, std::int64_t now_unix_ms)
{
  if (!b.has_lease()) { return "- (no exclusive open asked for it)"; }
  auto const& l = b.lease();
  std::string out =
      l.generation() == 0 ? "never granted" : "generation " + std::to_string(l.generation());
  if (l.holder_session_id() != 0) {
    out += ", held by session " + std::to_string(l.holder_session_id()) + " (pid " +
           std::to_string(l.holder_pid()) + ", uid " + std::to_string(l.holder_uid()) + ") for " +
           human_duration(std::chrono::seconds((now_unix_ms - l.granted_unix_ms()) / 1000));
  } else {
    out += ", free";
  }
  if (l.plain_writers() > 0) {
    out += "; " + std::to_string(l.plain_writers()) +
           " other session(s) hold it open read-write without the lease (a grant waits for them)";
  }
  return out;
}

std::string format_buffers(v1::ListBuffersResponse const& response, std::int64_t now_unix_ms)
{
  table buffers({"NAME",
                 "ID",
                 "POOL",
                 "BYTES",
                 "RESERVED",
                 "CREATOR UID",
                 "CREATOR PID",
                 "GID",
                 "HOLDERS",
                 "STATE",
                 "PERSISTENT",
                 "LEASE",
                 "WAITERS",
                 "AGE",
                 "TENSORS",
                 "LABELS"});
  for (auto const& b : response.buffers()) {
    buffers.add({b.name(),
                 std::to_string(b.buffer_id()),
                 b.pool_name().empty() ? std::to_string(b.pool_id()) : b.pool_name(),
                 human_bytes(b.size()),
                 human_bytes(b.reserved_bytes()),
                 std::to_string(b.creator_uid()),
                 std::to_string(b.creator_pid()),
                 b.has_gid() ? std::to_string(b.gid()) : "-",
                 std::to_string(b.holders()),
                 state_name(b.state()),
                 b.persistent() ? "yes" : "no",
                 lease_cell(b),
                 b.has_lease() ? std::to_string(b.lease().waiters_size()) : "-",
                 human_duration(std::chrono::seconds((now_unix_ms - b.created_unix_ms()) / 1000)),
                 std::to_string(b.tensor_count()),
                 labels_cell(b.labels(), 60)});
  }
  auto out = buffers.str({false,
                          true,
                          false,
                          true,
                          true,
                          true,
                          true,
                          true,
                          true,
                          false,
                          false,
                          false,
                          true,
                          true,
                          true,
                          false});
  if (response.buffers().empty()) { out += "(no buffers)\n"; }
  return out;
}

std::string format_peer_buffers(v1::ListBuffersResponse const& response,
                                std::string const& peer,
                                std::int64_t now_unix_ms)
{
  table buffers({"NAME", "BYTES", "HOLDERS", "WRITERS", "PERSISTENT", "AGE", "TENSORS", "LABELS"});
  for (auto const& b : response.buffers()) {
    buffers.add({peer + ":" + b.name(),
                 human_bytes(b.size()),
                 std::to_string(b.holders()),
                 b.allow_writers() ? "allowed" : "no",
                 b.persistent() ? "yes" : "no",
                 human_duration(std::chrono::seconds((now_unix_ms - b.created_unix_ms()) / 1000)),
                 std::to_string(b.tensor_count()),
                 labels_cell(b.labels(), 60)});
  }
  auto out = buffers.str({false, true, true, false, false, true, true, false});
  if (response.buffers().empty()) {
    out += "(no buffers of node '" + peer +
           "' that its grant lets this node open: only published buffers of a fabric pool "
           "are listed)\n";
  }
  if (response.truncated()) {
    out += "(more matched than node '" + peer +
           "' answers with at once: narrow with --prefix or --label)\n";
  }
  return out;
}

std::string format_buffer(v1::DescribeBufferResponse const& response, std::int64_t now_unix_ms)
{
  auto const& b = response.info();
  table info({"NAME", b.name()});
  info.add({"ID", std::to_string(b.buffer_id())});
  info.add({"POOL", b.pool_name().empty() ? std::to_string(b.pool_id()) : b.pool_name()});
  info.add({"BYTES", human_bytes(b.size()) + " (" + std::to_string(b.size()) + ")"});
  info.add({"RESERVED", human_bytes(b.reserved_bytes())});
  info.add({"CREATOR",
            "uid " + std::to_string(b.creator_uid()) + " pid " + std::to_string(b.creator_pid())});
  info.add({"GID", b.has_gid() ? std::to_string(b.gid()) : "-"});
  info.add({"HOLDERS", std::to_string(b.holders())});
  info.add({"STATE", state_name(b.state())});
  info.add({"PERSISTENT", b.persistent() ? "yes" : "no"});
  info.add({"WRITERS", b.allow_writers() ? "allowed" : "no (consumers open it read-only)"});
  info.add(
      {"AGE", human_duration(std::chrono::seconds((now_unix_ms - b.created_unix_ms()) / 1000))});
  info.add({"LEASE", lease_words(b, now_unix_ms)});
  auto out = info.str({false, false});

  if (b.has_lease() && b.lease().waiters_size() > 0) {
    out += "\nLEASE WAITERS (" + std::to_string(b.lease().waiters_size()) + ", in line)\n";
    table waiters({"SESSION", "PID", "UID", "WAITING"});
    for (auto const& w : b.lease().waiters()) {
      waiters.add({std::to_string(w.session_id()),
                   std::to_string(w.pid()),
                   std::to_string(w.uid()),
                   human_duration(std::chrono::seconds((now_unix_ms - w.since_unix_ms()) / 1000))});
    }
    out += waiters.str({true, true, true, true});
  }

  auto const& manifest = response.manifest();
  auto const labels    = sorted_labels(manifest.labels());
  out += "\nLABELS\n";
  if (labels.empty()) { out += "(no labels)\n"; }
  if (!labels.empty()) {
    table rows({"KEY", "VALUE"});
    for (auto const& [k, v] : labels) { rows.add({k, v}); }
    out += rows.str({false, false});
  }

  out += "\nTENSORS (" + std::to_string(manifest.tensors_size()) + ")\n";
  if (manifest.tensors().empty()) { return out + "(no tensors)\n"; }
  table tensors({"NAME", "DTYPE", "SHAPE", "OFFSET", "BYTES", "STRIDES", "ALIASES"});
  for (auto const& t : manifest.tensors()) {
    std::string aliases;
    for (auto const& a : t.aliases()) { aliases += (aliases.empty() ? "" : ",") + a; }
    tensors.add({t.name(),
                 dtype_cell(t.dtype()),
                 dims_cell(t.shape()),
                 std::to_string(t.byte_offset()),
                 std::to_string(tensor_bytes(t)),
                 t.strides().empty() ? "-" : dims_cell(t.strides()),
                 aliases.empty() ? "-" : aliases});
  }
  return out + tensors.str({false, false, false, true, true, false, false});
}

std::string format_delete(std::string const& name, v1::DeleteBufferResponse const& response)
{
  auto out           = "deleted '" + name + "' (the name is free again); ";
  auto const holders = response.holders();
  if (holders == 0) {
    out += "no session held it, so its memory is back in its pool";
  } else {
    out += "its memory goes back when its " + std::to_string(holders) +
           (holders == 1 ? " holder closes it" : " holders close it");
  }
  return out + "\n";
}

std::string format_peers(v1::ListPeersResponse const& response, std::int64_t now_unix_ms)
{
  std::string out = "node " + (response.node_name().empty() ? "-" : response.node_name()) + "\n";
  table peers({"NODE",
               "DIRECTION",
               "ADDRESS",
               "IDENTITY",
               "STATE",
               "PROBE WE/THEY",
               "HOLDS WE HAVE",
               "BYTES WE HOLD",
               "HOLDS THEY HAVE",
               "BYTES THEY HOLD",
               "LAST CONTACT",
               "PROBLEM"});
  auto ok = [](bool b) { return b ? "ok" : "no"; };
  for (auto const& p : response.peers()) {
    auto const contact =
        p.last_contact_unix_ms() <= 0
            ? std::string("never")
            : human_duration(std::chrono::seconds(
                  std::max<std::int64_t>(0, now_unix_ms - p.last_contact_unix_ms()) / 1000)) +
                  " ago";
    peers.add({p.node_name(),
               p.direction(),
               p.address().empty() ? "-" : p.address(),
               p.identity().empty() ? "-" : p.identity(),
               p.state(),
               std::string(ok(p.probe_ok())) + "/" + ok(p.their_probe_ok()),
               std::to_string(p.holds_we_have()),
               human_bytes(p.bytes_we_hold()),
               std::to_string(p.holds_they_have()),
               human_bytes(p.bytes_they_hold()),
               contact,
               p.problem().empty() ? "-" : p.problem()});
  }
  out += peers.str({false, false, false, false, false, false, true, true, true, true, true, false});
  if (response.peers().empty()) {
    out +=
        "(no peers: peering is off on this node (no peering.peers in rmmd.conf), or no peer "
        "has dialed it yet; docs/operations.md, \"Across nodes\")\n";
  }
  return out;
}

std::string format_health(v1::HealthResponse const& h)
{
  std::string status;
  switch (h.status()) {
    case v1::SERVING_STATUS_SERVING:
      status = "serving";
      break;
    case v1::SERVING_STATUS_DRAINING:
      status = "draining (shutting down: no new sessions or allocations)";
      break;
    default:
      status = "unknown";
  }
  table t({"STATUS", status});
  t.add({"VERSION", h.version()});
  t.add({"UPTIME", human_duration(std::chrono::seconds(h.uptime_seconds()))});
  t.add({"PID", std::to_string(h.pid())});
  t.add({"POOLS", std::to_string(h.pool_count())});
  t.add({"SESSIONS", std::to_string(h.session_count())});
  t.add({"METRICS",
         h.metrics_address().empty() ? "off" : "http://" + h.metrics_address() + "/metrics"});
  return t.str({false, false});
}

void from_json(std::string const& json, google::protobuf::Message* out)
{
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto status                   = google::protobuf::util::JsonStringToMessage(json, out, options);
  if (!status.ok()) {
    throw std::runtime_error("the daemon's " + out->GetTypeName() +
                             " does not parse: " + std::string(status.message()));
  }
}

std::string to_json(google::protobuf::Message const& message, bool one_line)
{
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace                = !one_line;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names    = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) { return "{}\n"; }
  if (out.empty() || out.back() != '\n') { out += '\n'; }
  return out;
}

std::string format_sleepers(v1::ListSleepersResponse const& response, std::int64_t now_unix_ms)
{
  table rows({"SESSION",
              "UID",
              "PID",
              "COMMAND",
              "BACKUP NAME",
              "TAGS",
              "ALLOCATIONS",
              "GIVEN BACK",
              "HOST BACKUP",
              "AWAKE",
              "ASLEEP FOR"});
  for (auto const& s : response.sleepers()) {
    std::string tags;
    for (auto const& t : s.tags()) { tags += (tags.empty() ? "" : ",") + t; }
    rows.add({s.session_id() == 0 ? std::string("(ended)") : std::to_string(s.session_id()),
              std::to_string(s.uid()),
              std::to_string(s.pid()),
              s.command().empty() ? "-" : s.command(),
              s.backup_name().empty() ? "-" : s.backup_name(),
              tags,
              std::to_string(s.sleeping_allocations()),
              human_bytes(s.sleeping_bytes()),
              human_bytes(s.backup_bytes()),
              human_bytes(s.awake_bytes()),
              human_duration(std::chrono::seconds(
                  std::max<std::int64_t>(0, now_unix_ms - s.asleep_since_unix_ms()) / 1000))});
  }
  auto out = rows.str({true, true, true, false, false, false, true, true, true, true, true});
  if (response.sleepers().empty()) { out += "(nobody sleeps)\n"; }
  out += "wake waits " + std::to_string(response.wake_waits()) + ", wake failures " +
         std::to_string(response.wake_failures()) + "\n";
  return out;
}

}  // namespace rmmd::ctl
