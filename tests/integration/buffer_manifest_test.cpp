// Buffer manifests through the real daemon's gRPC socket (host pool):
// SetBufferManifest, DescribeBuffer, GetBufferManifest and the manifest in
// OpenBuffer's grant; refusals that change nothing; read-write opens; the
// fingerprint guard; listing by prefix and label; `rmmctl buffers show`.
// Raw requests through the session's stub, past any client library checks.
// (The session socket's side: tests/session/session_protocol_test.cpp.)

#include "client/detail/session_access.hpp"
#include "client/detail/session_impl.hpp"
#include "tests/tools/child_process.hpp"
#include "tests/tools/daemon_process.hpp"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

void add_label(google::protobuf::RepeatedPtrField<v1::Label>* labels,
               std::string const& key,
               std::string const& value)
{
  auto* label = labels->Add();
  label->set_key(key);
  label->set_value(value);
}

std::string label_of(google::protobuf::RepeatedPtrField<v1::Label> const& labels,
                     std::string const& key)
{
  for (auto const& label : labels) {
    if (label.key() == key) { return label.value(); }
  }
  return "(none)";
}

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr std::uint64_t buffer_bytes = 1 << 20;

v1::TensorEntry tensor(std::string name,
                       v1::DType dtype,
                       std::vector<std::uint64_t> shape,
                       std::uint64_t offset)
{
  v1::TensorEntry t;
  t.set_name(std::move(name));
  t.set_dtype(dtype);
  for (auto d : shape) { t.add_shape(d); }
  t.set_byte_offset(offset);
  return t;
}

v1::BufferManifest weights()
{
  v1::BufferManifest m;
  *m.add_tensors() = tensor("embed", v1::DTYPE_FLOAT16, {128, 64}, 0);
  m.mutable_tensors(0)->add_aliases("lm_head.weight");
  *m.add_tensors() = tensor("layer0.w", v1::DTYPE_FLOAT32, {64, 64}, 16384);
  auto* t          = m.add_tensors();
  *t               = tensor("layer0.wT", v1::DTYPE_FLOAT32, {64, 32}, 32768);
  t->add_strides(1);
  t->add_strides(64);
  add_label(m.mutable_labels(), "model", "tiny-gpt");
  add_label(m.mutable_labels(), "revision", "r1");
  return m;
}

/// A session speaking gRPC; its raw calls.
class raw_session {
 public:
  explicit raw_session(daemon_process const& d) : s_(d.open_session("raw", call_transport::grpc)) {}

  grpc::Status create(std::string const& name, bool allow_writers, v1::BufferGrant* grant)
  {
    v1::CreateBufferRequest r;
    r.set_name(name);
    r.set_pool_id(0);
    r.set_size(buffer_bytes);
    r.set_allow_writers(allow_writers);
    return rmmd::detail::impl_of(s_).stub().CreateBuffer(
        rmmd::detail::impl_of(s_).context().get(), r, grant);
  }
  grpc::Status set(std::uint64_t id, v1::BufferManifest const& m)
  {
    v1::SetBufferManifestRequest r;
    r.set_buffer_id(id);
    *r.mutable_manifest() = m;
    v1::SetBufferManifestResponse reply;
    return rmmd::detail::impl_of(s_).stub().SetBufferManifest(
        rmmd::detail::impl_of(s_).context().get(), r, &reply);
  }
  grpc::Status publish(std::uint64_t id)
  {
    v1::PublishBufferRequest r;
    r.set_buffer_id(id);
    v1::PublishBufferResponse reply;
    return rmmd::detail::impl_of(s_).stub().PublishBuffer(
        rmmd::detail::impl_of(s_).context().get(), r, &reply);
  }
  grpc::Status open(v1::OpenBufferRequest const& r, v1::BufferGrant* grant)
  {
    return rmmd::detail::impl_of(s_).stub().OpenBuffer(
        rmmd::detail::impl_of(s_).context().get(), r, grant);
  }
  grpc::Status describe(std::string const& name, v1::DescribeBufferResponse* reply)
  {
    v1::DescribeBufferRequest r;
    r.set_name(name);
    return rmmd::detail::impl_of(s_).stub().DescribeBuffer(
        rmmd::detail::impl_of(s_).context().get(), r, reply);
  }
  grpc::Status manifest(std::uint64_t id, v1::BufferManifest* reply)
  {
    v1::GetBufferManifestRequest r;
    r.set_buffer_id(id);
    return rmmd::detail::impl_of(s_).stub().GetBufferManifest(
        rmmd::detail::impl_of(s_).context().get(), r, reply);
  }
  std::vector<std::string> list(std::string prefix, std::map<std::string, std::string> labels = {})
  {
    v1::ListBuffersRequest r;
    r.set_name_prefix(prefix);
    for (auto const& [k, v] : labels) { add_label(r.mutable_labels(), k, v); }
    v1::ListBuffersResponse reply;
    auto status = rmmd::detail::impl_of(s_).stub().ListBuffers(
        rmmd::detail::impl_of(s_).context().get(), r, &reply);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<std::string> names;
    for (auto const& b : reply.buffers()) { names.push_back(b.name()); }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  rmmd::session s_;
};

bool same(v1::BufferManifest const& a, v1::BufferManifest const& b)
{
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

class BufferManifests : public ::testing::Test {
 protected:
  daemon_process daemon_{{"--host-pool-bytes", "64MiB", "--backend", "host"}};
  raw_session creator_{daemon_};
  raw_session other_{daemon_};
};

TEST_F(BufferManifests, SetThenDescribeGetAndOpenReturnIt)
{
  v1::BufferGrant grant;
  ASSERT_TRUE(creator_.create("models/tiny", false, &grant).ok());
  EXPECT_EQ(grant.access(), v1::BUFFER_ACCESS_READ_WRITE);
  auto const id = grant.buffer_id();
  auto status   = creator_.set(id, weights());
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_TRUE(creator_.publish(id).ok());

  v1::DescribeBufferResponse described;
  ASSERT_TRUE(other_.describe("models/tiny", &described).ok());
  EXPECT_TRUE(same(described.manifest(), weights())) << described.DebugString();
  EXPECT_EQ(described.info().tensor_count(), 3u);
  EXPECT_EQ(label_of(described.info().labels(), "model"), "tiny-gpt");
  EXPECT_FALSE(described.info().allow_writers());

  v1::OpenBufferRequest open;
  open.set_name("models/tiny");
  add_label(open.mutable_expect_labels(), "revision", "r1");
  v1::BufferGrant opened;
  ASSERT_TRUE(other_.open(open, &opened).ok());
  EXPECT_EQ(opened.access(), v1::BUFFER_ACCESS_READ);
  EXPECT_FALSE(opened.manifest_follows());  // gRPC carries it
  EXPECT_TRUE(same(opened.manifest(), weights()));
  v1::BufferManifest got;
  ASSERT_TRUE(other_.manifest(id, &got).ok());
  EXPECT_TRUE(same(got, weights()));
}

TEST_F(BufferManifests, RefusalsChangeNothing)
{
  v1::BufferGrant grant;
  ASSERT_TRUE(creator_.create("models/tiny", false, &grant).ok());
  auto const id = grant.buffer_id();
  ASSERT_TRUE(creator_.set(id, weights()).ok());
  auto const unchanged = [&] {
    v1::BufferManifest got;
    EXPECT_TRUE(creator_.manifest(id, &got).ok());
    return same(got, weights());
  };

  struct refusal {
    std::string what;
    v1::BufferManifest manifest;
    std::string says;
  };
  std::vector<refusal> refusals;
  auto m = weights();
  m.mutable_tensors(1)->set_byte_offset(8192);
  refusals.push_back({"overlap", m, "overlaps tensor 'layer0.w' (#1)"});
  m = weights();
  m.mutable_tensors(2)->set_byte_offset(buffer_bytes - 4);
  refusals.push_back({"past end", m, "run past the end of the buffer (1048576 bytes)"});
  m = weights();
  m.mutable_tensors(0)->clear_shape();
  m.mutable_tensors(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
  refusals.push_back({"malformed", m, "tensor 'embed' (#0): dtype UNSPECIFIED"});
  m = weights();
  m.mutable_tensors(2)->add_strides(1);
  refusals.push_back({"strides", m, "3 strides for 2 dimensions"});
  m = weights();
  add_label(m.mutable_labels(), "rmmd.gpu_uuid", "GPU-forged");
  refusals.push_back({"rmmd. label", m, "label key 'rmmd.gpu_uuid' starts with \"rmmd.\""});
  m = weights();
  for (int i = 0; i < 300; ++i) { add_label(m.mutable_labels(), "k" + std::to_string(i), "v"); }
  refusals.push_back({"too many labels", m, "302 labels; a manifest carries at most 256"});
  m = weights();
  add_label(m.mutable_labels(), "model", "another");
  refusals.push_back({"a key twice", m, "label 'model' is given twice"});
  m.Clear();
  // Past 4 MiB serialized, within what the gRPC socket accepts (4 MiB + 64 KiB).
  for (int i = 0; i < 4580; ++i) {
    *m.add_tensors() = tensor(std::string(900, 'a') + std::to_string(i), v1::DTYPE_UINT8, {1}, i);
  }
  refusals.push_back({"too large", m, "bytes serialized; a manifest is at most 4194304 bytes"});
  for (auto const& r : refusals) {
    auto status = creator_.set(id, r.manifest);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.what;
    EXPECT_THAT(status.error_message(), HasSubstr(r.says)) << r.what;
    EXPECT_TRUE(unchanged()) << r.what;
  }

  // Not its creator (another session of the same uid), then after publishing.
  v1::BufferManifest empty;
  auto status = other_.set(id, empty);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("only the session that created it"));
  ASSERT_TRUE(creator_.publish(id).ok());
  status = creator_.set(id, empty);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("published already"));
  EXPECT_TRUE(unchanged());
  // GetBufferManifest wants a session that holds the buffer.
  v1::BufferManifest got;
  EXPECT_EQ(other_.manifest(id, &got).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(BufferManifests, TheGuardAndReadWriteOpensHoldNothingWhenRefused)
{
  v1::BufferGrant ro, rw;
  ASSERT_TRUE(creator_.create("models/ro", false, &ro).ok());
  ASSERT_TRUE(creator_.create("models/rw", true, &rw).ok());
  ASSERT_TRUE(creator_.set(ro.buffer_id(), weights()).ok());
  ASSERT_TRUE(creator_.publish(ro.buffer_id()).ok());
  ASSERT_TRUE(creator_.publish(rw.buffer_id()).ok());
  auto holders = [&](std::string const& name) {
    v1::DescribeBufferResponse d;
    EXPECT_TRUE(creator_.describe(name, &d).ok());
    return d.info().holders();
  };

  v1::OpenBufferRequest open;
  open.set_name("models/ro");
  add_label(open.mutable_expect_labels(), "model", "tiny-gpt");
  add_label(open.mutable_expect_labels(), "revision", "r2");
  v1::BufferGrant grant;
  auto status = other_.open(open, &grant);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(status.error_message(), "buffer 'models/ro': label 'revision' is 'r1', expected 'r2'");
  open.mutable_expect_labels()->Clear();
  add_label(open.mutable_expect_labels(), "rank", "0");
  status = other_.open(open, &grant);
  EXPECT_EQ(status.error_message(), "buffer 'models/ro': has no label 'rank'");
  EXPECT_EQ(holders("models/ro"), 1u);

  open.mutable_expect_labels()->Clear();
  open.set_access(v1::BUFFER_ACCESS_READ_WRITE);
  status = other_.open(open, &grant);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("'models/ro' for writing"));
  EXPECT_EQ(holders("models/ro"), 1u);

  open.set_name("models/rw");
  ASSERT_TRUE(other_.open(open, &grant).ok());
  EXPECT_EQ(grant.access(), v1::BUFFER_ACCESS_READ_WRITE);
  EXPECT_EQ(holders("models/rw"), 2u);
}

TEST_F(BufferManifests, ListingByPrefixAndLabelsKeepsVisibility)
{
  v1::BufferGrant a, b, c;
  ASSERT_TRUE(creator_.create("team/a", false, &a).ok());
  ASSERT_TRUE(creator_.create("team/b", false, &b).ok());
  ASSERT_TRUE(creator_.create("solo/c", false, &c).ok());
  ASSERT_TRUE(creator_.set(a.buffer_id(), weights()).ok());
  ASSERT_TRUE(creator_.set(b.buffer_id(), weights()).ok());
  ASSERT_TRUE(creator_.publish(a.buffer_id()).ok());
  ASSERT_TRUE(creator_.publish(c.buffer_id()).ok());

  EXPECT_THAT(creator_.list("team/"), ElementsAre("team/a", "team/b"));
  EXPECT_THAT(creator_.list("", {{"model", "tiny-gpt"}}), ElementsAre("team/a", "team/b"));
  EXPECT_THAT(creator_.list("", {{"model", "tiny-gpt"}, {"revision", "r9"}}), ElementsAre());
  EXPECT_THAT(creator_.list("solo"), ElementsAre("solo/c"));
  if (::getuid() == 0) {
    // Root sees every buffer, unpublished ones of other sessions too; the
    // rule for other users (published ones only, those they may open) is
    // tests/core/buffer_manifests_test.cpp's.
    EXPECT_THAT(other_.list("team/"), ElementsAre("team/a", "team/b"));
    return;
  }
  EXPECT_THAT(other_.list("team/"), ElementsAre("team/a"));  // team/b is not published
  EXPECT_THAT(other_.list("", {{"model", "tiny-gpt"}}), ElementsAre("team/a"));
  EXPECT_THAT(other_.list(""), ElementsAre("solo/c", "team/a"));
  v1::DescribeBufferResponse d;
  EXPECT_EQ(other_.describe("team/b", &d).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(other_.describe("nothing", &d).error_code(), grpc::StatusCode::NOT_FOUND);
}

/// rmmctl with `args` against `d`: its exit status and stdout.
std::pair<int, std::string> rmmctl(daemon_process const& d, std::vector<std::string> args)
{
  std::vector<std::string> argv{
      program_path("rmmctl").string(), "--runtime-dir", d.runtime_dir().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  child_process p(argv, {}, {});
  p.close_stdin();
  auto out = p.read_all();
  return {p.wait().value_or(-1), out};
}

TEST_F(BufferManifests, RmmctlShowsAndFilters)
{
  v1::BufferGrant a, b;
  ASSERT_TRUE(creator_.create("models/tiny", false, &a).ok());
  ASSERT_TRUE(creator_.create("other/x", false, &b).ok());
  ASSERT_TRUE(creator_.set(a.buffer_id(), weights()).ok());
  ASSERT_TRUE(creator_.publish(a.buffer_id()).ok());
  ASSERT_TRUE(creator_.publish(b.buffer_id()).ok());

  auto [status, table] = rmmctl(daemon_, {"buffers", "show", "models/tiny"});
  ASSERT_EQ(status, 0) << table;
  EXPECT_THAT(table, HasSubstr("model     tiny-gpt"));
  EXPECT_THAT(table, HasSubstr("TENSORS (3)"));
  EXPECT_THAT(table, HasSubstr("NAME       DTYPE    SHAPE      OFFSET  BYTES  STRIDES  ALIASES"));
  EXPECT_THAT(table,
              HasSubstr("embed      float16  [128, 64]       0  16384  -        lm_head.weight"));
  EXPECT_THAT(table, HasSubstr("layer0.wT  float32  [64, 32]    32768   8192  [1, 64]  -"));

  auto [json_status, json] = rmmctl(daemon_, {"buffers", "show", "models/tiny", "--json"});
  ASSERT_EQ(json_status, 0) << json;
  v1::DescribeBufferResponse parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &parsed).ok()) << json;
  EXPECT_TRUE(same(parsed.manifest(), weights()));

  auto [list_status, listed] =
      rmmctl(daemon_, {"buffers", "--prefix", "models/", "--label", "model=tiny-gpt"});
  ASSERT_EQ(list_status, 0) << listed;
  EXPECT_THAT(listed, HasSubstr("models/tiny"));
  EXPECT_THAT(listed, HasSubstr("model=tiny-gpt,revision=r1"));
  EXPECT_THAT(listed, Not(HasSubstr("other/x")));
  auto [bad_status, bad] = rmmctl(daemon_, {"buffers", "--label", "novalue"});
  EXPECT_EQ(bad_status, 2) << bad;
  auto [missing_status, missing] = rmmctl(daemon_, {"buffers", "show", "nothing"});
  EXPECT_EQ(missing_status, 1) << missing;
}

// A model published one buffer per rank (rmmd.safetensors.publish_dir's
// NAME/rank<r>): `rmmctl buffers show NAME` shows each rank's tensors, in rank
// order (rank2 before rank10), and --json an array of them.
TEST_F(BufferManifests, RmmctlShowsAModelRankByRank)
{
  for (auto name : {"llama/rank10", "llama/rank2", "llama/extra", "llamas/rank0"}) {
    v1::BufferGrant g;
    ASSERT_TRUE(creator_.create(name, false, &g).ok()) << name;
    ASSERT_TRUE(creator_.set(g.buffer_id(), weights()).ok());
    ASSERT_TRUE(creator_.publish(g.buffer_id()).ok());
  }
  auto [status, text] = rmmctl(daemon_, {"buffers", "show", "llama"});
  ASSERT_EQ(status, 0) << text;
  auto const two = text.find("== llama/rank2\n");
  auto const ten = text.find("== llama/rank10\n");
  ASSERT_NE(two, std::string::npos) << text;
  ASSERT_NE(ten, std::string::npos) << text;
  EXPECT_LT(two, ten);
  EXPECT_THAT(text, Not(HasSubstr("llama/extra")));  // not a rank
  EXPECT_THAT(text, Not(HasSubstr("llamas/rank0")));
  EXPECT_THAT(text.substr(ten), HasSubstr("TENSORS (3)"));

  auto [json_status, json] = rmmctl(daemon_, {"buffers", "show", "llama", "--json"});
  ASSERT_EQ(json_status, 0) << json;
  ASSERT_TRUE(json.starts_with("[{") && json.ends_with("}]\n")) << json;
  // Each element is a DescribeBufferResponse (one line each, joined by ',').
  auto const split = json.find(R"(},{"info":)");
  ASSERT_NE(split, std::string::npos) << json;
  v1::DescribeBufferResponse first, second;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.substr(1, split), &first).ok());
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(
                  json.substr(split + 2, json.size() - split - 4), &second)
                  .ok());
  EXPECT_EQ(first.info().name(), "llama/rank2");
  EXPECT_EQ(second.info().name(), "llama/rank10");
  EXPECT_TRUE(same(second.manifest(), weights()));
  auto [missing_status, missing] = rmmctl(daemon_, {"buffers", "show", "llam"});
  EXPECT_EQ(missing_status, 1) << missing;  // neither a buffer nor a model's ranks
}

}  // namespace
}  // namespace rmmd::test
