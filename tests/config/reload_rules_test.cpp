// The reload table: every field of the settings has one row, a reload takes
// the applied fields and keeps the restart-only ones, and the reload line
// names both.

#include "daemon/config/reload_rules.hpp"
#include "daemon/config/config_loader.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

namespace rmmd::config {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

/// Converts to any member type, to count an aggregate's members.
struct any_member {
  template <typename T>
  operator T() const;  // NOLINT: declared only, for the count below
};

template <typename T, typename... Members>
consteval std::size_t member_count()
{
  if constexpr (requires { T{Members{}..., any_member{}}; }) {
    return member_count<T, Members..., any_member>();
  } else {
    return sizeof...(Members);
  }
}

daemon_settings parse_ok(std::string const& text)
{
  auto result = parse_config(text);
  EXPECT_TRUE(result.ok()) << (result.errors.empty() ? "" : format_error("t", result.errors[0]));
  return result.settings.value_or(daemon_settings{});
}

TEST(ReloadRules, EveryFieldOfTheSettingsHasARow)
{
  // A member added to daemon_settings needs a row in reload_rules() (and
  // docs/configuration.md's reload column); then raise this count.
  static_assert(member_count<daemon_settings>() == 22,
                "daemon_settings changed: give the new field a row in reload_rules()");
  std::set<std::string_view> names;
  for (auto const& rule : reload_rules()) {
    EXPECT_TRUE(names.insert(rule.name).second) << rule.name << " has two rows";
    EXPECT_EQ(rule.value != nullptr, rule.when == on_reload::applied) << rule.name;
  }
  EXPECT_EQ(names.size(), 28u);
}

TEST(ReloadRules, NothingChangedSaysSo)
{
  auto const s = parse_ok("quotas { per_session_bytes: 4096 }\n");
  auto changes = changes_between(s, s);
  EXPECT_THAT(changes.applied, IsEmpty());
  EXPECT_THAT(changes.need_restart, IsEmpty());
  EXPECT_EQ(reload_line("/etc/rmmd/rmmd.conf", changes),
            "reloaded /etc/rmmd/rmmd.conf: nothing changed");
}

TEST(ReloadRules, AppliedFieldsAreTakenAndRestartOnlyOnesKept)
{
  auto const now = parse_ok(
      "pools { name: \"host\" backend: HOST capacity_bytes: 16777216 }\n"
      "reclaim_timeout_ms: 200\npack_up_to_bytes: 65536\nhello_timeout_ms: 2000\n");
  auto const next = parse_ok(
      "pools { name: \"host\" backend: HOST capacity_bytes: 33554432 }\n"
      "reclaim_timeout_ms: 50\npack_up_to_bytes: 4096\nhello_timeout_ms: 3000\n"
      "quotas { per_uid_bytes: 8192 uid_overrides { uid: 7 bytes: 1 } }\n");
  auto const changes = changes_between(now, next);
  EXPECT_THAT(changes.applied,
              ElementsAre("quotas.per_uid_bytes=8192",
                          "quotas.uid_overrides={7:1}",
                          "reclaim_timeout_ms=50",
                          "pack_up_to_bytes=4096"));
  EXPECT_THAT(changes.need_restart, ElementsAre("pools", "hello_timeout_ms"));
  EXPECT_EQ(reload_line("f", changes),
            "reloaded f: applied quotas.per_uid_bytes=8192, quotas.uid_overrides={7:1}, "
            "reclaim_timeout_ms=50, pack_up_to_bytes=4096; needs a restart (ignored until "
            "then): pools, hello_timeout_ms");

  auto const after = reloaded(now, next);
  EXPECT_EQ(after.reclaim_timeout, std::chrono::milliseconds(50));
  EXPECT_EQ(after.pack_up_to, 4096u);
  EXPECT_EQ(after.quotas.per_uid_bytes, 8192u);
  EXPECT_EQ(after.pools, now.pools);
  EXPECT_EQ(after.hello_timeout, std::chrono::milliseconds(2000));
  // Once taken, the applied fields no longer differ; the restart-only ones still do.
  auto const again = changes_between(after, next);
  EXPECT_THAT(again.applied, IsEmpty());
  EXPECT_THAT(again.need_restart, ElementsAre("pools", "hello_timeout_ms"));
}

TEST(ReloadRules, PerGpuPoolsNeedARestart)
{
  auto const now  = parse_ok("cuda_pool_per_gpu { limit_bytes: 1073741824 }\n");
  auto const next = parse_ok(
      "cuda_pool_per_gpu { limit_bytes: 1073741824 gpu_overrides { device: 1 skip: true } }\n");
  EXPECT_EQ(reload_line("f", changes_between(now, next)),
            "reloaded f: needs a restart (ignored until then): cuda_pool_per_gpu");
  EXPECT_EQ(reloaded(now, next).cuda_pool_per_gpu, now.cuda_pool_per_gpu);
  // Where in the file an override sits is no change.
  auto const moved = parse_ok("\n\ncuda_pool_per_gpu {\n limit_bytes: 1073741824\n}\n");
  EXPECT_THAT(changes_between(now, moved).need_restart, IsEmpty());
}

TEST(ReloadRules, OnlyRestartOnlyChangesNameNoAppliedField)
{
  auto const now  = parse_ok("max_message_bytes: 65536\n");
  auto const next = parse_ok("max_message_bytes: 131072\nmetrics_address: \"127.0.0.1:9400\"\n");
  EXPECT_EQ(reload_line("f", changes_between(now, next)),
            "reloaded f: needs a restart (ignored until then): max_message_bytes, "
            "metrics_address");
}

}  // namespace
}  // namespace rmmd::config
