#include "client/rmmctl/stats_table.hpp"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
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
      for (std::size_t i = 0; i < r.size(); ++i) {
        auto pad = std::string(width[i] - r[i].size(), ' ');
        out << (i == 0 ? "" : "  ") << (right_aligned[i] ? pad + r[i] : r[i] + pad);
      }
      out << '\n';
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

std::string format_stats(v1::Stats const& stats)
{
  table pools({"POOL",
               "ID",
               "BACKEND",
               "DEVICE",
               "CAPACITY",
               "IN USE",
               "HIGH WATER",
               "ALLOCS",
               "DRIVER RESERVED",
               "DRIVER USED"});
  for (auto const& p : stats.pools()) {
    pools.add({p.pool().name(),
               std::to_string(p.pool().id()),
               backend_name(p.pool().backend()),
               p.pool().device() < 0 ? "-" : std::to_string(p.pool().device()),
               human_bytes(p.pool().capacity_bytes()),
               human_bytes(p.in_use_bytes()),
               human_bytes(p.high_water_bytes()),
               std::to_string(p.allocation_count()),
               p.has_backend_reserved_bytes() ? human_bytes(p.backend_reserved_bytes()) : "-",
               p.has_backend_used_bytes() ? human_bytes(p.backend_used_bytes()) : "-"});
  }
  table sessions({"SESSION", "PID", "UID", "COMMAND", "CLIENT", "BYTES", "ALLOCS"});
  for (auto const& s : stats.sessions()) {
    sessions.add({std::to_string(s.session_id()),
                  std::to_string(s.pid()),
                  std::to_string(s.uid()),
                  s.command(),
                  s.client_name().empty() ? "-" : s.client_name(),
                  human_bytes(s.bytes()),
                  std::to_string(s.allocation_count())});
  }
  return pools.str({false, true, false, true, true, true, true, true, true, true}) + "\n" +
         sessions.str({true, true, true, false, false, true, true});
}

std::string to_json(google::protobuf::Message const& message)
{
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace                = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names    = true;
  std::string out;
  auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  if (!status.ok()) { return "{}"; }
  return out;
}

}  // namespace rmmd::ctl
