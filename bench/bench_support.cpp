#include "bench/bench_support.hpp"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <utility>
#include <vector>

namespace rmmd::bench {

daemon_process::options bench_daemon(std::filesystem::path const& rmmd,
                                     std::vector<std::string> args,
                                     std::chrono::seconds ready_timeout)
{
  return {.program       = rmmd,
          .args          = std::move(args),
          .dir_prefix    = "rmmd-bench-",
          .log_to_file   = true,
          .kill_last     = true,
          .ready_timeout = ready_timeout,
          .stop_timeout  = 20s};
}

double cpu_seconds(pid_t pid)
{
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) {
    throw bench_error("cannot read /proc/" + std::to_string(pid) + "/stat");
  }
  // The command name (field 2) may hold spaces: fields count from after its ')'.
  auto close = line.rfind(')');
  if (close == std::string::npos) { throw bench_error("unexpected /proc/PID/stat: " + line); }
  std::istringstream fields(line.substr(close + 2));
  std::vector<std::string> f;
  for (std::string s; fields >> s;) { f.push_back(s); }
  // After ')': field 3 (state) is f[0], so utime (14) is f[11], stime (15) f[12].
  if (f.size() < 13) { throw bench_error("unexpected /proc/PID/stat: " + line); }
  auto ticks = std::stoull(f[11]) + std::stoull(f[12]);
  return static_cast<double>(ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

std::uint64_t rss_bytes(pid_t pid)
{
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream v(line.substr(6));
      std::uint64_t kib = 0;
      v >> kib;
      return kib * 1024;
    }
  }
  throw bench_error("no VmRSS in /proc/" + std::to_string(pid) + "/status");
}

summary summarize(std::vector<double> samples_ns)
{
  summary s;
  s.count = samples_ns.size();
  if (samples_ns.empty()) { return s; }
  std::sort(samples_ns.begin(), samples_ns.end());
  auto rank = [&](double q) {
    auto i = static_cast<std::size_t>(std::ceil(q * static_cast<double>(samples_ns.size())));
    return samples_ns[std::clamp<std::size_t>(i, 1, samples_ns.size()) - 1] / 1000.0;
  };
  s.p50_us  = rank(0.50);
  s.p99_us  = rank(0.99);
  s.min_us  = samples_ns.front() / 1000.0;
  s.max_us  = samples_ns.back() / 1000.0;
  s.mean_us = std::accumulate(samples_ns.begin(), samples_ns.end(), 0.0) /
              static_cast<double>(samples_ns.size()) / 1000.0;
  return s;
}

namespace {

/// Clears every optional double of `m` (and of the messages in it) that is
/// NaN or infinite, which protobuf would write as the string "NaN" or
/// "Infinity". The plain doubles (the configuration, the GPU's memory) are
/// never either.
void clear_non_finite(google::protobuf::Message& m)
{
  using field            = google::protobuf::FieldDescriptor;
  auto const* reflection = m.GetReflection();
  std::vector<field const*> fields;
  reflection->ListFields(m, &fields);
  for (auto const* f : fields) {
    if (f->cpp_type() == field::CPPTYPE_MESSAGE) {
      if (f->is_repeated()) {
        for (int i = 0; i < reflection->FieldSize(m, f); ++i) {
          clear_non_finite(*reflection->MutableRepeatedMessage(&m, f, i));
        }
      } else {
        clear_non_finite(*reflection->MutableMessage(&m, f));
      }
    } else if (f->cpp_type() == field::CPPTYPE_DOUBLE && f->has_presence() &&
               !std::isfinite(reflection->GetDouble(m, f))) {
      reflection->ClearField(&m, f);
    }
  }
}

}  // namespace

std::string results_json(results::Run const& run)
{
  results::Run finite = run;
  clear_non_finite(finite);
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace                = true;
  options.always_print_primitive_fields = true;  // `"quick": false`, `"errors": []`
  options.preserve_proto_field_names    = true;  // size_bytes, not sizeBytes
  std::string out;
  if (auto status = google::protobuf::util::MessageToJsonString(finite, &out, options);
      !status.ok()) {
    throw bench_error("writing the results as JSON failed: " + status.ToString());
  }
  return out;
}

void print_targets(std::string const& title,
                   std::vector<target_row> const& targets,
                   results::Run& run)
{
  std::printf("\n%s\n", title.c_str());
  for (auto const& t : targets) {
    std::printf("  %-4s %-60s %12.3f %s  (%s %g %s)\n",
                t.pass() ? "pass" : "MISS",
                t.what.c_str(),
                t.measured,
                t.unit.c_str(),
                t.at_most ? "<=" : ">=",
                t.limit,
                t.unit.c_str());
    std::ostringstream limit;
    limit << (t.at_most ? "<= " : ">= ") << t.limit;
    auto& row = *run.add_targets();
    row.set_what(t.what);
    row.set_measured(t.measured);
    row.set_unit(t.unit);
    row.set_limit(limit.str());
    row.set_pass(t.pass());
  }
}

}  // namespace rmmd::bench
