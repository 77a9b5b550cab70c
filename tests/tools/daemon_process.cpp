#include "tests/tools/daemon_process.hpp"

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"

#include <gtest/gtest.h>

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <stdexcept>
#include <string_view>
#include <utility>

namespace rmmd::test {
namespace {

std::string& default_backend()
{
  static std::string backend;
  return backend;
}

}  // namespace

void set_default_backend(std::string backend)
{
  default_backend() = std::move(backend);
}

std::vector<std::string> with_default_backend(std::vector<std::string> args)
{
  auto const names = [&](std::string_view flag) {
    return std::any_of(args.begin(), args.end(), [&](std::string const& a) {
      return a == flag || a.starts_with(std::string(flag) + "=");
    });
  };
  if (default_backend().empty() || names("--backend") || names("--config")) { return args; }
  args.insert(args.begin(), {"--backend", default_backend()});
  return args;
}

daemon_process::daemon_process(std::vector<std::string> extra_args, std::string user)
    : harness::daemon_process({.program    = program_path("rmmd"),
                               .args       = with_default_backend(std::move(extra_args)),
                               .dir_prefix = "rmmd-test-",
                               .user       = std::move(user)})
{
}

daemon_process::~daemon_process()
{
  observer_.reset();  // then the base class stops the daemon
}

rmmd::session daemon_process::open_session(std::string client_name,
                                           rmmd::call_transport lease_calls) const
{
  return rmmd::session(rmmd::session::options{.runtime_dir = runtime_dir(),
                                              .client_name = std::move(client_name),
                                              .lease_calls = lease_calls});
}

std::optional<int> daemon_process::stop()
{
  observer_.reset();
  return harness::daemon_process::stop(30s);
}

v1::Stats daemon_process::rmmctl_stats() const
{
  auto r = run({program_path("rmmctl").string(),
                "--runtime-dir",
                runtime_dir().string(),
                "stats",
                "--json"});
  EXPECT_EQ(r.status, 0) << r.out;
  v1::Stats stats;
  auto status = google::protobuf::util::JsonStringToMessage(r.out, &stats);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << r.out;
  return stats;
}

v1::Stats daemon_process::stats() const
{
  if (!observer_) { observer_ = std::make_unique<rmmd::session>(open_session("observer")); }
  auto& impl = rmmd::detail::impl_of(*observer_);
  v1::Stats stats;
  auto ctx    = impl.context();
  auto status = impl.stub().GetStats(ctx.get(), v1::GetStatsRequest{}, &stats);
  if (!status.ok()) { throw std::runtime_error("GetStats: " + status.error_message()); }
  return stats;
}

std::string daemon_process::ledger() const
{
  auto s = stats();
  for (auto& session : *s.mutable_sessions()) { session.clear_started_unix_ms(); }
  for (auto& gpu : *s.mutable_gpu_memory()) {
    gpu.clear_driver_used_bytes();
    gpu.clear_unaccounted_bytes();
  }
  return s.SerializeAsString();
}

std::uint64_t in_use(v1::Stats const& stats, std::uint32_t pool_id)
{
  for (auto const& p : stats.pools()) {
    if (p.pool().id() == pool_id) { return p.in_use_bytes(); }
  }
  return 0;
}

}  // namespace rmmd::test
