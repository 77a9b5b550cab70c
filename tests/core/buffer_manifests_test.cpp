// daemon_core's manifests: set by the creating session before publishing,
// returned by open, describe and buffer_manifest_of; read-write opens only
// where allowed; the fingerprint guard; listing by prefix and labels; the
// daemon's GPU label on CUDA pools. Every refused call changes nothing.

#include "daemon/backends/host/host_backend.hpp"
#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/core/daemon_core.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace rmmd::core {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr std::size_t MiB       = std::size_t{1} << 20;
constexpr std::size_t pool_size = 16 * MiB;
constexpr uid_t alice           = 1000;
constexpr uid_t bob             = 2000;
constexpr char const* gpu       = "GPU-12345678-1234-1234-1234-123456789abc";

peer_credentials peer(uid_t uid)
{
  return peer_credentials{.pid = 4321, .uid = uid, .gid = 100, .supplementary_gids = {}};
}

buffer_manifest two_tensors()
{
  buffer_manifest m;
  m.tensors = {tensor_entry{.name = "embed", .dtype = 6, .shape = {16, 8}, .byte_offset = 0},
               tensor_entry{.name = "w", .dtype = 10, .shape = {4}, .byte_offset = 256}};
  m.tensors[0].aliases = {"lm_head"};
  m.labels             = {{"model", "gpt"}, {"rank", "0"}};
  return m;
}

class BufferManifests : public ::testing::Test {
 protected:
  void SetUp() override
  {
    core_options o;
    o.access.uids = {0, alice, bob};
    o.admin_uid   = 999;
    core_         = std::make_unique<daemon_core>(std::move(o));
    core_->pools().add_pool(pool_config{.name = "host", .handle_types = {handle_type::host_offset}},
                            std::make_unique<backends::host::host_backend>("test", pool_size));
    // A pool the daemon takes for a GPU's: the host backend's memory, with a UUID.
    core_->pools().add_pool(
        pool_config{.name = "gpu0", .gpu_uuid = gpu, .handle_types = {handle_type::host_offset}},
        std::make_unique<backends::host::host_backend>("gpu", pool_size));
    creator_ = open(peer(alice));
    other_   = open(peer(alice));
  }

  session_id open(peer_credentials p)
  {
    auto grant = core_->sessions().open_session(std::move(p), "test", "test");
    EXPECT_TRUE(grant.ok()) << grant.status();
    return grant->id;
  }

  buffer_id create(std::string const& name, buffer_options o = {}, pool_id pool = 0)
  {
    auto grant = core_->buffers().create_buffer(creator_, name, pool, MiB, o);
    EXPECT_TRUE(grant.ok()) << grant.status();
    EXPECT_EQ(grant->access, buffer_access::read_write);
    return grant->id;
  }

  std::string manifest_text(buffer_id id)
  {
    auto m = core_->buffers().buffer_manifest_of(creator_, id);
    if (!m.ok()) { return m.status().ToString(); }
    if (!*m) { return "none"; }
    std::string out;
    for (auto const& t : (*m)->tensors) { out += t.name + ","; }
    for (auto const& [k, v] : (*m)->labels) { out += k + "=" + v + ","; }
    return out;
  }

  std::unique_ptr<daemon_core> core_;
  session_id creator_{};
  session_id other_{};
};

TEST_F(BufferManifests, SetThenOpenDescribeAndGetReturnIt)
{
  auto id = create("m/a");
  EXPECT_EQ(manifest_text(id), "none");
  ASSERT_TRUE(core_->buffers().set_buffer_manifest(creator_, id, two_tensors()).ok());
  EXPECT_EQ(manifest_text(id), "embed,w,model=gpt,rank=0,");
  ASSERT_TRUE(core_->buffers().publish_buffer(creator_, id).ok());

  auto grant = core_->buffers().open_buffer(other_, "m/a");
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_EQ(grant->access, buffer_access::read);
  ASSERT_TRUE(grant->manifest);
  EXPECT_EQ(grant->manifest->tensors.size(), 2u);
  EXPECT_THAT(grant->manifest->tensors[0].aliases, ElementsAre("lm_head"));
  auto got = core_->buffers().buffer_manifest_of(other_, id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->get(), grant->manifest.get());  // shared, not copied

  auto described = core_->buffers().describe_buffer(other_, "m/a");
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->info.tensor_count, 2u);
  EXPECT_THAT(described->info.labels,
              UnorderedElementsAre(Pair("model", "gpt"), Pair("rank", "0")));
  EXPECT_EQ(described->manifest->tensors[1].name, "w");
}

TEST_F(BufferManifests, ALaterSetReplacesTheEarlier)
{
  auto id = create("m/a");
  ASSERT_TRUE(core_->buffers().set_buffer_manifest(creator_, id, two_tensors()).ok());
  ASSERT_TRUE(core_->buffers()
                  .set_buffer_manifest(creator_, id, buffer_manifest{.labels = {{"k", "v"}}})
                  .ok());
  EXPECT_EQ(manifest_text(id), "k=v,");
}

TEST_F(BufferManifests, RefusedSetsChangeNothing)
{
  auto id = create("m/a");
  ASSERT_TRUE(core_->buffers().set_buffer_manifest(creator_, id, two_tensors()).ok());
  auto const before = manifest_text(id);

  auto bad                   = two_tensors();
  bad.tensors[1].byte_offset = 8;  // inside "embed"
  auto s                     = core_->buffers().set_buffer_manifest(creator_, id, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("set the manifest of buffer"));
  EXPECT_THAT(s.message(), HasSubstr("'m/a'"));
  EXPECT_THAT(s.message(), HasSubstr("overlaps tensor 'w' (#1)"));

  bad                        = two_tensors();
  bad.tensors[1].byte_offset = MiB;  // past the end
  EXPECT_THAT(core_->buffers().set_buffer_manifest(creator_, id, bad).message(),
              HasSubstr("run past the end of the buffer (1048576 bytes)"));
  bad                         = two_tensors();
  bad.labels["rmmd.gpu_uuid"] = "GPU-fake";
  EXPECT_EQ(core_->buffers().set_buffer_manifest(creator_, id, bad).code(),
            absl::StatusCode::kInvalidArgument);

  // Not its creator: another session of the same uid.
  s = core_->buffers().set_buffer_manifest(other_, id, two_tensors());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("only the session that created it"));
  EXPECT_EQ(core_->buffers().set_buffer_manifest(creator_, 999, two_tensors()).code(),
            absl::StatusCode::kNotFound);

  ASSERT_TRUE(core_->buffers().publish_buffer(creator_, id).ok());
  s = core_->buffers().set_buffer_manifest(creator_, id, buffer_manifest{});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("published already"));
  EXPECT_EQ(manifest_text(id), before);
}

TEST_F(BufferManifests, ReadWriteOnlyForTheCreatorOrWhereWritersAreAllowed)
{
  auto ro = create("m/ro");
  auto rw = create("m/rw", buffer_options{.allow_writers = true});
  ASSERT_TRUE(core_->buffers().publish_buffer(creator_, ro).ok());
  ASSERT_TRUE(core_->buffers().publish_buffer(creator_, rw).ok());
  buffer_open_options const write{.access = buffer_access::read_write};

  auto refused = core_->buffers().open_buffer(other_, "m/ro", {}, write);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("open buffer 'm/ro' for writing"));
  EXPECT_THAT(refused.status().message(), HasSubstr("allow_writers"));
  EXPECT_EQ(core_->buffers().describe_buffer(other_, "m/ro")->info.holders,
            1u);  // held by nobody new

  auto granted = core_->buffers().open_buffer(other_, "m/rw", {}, write);
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(granted->access, buffer_access::read_write);
  EXPECT_TRUE(core_->buffers().describe_buffer(other_, "m/rw")->info.allow_writers);
  auto own = core_->buffers().open_buffer(creator_, "m/ro", {}, write);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->access, buffer_access::read_write);
}

TEST_F(BufferManifests, TheFingerprintGuardNamesTheFirstMismatchInKeyOrder)
{
  auto id = create("m/a");
  ASSERT_TRUE(core_->buffers().set_buffer_manifest(creator_, id, two_tensors()).ok());
  ASSERT_TRUE(core_->buffers().publish_buffer(creator_, id).ok());

  auto open_expecting = [&](std::map<std::string, std::string> labels) {
    return core_->buffers().open_buffer(
        other_, "m/a", {}, buffer_open_options{.expect_labels = labels});
  };
  auto refused = open_expecting({{"rank", "1"}, {"model", "llama"}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(), "buffer 'm/a': label 'model' is 'gpt', expected 'llama'");
  refused = open_expecting({{"model", "gpt"}, {"revision", "abc"}});
  EXPECT_EQ(refused.status().message(), "buffer 'm/a': has no label 'revision'");
  EXPECT_EQ(core_->buffers().describe_buffer(other_, "m/a")->info.holders, 1u);
  EXPECT_EQ(core_->buffers().buffer_manifest_of(other_, id).status().code(),
            absl::StatusCode::kNotFound);

  auto granted = open_expecting({{"model", "gpt"}, {"rank", "0"}});
  ASSERT_TRUE(granted.ok()) << granted.status();
  EXPECT_EQ(core_->buffers().describe_buffer(other_, "m/a")->info.holders, 2u);
}

TEST_F(BufferManifests, CudaPoolsCarryTheGpuLabelThatSetKeeps)
{
  auto id = create("m/gpu", {}, 1);
  EXPECT_EQ(manifest_text(id), std::string("rmmd.gpu_uuid=") + gpu + ",");
  ASSERT_TRUE(core_->buffers().set_buffer_manifest(creator_, id, two_tensors()).ok());
  EXPECT_EQ(manifest_text(id), std::string("embed,w,model=gpt,rank=0,rmmd.gpu_uuid=") + gpu + ",");
  auto host = create("m/host");
  EXPECT_EQ(manifest_text(host), "none");
}

TEST_F(BufferManifests, ListingByPrefixAndLabelsKeepsTheVisibilityRules)
{
  auto a = create("team/a");
  auto b = create("team/b");
  auto c = create("other/c");
  ASSERT_TRUE(core_->buffers().set_buffer_manifest(creator_, a, two_tensors()).ok());
  ASSERT_TRUE(core_->buffers()
                  .set_buffer_manifest(creator_, b, buffer_manifest{.labels = {{"model", "gpt"}}})
                  .ok());
  for (auto id : {a, c}) { ASSERT_TRUE(core_->buffers().publish_buffer(creator_, id).ok()); }

  auto names = [&](session_id s, buffer_filter f) {
    std::vector<std::string> out;
    auto listed = core_->buffers().list_buffers(s, f);
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (!listed.ok()) { return out; }
    for (auto const& i : *listed) { out.push_back(i.name); }
    return out;
  };
  EXPECT_THAT(names(creator_, {.name_prefix = "team/"}), ElementsAre("team/a", "team/b"));
  EXPECT_THAT(names(creator_, {.labels = {{"model", "gpt"}}}), ElementsAre("team/a", "team/b"));
  EXPECT_THAT(names(creator_, {.labels = {{"model", "gpt"}, {"rank", "0"}}}),
              ElementsAre("team/a"));
  EXPECT_THAT(names(creator_, {.labels = {{"model", "llama"}}}), ElementsAre());
  // Another session sees published buffers only: not team/b.
  EXPECT_THAT(names(other_, {.name_prefix = "team/"}), ElementsAre("team/a"));
  EXPECT_THAT(names(other_, {.labels = {{"model", "gpt"}}}), ElementsAre("team/a"));
  auto row = core_->buffers().list_buffers(other_, {.name_prefix = "team/a"});
  ASSERT_TRUE(row.ok());
  ASSERT_EQ(row->size(), 1u);
  EXPECT_EQ((*row)[0].tensor_count, 2u);
  EXPECT_EQ((*row)[0].labels.at("rank"), "0");

  // Describe: the same visibility, NOT_FOUND for what the caller may not see.
  EXPECT_EQ(core_->buffers().describe_buffer(other_, "team/b").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->buffers().describe_buffer(other_, "nope").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(core_->buffers().describe_buffer(creator_, "team/b").ok());
  auto bobs = open(peer(bob));
  EXPECT_EQ(core_->buffers().describe_buffer(bobs, "team/a").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(names(bobs, {}), ElementsAre());
  auto root = open(peer(0));
  EXPECT_THAT(names(root, {.name_prefix = "team"}), ElementsAre("team/a", "team/b"));
}

}  // namespace
}  // namespace rmmd::core
