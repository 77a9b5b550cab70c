// GPUs by identity: CUDA_VISIBLE_DEVICES renumbers devices per process, so a
// client must find its device's pool by the GPU's UUID, never by the daemon's
// ordinal; and direct-mode frees must stay stream-ordered without CUDA's
// interprocess events (which leave files in /dev/shm and which a daemon of
// another uid cannot open). Real daemon, real client processes.

#include "common/gpu_identity.hpp"
#include "tests/gpu/gpu_count.hpp"
#include "tests/tools/daemon_process.hpp"
#include "tests/tools/test_users.hpp"

#include <rmmd/ipc_memory_resource.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::HasSubstr;

/// Sets an environment variable for the processes started in its scope (a
/// started process inherits this one's environment); puts it back after.
class scoped_env {
 public:
  scoped_env(char const* name, std::optional<std::string> value) : name_(name)
  {
    if (char const* old = std::getenv(name)) { old_ = old; }
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  scoped_env(scoped_env const&)            = delete;
  scoped_env& operator=(scoped_env const&) = delete;
  ~scoped_env()
  {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  char const* name_;
  std::optional<std::string> old_;
};

/// This (test) process's GPUs by ordinal: it sees them all.
std::vector<std::string> physical_uuids()
{
  std::vector<std::string> out;
  for (int d = 0; d < gpu_count(); ++d) { out.push_back(gpu::identify(d).value().uuid); }
  return out;
}

/// Pool name -> GPU UUID, as the daemon reports its pools.
std::map<std::string, std::string> pool_gpus(v1::Stats const& stats)
{
  std::map<std::string, std::string> out;
  for (auto const& p : stats.pools()) {
    if (p.pool().backend() == v1::BACKEND_CUDA) { out[p.pool().name()] = p.pool().gpu_uuid(); }
  }
  return out;
}

struct identity_report {
  struct device_line {
    int device{};
    std::string uuid, pool, pool_uuid, lives_on, verdict;
  };
  std::vector<device_line> devices;
  std::map<std::string, std::string> invisible;  // pool -> message
  std::vector<std::string> other;                // anything else it printed
};

/// rmmd_test_client device-identity under CUDA_VISIBLE_DEVICES=`visible`.
identity_report run_identity_client(daemon_process const& daemon, std::string const& visible)
{
  child_process client(
      {program_path("rmmd_test_client").string(), "device-identity"},
      {"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string(), "CUDA_VISIBLE_DEVICES=" + visible},
      {.merge_stderr = true});
  identity_report r;
  while (auto line = client.read_line(60s)) {
    if (*line == "done") { break; }
    std::istringstream in(*line);
    std::string word;
    in >> word;
    if (word == "device") {
      identity_report::device_line d;
      std::string k1, k2, k3, k4;
      if (in >> d.device >> k1 >> d.uuid >> k2 >> d.pool >> k3 >> d.pool_uuid >> k4 >> d.lives_on >>
              d.verdict &&
          k1 == "uuid") {
        r.devices.push_back(d);
        continue;
      }
    } else if (word == "pool") {
      std::string name;
      in >> name;
      std::string rest;
      std::getline(in, rest);
      r.invisible[name] = rest;
      continue;
    }
    r.other.push_back(*line);
  }
  EXPECT_EQ(client.wait(30s), 0) << "CUDA_VISIBLE_DEVICES=" << visible;
  return r;
}

TEST(GpuIdentity, EachPoolNamesItsGpuByUuidAndPciBusId)
{
  REQUIRE_GPUS(1);
  daemon_process daemon({"--cuda-pool-bytes", "1GiB"});
  auto const uuids = physical_uuids();
  auto const stats = daemon.stats();
  int seen         = 0;
  for (auto const& p : stats.pools()) {
    if (p.pool().backend() != v1::BACKEND_CUDA) { continue; }
    ++seen;
    auto const device = p.pool().device();
    ASSERT_LT(device, static_cast<int>(uuids.size()));
    EXPECT_EQ(p.pool().gpu_uuid(), uuids[static_cast<std::size_t>(device)]);
    EXPECT_EQ(p.pool().pci_bus_id(), gpu::identify(device)->pci_bus_id);
  }
  EXPECT_EQ(seen, gpu_count());
  // The session gives the same identity, with this process's ordinal.
  auto s = daemon.open_session();
  for (int d = 0; d < gpu_count(); ++d) {
    EXPECT_EQ(s.device_pool(d).gpu_uuid, uuids[static_cast<std::size_t>(d)]);
    EXPECT_EQ(s.device_pool(d).device, d);
  }
}

TEST(GpuIdentity, ClientsFindTheirGpusPoolUnderEveryCudaVisibleDevices)
{
  REQUIRE_GPUS(1);
  daemon_process daemon({"--cuda-pool-bytes", "1GiB"});
  auto const uuids = physical_uuids();
  auto const pools = pool_gpus(daemon.stats());
  // Every order of every subset of two GPUs (one GPU: "0", and the GPU named
  // by its UUID, which CUDA_VISIBLE_DEVICES also takes).
  std::vector<std::vector<int>> cases = {{0}};
  if (uuids.size() >= 2) { cases = {{0}, {1}, {1, 0}, {0, 1}}; }
  for (auto const& order : cases) {
    std::string visible;
    for (int d : order) { visible += (visible.empty() ? "" : ",") + std::to_string(d); }
    SCOPED_TRACE("CUDA_VISIBLE_DEVICES=" + visible);
    auto const r = run_identity_client(daemon, visible);
    EXPECT_THAT(r.other, ::testing::IsEmpty());
    ASSERT_EQ(r.devices.size(), order.size());
    for (std::size_t i = 0; i < order.size(); ++i) {
      auto const& d        = r.devices[i];
      auto const& physical = uuids[static_cast<std::size_t>(order[i])];
      EXPECT_EQ(d.uuid, physical) << "the client's device " << i;
      EXPECT_EQ(d.pool_uuid, physical) << "the pool it picked: " << d.pool;
      EXPECT_EQ(pools.at(d.pool), physical) << "the daemon's pool " << d.pool;
      EXPECT_EQ(d.lives_on, physical) << "where the memory is";
      EXPECT_EQ(d.verdict, "intact");
    }
    // The pools of GPUs it cannot see are refused in words.
    EXPECT_EQ(r.invisible.size(), uuids.size() - order.size());
    for (auto const& [pool, message] : r.invisible) {
      EXPECT_THAT(message, HasSubstr("cannot see")) << pool;
      EXPECT_THAT(message, HasSubstr(pools.at(pool))) << pool;
    }
  }
  // By UUID: the form Kubernetes' device plugin and MIG use.
  auto const r = run_identity_client(daemon, uuids.back());
  ASSERT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.devices[0].pool_uuid, uuids.back());
  EXPECT_EQ(r.devices[0].lives_on, uuids.back());
  EXPECT_EQ(r.devices[0].verdict, "intact");
}

TEST(GpuIdentity, ADaemonUnderCudaVisibleDevicesServesTheGpuItSeesUnderItsUuid)
{
  REQUIRE_GPUS(2);
  auto const uuids = physical_uuids();
  std::optional<daemon_process> daemon;
  {
    scoped_env only_second("CUDA_VISIBLE_DEVICES", "1");
    daemon.emplace(std::vector<std::string>{"--cuda-pool-bytes", "1GiB"});
  }
  auto const pools = pool_gpus(daemon->stats());
  ASSERT_EQ(pools.size(), 1u);
  EXPECT_EQ(pools.begin()->second, uuids[1]) << "the daemon's gpu0 is the physical GPU 1";
  for (std::string visible : {"0", "1", "1,0", "0,1"}) {
    SCOPED_TRACE("CUDA_VISIBLE_DEVICES=" + visible);
    auto const r = run_identity_client(*daemon, visible);
    int served   = 0;
    for (auto const& d : r.devices) {
      if (d.verdict == "intact") {
        ++served;
        EXPECT_EQ(d.uuid, uuids[1]);
        EXPECT_EQ(d.lives_on, uuids[1]);
      }
    }
    EXPECT_EQ(served, visible.find('1') != std::string::npos ? 1 : 0);
  }
}

TEST(GpuIdentity, APoolConfiguredByUuidOrPciBusIdIsOnThatGpu)
{
  REQUIRE_GPUS(1);
  auto const last = gpu::identify(gpu_count() - 1).value();
  for (auto const& selector : {last.uuid, last.pci_bus_id}) {
    SCOPED_TRACE(selector);
    char tmpl[] = "/tmp/rmmd-gpu-conf-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    auto const conf = std::filesystem::path(tmpl) / "rmmd.conf";
    {
      std::ofstream out(conf);
      out << "pools { name: \"weights\" backend: CUDA gpu: \"" << selector
          << "\" limit_bytes: 268435456 }\n";
    }
    {
      daemon_process daemon({"--config", conf.string()});
      auto const pools = pool_gpus(daemon.stats());
      ASSERT_EQ(pools.size(), 1u);
      EXPECT_EQ(pools.at("weights"), last.uuid);
    }
    std::filesystem::remove_all(tmpl);
  }
}

/// Files CUDA makes for interprocess events ("cuda.shm.<uid>.<pid>.N").
std::size_t cuda_shm_files()
{
  std::size_t n = 0;
  std::error_code ec;
  for (auto const& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    if (e.path().filename().string().starts_with("cuda.shm.")) { ++n; }
  }
  return n;
}

/// Runs `device-churn` clients (one exits, one is SIGKILLed) against `daemon`
/// as `user` (empty: this process's) and checks that none fell back to
/// waiting, that the daemon got everything back and that /dev/shm is as it was.
void churn_and_check(daemon_process& daemon, std::string const& user)
{
  auto const before = cuda_shm_files();
  for (bool kill : {false, true}) {
    SCOPED_TRACE(kill ? "SIGKILLed" : "exits");
    child_process client(
        {program_path("rmmd_test_client").string(), "device-churn", "300", "1048576"},
        {"RMMD_RUNTIME_DIR=" + daemon.runtime_dir().string()},
        {.merge_stderr = true, .user = user});
    std::vector<std::string> said;
    while (auto line = client.read_line(60s)) {
      if (*line == "done") { break; }
      said.push_back(*line);
    }
    EXPECT_THAT(said, ::testing::IsEmpty()) << "it printed something (a fallback?)";
    if (kill) {
      client.kill(SIGKILL);
    } else {
      client.close_stdin();
    }
    EXPECT_TRUE(client.wait(30s).has_value());
    EXPECT_TRUE(eventually([&] {
      auto const stats = daemon.stats();
      return std::none_of(stats.sessions().begin(), stats.sessions().end(), [](auto const& s) {
        return s.client_name() == "churn";
      });
    }));
    EXPECT_EQ(cuda_shm_files(), before);
    auto const stats = daemon.stats();
    for (auto const& p : stats.pools()) { EXPECT_EQ(p.in_use_bytes(), 0u) << p.pool().name(); }
  }
}

TEST(StreamOrderedFree, DirectFreesLeaveNothingInDevShmAndNeverFallBackToWaiting)
{
  REQUIRE_GPUS(1);
  daemon_process daemon({"--cuda-pool-bytes", "1GiB"});
  churn_and_check(daemon, {});
}

TEST(StreamOrderedFree, SoAcrossUidsAsTheShippedUnitRunsThem)
{
  REQUIRE_GPUS(1);
  // rmmd as user rmmd, the client as another user of group rmmd: a daemon of
  // another uid cannot open CUDA's interprocess events, so this is where the
  // old release events fell back to waiting for the stream.
  char const* mps_pipes = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  if (std::filesystem::exists(std::filesystem::path(mps_pipes ? mps_pipes : "/tmp/nvidia-mps") /
                              "control")) {
    GTEST_SKIP() << "an MPS control daemon runs: MPS serves one uid at a time, and this test "
                    "mixes three (docs/operations.md, Under MPS)";
  }
  auto rmmd_user = ensure_user(daemon_user, daemon_group);
  if (!rmmd_user) { GTEST_SKIP() << users_need_root(); }
  auto client = ensure_user(client_user_a, daemon_group);
  ASSERT_TRUE(client);
  for (auto [user, program] :
       {std::pair{*rmmd_user, "rmmd"}, std::pair{*client, "rmmd_test_client"}}) {
    auto why = unreachable_for(user, program_path(program));
    ASSERT_TRUE(why.empty()) << why;
  }
  daemon_process daemon({"--cuda-pool-bytes",
                         "1GiB",
                         "--allow-uid",
                         "0",
                         "--allow-gid",
                         std::to_string(rmmd_user->gid)},
                        daemon_user);
  churn_and_check(daemon, client_user_a);
}

}  // namespace
}  // namespace rmmd::test
