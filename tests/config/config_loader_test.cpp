// The configuration file: parsing (protobuf text format), validation with
// line and column for every error, and the settings it yields.

#include "daemon/config/config_loader.hpp"

#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace rmmd::config {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::SizeIs;

daemon_settings parse_ok(std::string const& text)
{
  auto result = parse_config(text);
  EXPECT_TRUE(result.ok()) << (result.errors.empty() ? "" : format_error("t", result.errors[0]));
  return result.settings.value_or(daemon_settings{});
}

/// The single error `text` yields.
config_error only_error(std::string const& text)
{
  auto result = parse_config(text);
  EXPECT_FALSE(result.settings.has_value());
  EXPECT_THAT(result.errors, SizeIs(1)) << text;
  return result.errors.empty() ? config_error{} : result.errors.front();
}

auto error_at(int line, int column, std::string const& text)
{
  return AllOf(Field(&config_error::line, line),
               Field(&config_error::column, column),
               Field(&config_error::message, HasSubstr(text)));
}

TEST(ConfigLoader, AnEmptyFileMeansTheBuiltInDefaults)
{
  auto s = parse_ok("# nothing but a comment\n");
  EXPECT_TRUE(s.runtime_dir.empty());
  EXPECT_EQ(s.runtime_dir_mode, 0750u);
  EXPECT_EQ(s.socket_mode, 0660u);
  EXPECT_FALSE(s.socket_group.has_value());
  EXPECT_TRUE(s.access_is_default);
  // The daemon's user and root (an administrator, as for trim and delete).
  if (::geteuid() == 0) {
    EXPECT_THAT(s.access.uids, ElementsAre(0u));
  } else {
    EXPECT_THAT(s.access.uids, ElementsAre(::geteuid(), 0u));
  }
  ASSERT_THAT(s.pools, SizeIs(1));
  EXPECT_EQ(s.pools[0].name, "host");
  EXPECT_EQ(s.pools[0].backend, config::pool_kind::host);
  EXPECT_EQ(s.pools[0].capacity_bytes, default_host_pool_bytes);
  ASSERT_TRUE(s.cuda_pool_per_gpu.has_value());
  EXPECT_EQ(*s.cuda_pool_per_gpu, per_gpu_pools{});
  EXPECT_EQ(s.quotas.per_session_bytes, 0u);
  EXPECT_EQ(s.quotas.per_uid_bytes, 0u);
  EXPECT_EQ(s.admission.max_pending_per_uid, 16u);
  EXPECT_EQ(s.admission.max_pending_total, 256u);
  EXPECT_EQ(s.admission.max_sessions_per_uid, 1024u);
  EXPECT_EQ(s.admission.max_sessions_total, 16384u);
  EXPECT_EQ(s.drain_timeout, std::chrono::milliseconds(5000));
  EXPECT_EQ(s.hello_timeout, std::chrono::milliseconds(2000));
  EXPECT_EQ(s.max_message_bytes, 65536u);
  EXPECT_TRUE(s.metrics_address.empty());
  EXPECT_EQ(s.metrics_top_sessions, 10u);
  EXPECT_EQ(s.log_level, log::level::info);
}

TEST(ConfigLoader, EveryFieldReachesTheSettings)
{
  auto s = parse_ok(R"(
    runtime_dir: "/run/rmmd-test"
    socket_group: "root"
    runtime_dir_mode: "0710"
    socket_mode: "0600"
    allowed_uids: [1000, 1001]
    allowed_gids: 2000
    allowed_users: "root"
    allowed_groups: "root"
    pools { name: "staging" backend: HOST capacity_bytes: 4194304 }
    pools {
      name: "big" backend: CUDA device: 1 handle_types: [POSIX_FD, FABRIC]
      initial_size_bytes: 1024 release_threshold_bytes: 2048 limit_bytes: 4096
    }
    pools { name: "plain" backend: CUDA handle_types: POSIX_FD }
    pools { name: "auto" backend: CUDA }
    quotas {
      per_session_bytes: 1048576
      per_uid_bytes: 2097152
      uid_overrides { uid: 1000 bytes: 0 }
      uid_overrides { user: "root" bytes: 123 }
    }
    admission {
      max_pending_per_uid: 3
      max_pending_total: 30
      max_sessions_per_uid: 5
      max_sessions_total: 50
    }
    drain_timeout_ms: 0
    hello_timeout_ms: 250
    max_message_bytes: 1048576
    metrics_address: "127.0.0.1:9464"
    metrics_top_sessions: 25
    log_level: DEBUG
    pack_up_to_bytes: 4096
    state_file: "/var/lib/rmmd-test/buffers.state"
  )");
  EXPECT_EQ(s.pack_up_to, 4096u);
  EXPECT_EQ(s.runtime_dir, "/run/rmmd-test");
  EXPECT_EQ(s.socket_group, gid_t{0});
  EXPECT_EQ(s.runtime_dir_mode, 0710u);
  EXPECT_EQ(s.socket_mode, 0600u);
  EXPECT_EQ(s.state_file, "/var/lib/rmmd-test/buffers.state");
  EXPECT_FALSE(s.access_is_default);
  EXPECT_THAT(s.access.uids, ElementsAre(1000u, 1001u, 0u));
  EXPECT_THAT(s.access.gids, ElementsAre(2000u, 0u));
  EXPECT_FALSE(s.cuda_pool_per_gpu.has_value());  // pools listed, cuda_pool_per_gpu not
  ASSERT_THAT(s.pools, SizeIs(4));
  EXPECT_EQ(s.pools[0],
            (pool_settings{.name           = "staging",
                           .backend        = config::pool_kind::host,
                           .device         = -1,
                           .capacity_bytes = 4194304}));
  EXPECT_EQ(s.pools[1],
            (pool_settings{.name                    = "big",
                           .backend                 = config::pool_kind::cuda,
                           .device                  = 1,
                           .fabric                  = fabric_mode::required,
                           .initial_size_bytes      = 1024,
                           .release_threshold_bytes = 2048,
                           .limit_bytes             = 4096}));
  EXPECT_EQ(s.pools[1].line, 11);
  EXPECT_EQ(s.pools[2].fabric, fabric_mode::off);
  EXPECT_EQ(s.pools[2].device, 0);
  EXPECT_EQ(s.pools[3].fabric, fabric_mode::automatic);
  EXPECT_EQ(s.pools[3].limit_bytes, 0u);  // 80% of the GPU's free memory
  EXPECT_EQ(s.quotas.per_session_bytes, 1048576u);
  EXPECT_EQ(s.quotas.per_uid_bytes, 2097152u);
  EXPECT_EQ(s.quotas.limit_for_uid(1000), 0u);
  EXPECT_EQ(s.quotas.limit_for_uid(0), 123u);
  EXPECT_EQ(s.quotas.limit_for_uid(4242), 2097152u);
  EXPECT_EQ(s.admission,
            (core::admission_limits{.max_pending_per_uid  = 3,
                                    .max_pending_total    = 30,
                                    .max_sessions_per_uid = 5,
                                    .max_sessions_total   = 50}));
  EXPECT_EQ(s.drain_timeout, std::chrono::milliseconds(0));
  EXPECT_EQ(s.hello_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(s.max_message_bytes, 1048576u);
  EXPECT_EQ(s.metrics_address, "127.0.0.1:9464");
  EXPECT_EQ(s.metrics_top_sessions, 25u);
  EXPECT_EQ(s.log_level, log::level::debug);
}

TEST(ConfigLoader, SyntaxErrorsCarryLineAndColumn)
{
  // Columns are where protobuf's parser stands when it sees the error: on
  // the offending token, or on the one just after it.
  EXPECT_THAT(only_error("log_level: INFO\ndrain_timeout_ms: \"soon\"\n"),
              error_at(2, 19, "Expected integer"));
  EXPECT_THAT(only_error("pools {\n  name: \"a\"\n  colour: \"blue\"\n}\n"),
              error_at(3, 9, "no field named \"colour\""));
  EXPECT_THAT(only_error("pools { name: \"a\" backend: GPU }"),
              error_at(1, 32, "Unknown enumeration value of \"GPU\" for field \"backend\""));
  EXPECT_THAT(only_error("hello_timeout_ms: 5\nhello_timeout_ms: 6\n"),
              error_at(2, 17, "specified multiple times"));
  EXPECT_THAT(only_error("quotas { uid_overrides { uid: 1 user: \"root\" } }"),
              error_at(1, 37, "oneof"));
  EXPECT_THAT(only_error("pools {\n  name: \"a\"\n"), error_at(3, 1, "Expected identifier"));
  EXPECT_THAT(only_error("max_message_bytes: -5"), error_at(1, 20, "Expected integer"));
}

struct semantic_case {
  char const* text;
  int line;
  int column;
  char const* message;
};

class SemanticError : public ::testing::TestWithParam<semantic_case> {};

TEST_P(SemanticError, IsReportedAtTheFieldItConcerns)
{
  auto const& c = GetParam();
  EXPECT_THAT(only_error(c.text), error_at(c.line, c.column, c.message));
}

INSTANTIATE_TEST_SUITE_P(
    Pools,
    SemanticError,
    ::testing::Values(
        semantic_case{"pools { name: \"a\" backend: HOST }\npools { name: \"a\" backend: HOST }",
                      2,
                      9,
                      "pool name \"a\" is already used by the pool at line 1"},
        semantic_case{"pools {\n  name: \"a\"\n}", 1, 1, "pool \"a\" has no backend"},
        semantic_case{"pools { backend: HOST }", 1, 1, "pools[0] has no name"},
        semantic_case{
            "pools { name: \"a b\" backend: HOST }", 1, 9, "may hold only letters, digits"},
        semantic_case{"pools { name: \"h\" backend: HOST capacity_bytes: 0 }",
                      1,
                      33,
                      "pool \"h\": capacity_bytes is 0"},
        semantic_case{"pools { name: \"g\" backend: CUDA limit_bytes: 100\n"
                      "  release_threshold_bytes: 200 }",
                      2,
                      3,
                      "release_threshold_bytes (200) is larger than limit_bytes (100)"},
        semantic_case{
            "pools { name: \"g\" backend: CUDA limit_bytes: 100 initial_size_bytes: 101 }",
            1,
            50,
            "initial_size_bytes (101) is larger than limit_bytes (100)"},
        semantic_case{
            "pools { name: \"g\" backend: CUDA limit_bytes: 0 }", 1, 33, "limit_bytes is 0"},
        semantic_case{
            "pools { name: \"g\" backend: CUDA device: -1 }", 1, 33, "device -1 is negative"},
        semantic_case{"pools { name: \"g\" backend: CUDA capacity_bytes: 5 }",
                      1,
                      33,
                      "capacity_bytes applies to host pools only"},
        semantic_case{"pools { name: \"h\" backend: HOST release_threshold_bytes: 5 }",
                      1,
                      33,
                      "release_threshold_bytes applies to CUDA pools only"},
        semantic_case{"pools { name: \"h\" backend: HOST device: 0 }",
                      1,
                      33,
                      "device applies to CUDA pools only"},
        semantic_case{"pools { name: \"h\" backend: HOST gpu: \"0000:3b:00.0\" }",
                      1,
                      33,
                      "gpu applies to CUDA pools only"},
        semantic_case{"pools { name: \"g\" backend: CUDA gpu: \"GPU-12\" }",
                      1,
                      33,
                      "gpu \"GPU-12\" is neither a GPU UUID"},
        semantic_case{"pools { name: \"g\" backend: CUDA gpu: \"3b:00\" }",
                      1,
                      33,
                      "nor a PCI bus id (0000:3b:00.0)"},
        semantic_case{"pools { name: \"g\" backend: CUDA device: 1 gpu: \"3b:00.0\" }",
                      1,
                      43,
                      "both device and gpu name the GPU"},
        semantic_case{"pools { name: \"g\" backend: CUDA handle_types: FABRIC }",
                      1,
                      33,
                      "handle_types must include POSIX_FD"},
        semantic_case{"pools { name: \"g\" backend: CUDA\n handle_types: POSIX_FD\n"
                      " handle_types: POSIX_FD }",
                      3,
                      2,
                      "handle type POSIX_FD is listed twice"}));

INSTANTIATE_TEST_SUITE_P(
    Daemon,
    SemanticError,
    ::testing::Values(
        semantic_case{"runtime_dir: \"run/rmmd\"", 1, 1, "is relative"},
        semantic_case{
            "\n runtime_dir: \"/run/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
            2,
            2,
            "is too long"},
        semantic_case{
            "state_file: \"buffers.state\"", 1, 1, "state_file \"buffers.state\" is relative"},
        semantic_case{"socket_mode: \"660x\"", 1, 1, "socket_mode \"660x\" is not an octal"},
        semantic_case{"socket_mode: \"4660\"", 1, 1, "is not an octal permission mode"},
        semantic_case{"socket_mode: \"0060\"", 1, 1, "must give the owner read and write"},
        semantic_case{"runtime_dir_mode: \"0650\"", 1, 1, "must give the owner rwx"},
        semantic_case{"socket_group: \"no-such-group-rmmd\"",
                      1,
                      1,
                      "socket_group \"no-such-group-rmmd\": no such group"},
        semantic_case{"allowed_users: \"root\"\nallowed_users: \"no-such-user-rmmd\"",
                      2,
                      1,
                      "no user named \"no-such-user-rmmd\""},
        semantic_case{"allowed_groups: [\"root\",\n \"no-such-group-rmmd\"]",
                      1,
                      1,  // a list's values share the field's location
                      "no group named \"no-such-group-rmmd\""},
        semantic_case{"quotas {\n uid_overrides { uid: 7 bytes: 1 }\n"
                      " uid_overrides { uid: 7 bytes: 2 }\n}",
                      3,
                      18,
                      "uid 7 already has a quota at line 2"},
        semantic_case{
            "quotas { uid_overrides { bytes: 1 } }", 1, 10, "uid_overrides[0] names nobody"},
        semantic_case{"quotas { uid_overrides { user: \"no-such-user-rmmd\" } }",
                      1,
                      26,
                      "no user named \"no-such-user-rmmd\""},
        semantic_case{"hello_timeout_ms: 0", 1, 1, "hello_timeout_ms 0 is out of range"},
        semantic_case{
            "pack_up_to_bytes: 2097153", 1, 1, "is larger than a packed block (2097152 bytes)"},
        semantic_case{"drain_timeout_ms: 3600001", 1, 1, "longer than the most allowed"},
        semantic_case{"max_message_bytes: 100", 1, 1, "max_message_bytes 100 is out of range"},
        semantic_case{"metrics_address: \"localhost\"", 1, 1, "it has no port"},
        semantic_case{"metrics_address: \"::1:9464\"", 1, 1, "in brackets"},
        semantic_case{"metrics_address: \"127.0.0.1:99999\"", 1, 1, "not a number from 1 to 65535"},
        semantic_case{"metrics_address: \":9464\"", 1, 1, "the host is empty"},
        semantic_case{
            "metrics_top_sessions: 10001", 1, 1, "metrics_top_sessions 10001 is out of range"}));

TEST(ConfigLoader, APoolsGpuIsNamedByUuidOrPciBusId)
{
  for (auto const* gpu : {"GPU-5f3c2b1a-0a1b-2c3d-4e5f-60718293a4b5",
                          "gpu-5F3C2B1A-0A1B-2C3D-4E5F-60718293A4B5",
                          "0000:3b:00.0",
                          "00000000:3B:00.0",
                          "3b:00.0"}) {
    auto const s = parse_ok(absl::StrCat("pools { name: \"g\" backend: CUDA gpu: \"", gpu, "\" }"));
    ASSERT_EQ(s.pools.size(), 1u) << gpu;
    EXPECT_EQ(s.pools[0].gpu, gpu);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Admission,
    SemanticError,
    ::testing::Values(
        semantic_case{"admission {\n  max_pending_per_uid: 0\n}",
                      2,
                      3,
                      "admission.max_pending_per_uid 0 is out of range; give 1 to 1000000"},
        semantic_case{"admission { max_sessions_total: 1000001 }",
                      1,
                      13,
                      "admission.max_sessions_total 1000001 is out of range"},
        // A per-uid limit above its total: at the field written, the per-uid
        // one when both are, the total when only it is (the default per-uid
        // limit then exceeds it).
        semantic_case{"admission {\n  max_sessions_per_uid: 20\n  max_sessions_total: 10\n}",
                      2,
                      3,
                      "admission.max_sessions_per_uid (20) is larger than "
                      "admission.max_sessions_total (10)"},
        semantic_case{"admission { max_pending_total: 8 }",
                      1,
                      13,
                      "admission.max_pending_per_uid (16) is larger than "
                      "admission.max_pending_total (8): one uid could take every slot"}));

TEST(ConfigLoader, MetricsTopSessionsZeroMeansNoneNotTheDefault)
{
  EXPECT_EQ(parse_ok("metrics_top_sessions: 0").metrics_top_sessions, 0u);
  EXPECT_EQ(parse_ok("metrics_top_sessions: 10000").metrics_top_sessions, 10000u);
}

TEST(ConfigLoader, GoodAddressesAreAccepted)
{
  for (auto const* a : {"127.0.0.1:9464", "[::1]:9464", "localhost:1", "0.0.0.0:65535"}) {
    EXPECT_EQ(parse_ok(absl::StrCat("metrics_address: \"", a, "\"")).metrics_address, a);
  }
}

TEST(ConfigLoader, EverySemanticErrorIsReportedInLineOrder)
{
  auto result = parse_config(R"(socket_mode: "99"
pools { name: "x" backend: HOST capacity_bytes: 0 }
pools { name: "x" }
hello_timeout_ms: 0
)");
  EXPECT_FALSE(result.settings.has_value());
  EXPECT_THAT(result.errors,
              ElementsAre(error_at(1, 1, "socket_mode"),
                          error_at(2, 33, "capacity_bytes is 0"),
                          error_at(3, 1, "has no backend"),
                          error_at(3, 9, "already used by the pool at line 2"),
                          error_at(4, 1, "hello_timeout_ms")));
}

TEST(ConfigLoader, ErrorsAreFormattedForCompilersAndEditors)
{
  EXPECT_EQ(format_error("/etc/rmmd/rmmd.conf", config_error{3, 7, "bad"}),
            "/etc/rmmd/rmmd.conf:3:7: bad");
  EXPECT_EQ(format_error("/etc/rmmd/rmmd.conf", config_error{0, 0, "cannot read"}),
            "/etc/rmmd/rmmd.conf: cannot read");
}

class ConfigFile : public ::testing::Test {
 protected:
  void SetUp() override
  {
    char tmpl[] = "/tmp/rmmd-config-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override
  {
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path write(std::string const& text)
  {
    auto path = dir_ / "rmmd.conf";
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(ConfigFile, IsReadAndParsed)
{
  auto result = load_config_file(write("log_level: WARNING\n"));
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.settings->log_level, log::level::warning);
}

TEST_F(ConfigFile, AMissingFileIsOneErrorWithoutALine)
{
  auto result = load_config_file(dir_ / "absent.conf");
  EXPECT_THAT(result.errors,
              ElementsAre(error_at(0, 0, "cannot read the configuration file: No such file")));
}

TEST_F(ConfigFile, ADirectoryIsNotAFile)
{
  auto result = load_config_file(dir_);
  EXPECT_THAT(result.errors, ElementsAre(error_at(0, 0, "it is a directory")));
}

TEST(Settings, TheEnvironmentChoosesTheRuntimeDirectoryBeforeTheFile)
{
  daemon_settings s;
  s.runtime_dir = "/from/file";
  ::setenv("RMMD_RUNTIME_DIR", "/from/env", 1);
  EXPECT_EQ(effective_runtime_dir(s), "/from/env");
  ::unsetenv("RMMD_RUNTIME_DIR");
  EXPECT_EQ(effective_runtime_dir(s), "/from/file");
  EXPECT_EQ(effective_runtime_dir(daemon_settings{}), "/run/rmmd");
}

TEST(Settings, TheSummaryNamesWhatMatters)
{
  auto s    = parse_ok(R"(pools { name: "staging" backend: HOST capacity_bytes: 4096 }
                       quotas { per_session_bytes: 1024 }
                       admission { max_sessions_per_uid: 7 }
                       metrics_address: "127.0.0.1:9464")");
  auto text = summary(s);
  EXPECT_THAT(text, HasSubstr("pool staging: host memory, 4096 bytes"));
  EXPECT_THAT(text, HasSubstr("per session 1024 bytes"));
  EXPECT_THAT(text, HasSubstr("metrics 127.0.0.1:9464"));
  EXPECT_THAT(text, HasSubstr("16 silent connection(s) per uid, 256 in all; 7 session(s) per uid"));
  EXPECT_EQ(mode_text(0660), "0660");
}

}  // namespace
}  // namespace rmmd::config

namespace rmmd::config {
namespace {

/// A readable PEM-looking file for the peering checks (they check that it
/// reads, not what it says).
std::string readable_file(std::string const& name)
{
  auto const path = std::filesystem::temp_directory_path() / ("rmmd-config-test-" + name);
  std::ofstream(path) << "-----BEGIN CERTIFICATE-----\n";
  return path.string();
}

std::string tls_block()
{
  return "tls { certificate_file: '" + readable_file("a.pem") + "' private_key_file: '" +
         readable_file("a.key") + "' trusted_ca_file: '" + readable_file("ca.pem") + "' }";
}

TEST(Peering, IsOffByDefaultAndNamesTheNodeByItsHostName)
{
  auto s = parse_ok("");
  EXPECT_FALSE(s.peering.enabled());
  EXPECT_EQ(s.peering.node_name, host_name());
  EXPECT_EQ(s.peering.hold_lease, std::chrono::milliseconds(15000));
  EXPECT_EQ(s.peering.renew_interval, std::chrono::milliseconds(3000));
  EXPECT_EQ(s.peering.keepalive, std::chrono::milliseconds(5000));
}

TEST(Peering, EveryFieldReachesTheSettings)
{
  auto s = parse_ok("peering { node_name: 'nodeA' listen_address: '0.0.0.0:7070' " + tls_block() +
                    " peers { name: 'nodeB' address: 'b.example:7070' identity: 'CN=rmmd-nodeB' "
                    "tls_server_name: 'b' } grants { identity: 'CN=rmmd-nodeB' name_prefixes: "
                    "'models/' name_prefixes: 'kv/' allow_writers: true } hold_lease_ms: 9000 "
                    "renew_interval_ms: 1000 keepalive_ms: 2000 }");
  EXPECT_TRUE(s.peering.enabled());
  EXPECT_EQ(s.peering.node_name, "nodeA");
  EXPECT_EQ(s.peering.listen_address, "0.0.0.0:7070");
  ASSERT_TRUE(s.peering.tls);
  ASSERT_EQ(s.peering.peers.size(), 1u);
  EXPECT_EQ(s.peering.peers[0].identity, "CN=rmmd-nodeB");
  EXPECT_EQ(s.peering.peers[0].tls_server_name, "b");
  ASSERT_EQ(s.peering.grants.size(), 1u);
  EXPECT_THAT(s.peering.grants[0].name_prefixes, ::testing::ElementsAre("models/", "kv/"));
  EXPECT_TRUE(s.peering.grants[0].allow_writers);
  EXPECT_EQ(s.peering.hold_lease, std::chrono::milliseconds(9000));
  EXPECT_EQ(s.peering.renew_interval, std::chrono::milliseconds(1000));
  EXPECT_EQ(s.peering.keepalive, std::chrono::milliseconds(2000));
}

TEST(Peering, PlaintextOnlyWhenTheTestEscapeSaysSo)
{
  EXPECT_THAT(only_error("peering { listen_address: '127.0.0.1:7070' }").message,
              HasSubstr("listen_address is set without peering.tls"));
  EXPECT_THAT(only_error("peering { peers { name: 'b' address: 'b:1' } }").message,
              HasSubstr("peers are set without peering.tls"));
  auto s =
      parse_ok("peering { listen_address: '127.0.0.1:7070' insecure_plaintext_for_tests: true }");
  EXPECT_TRUE(s.peering.insecure_plaintext_for_tests);
}

TEST(Peering, BadValuesAreNamed)
{
  EXPECT_THAT(
      only_error("peering { insecure_plaintext_for_tests: true listen_address: 'nohost' }").message,
      HasSubstr("peering.listen_address \"nohost\": it has no port"));
  EXPECT_THAT(only_error("peering { insecure_plaintext_for_tests: true peers { name: 'b' "
                         "address: 'b:99999' } }")
                  .message,
              HasSubstr("peering.peers[0].address \"b:99999\""));
  EXPECT_THAT(only_error("peering { node_name: 'a' insecure_plaintext_for_tests: true peers { "
                         "name: 'a' address: 'a:1' } }")
                  .message,
              HasSubstr("is this node's own name"));
  EXPECT_THAT(only_error("peering { insecure_plaintext_for_tests: true peers { name: 'b' "
                         "address: 'b:1' } peers { name: 'b' address: 'c:1' } }")
                  .message,
              HasSubstr("peering.peers[1].name \"b\" is named twice"));
  EXPECT_THAT(only_error("peering { node_name: 'a:b' }").message,
              HasSubstr("which the client APIs use to split NODE:NAME"));
  EXPECT_THAT(only_error("peering { grants { name_prefixes: 'x' } }").message,
              HasSubstr("peering.grants[0].identity is empty"));
  EXPECT_THAT(only_error("peering { hold_lease_ms: 1000 renew_interval_ms: 900 }").message,
              HasSubstr("must be at most half of peering.hold_lease_ms"));
}

TEST(Peering, TlsFilesMustBeReadable)
{
  auto e = only_error("peering { listen_address: '127.0.0.1:7070' tls { certificate_file: '" +
                      readable_file("c.pem") +
                      "' private_key_file: '/nonexistent/k.pem' "
                      "trusted_ca_file: '" +
                      readable_file("ca2.pem") + "' } }");
  EXPECT_THAT(e.message,
              HasSubstr("peering.tls.private_key_file \"/nonexistent/k.pem\" cannot be "
                        "read: No such file or directory"));
  EXPECT_THAT(
      only_error("peering { listen_address: '127.0.0.1:7070' tls { certificate_file: "
                 "'a.pem' private_key_file: '" +
                 readable_file("k2") + "' trusted_ca_file: '" + readable_file("ca3") + "' } }")
          .message,
      HasSubstr("is relative"));
}

}  // namespace
}  // namespace rmmd::config
