// Manifests, the fingerprint guard, listing by prefix and label, and
// read-only opens, against the real daemon on its host pool: the C++ API
// (over both transports), the C ABI (librmmd_c), and processes that write
// through a read-only mapping (SIGSEGV in the writer only). The same on
// device memory: tests/gpu/read_only_buffer_test.cpp.

#include "tests/tools/daemon_process.hpp"
#include "tests/tools/pattern.hpp"

#include <rmmd/rmmd.h>
#include <rmmd/shared_buffer.hpp>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <csignal>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr std::size_t bytes = std::size_t{1} << 20;

/// Three tensors, one with an alias, and labels, inside `bytes`.
buffer_manifest gpt_manifest()
{
  return {.tensors = {{.name    = "wte",
                       .type    = dtype::float16,
                       .shape   = {256, 512},
                       .aliases = {"lm_head.weight"}},
                      {.name        = "ln_f.weight",
                       .type        = dtype::float32,
                       .shape       = {512},
                       .byte_offset = 262144},
                      {.name        = "attn.T",
                       .type        = dtype::bfloat16,
                       .shape       = {64, 32},
                       .byte_offset = 266240,
                       .strides     = {1, 64}}},
          .labels  = {{"model", "gpt2"}, {"revision", "abc123"}, {"rank", "0"}}};
}

void expect_same(buffer_manifest const& got, buffer_manifest const& want)
{
  ASSERT_EQ(got.tensors.size(), want.tensors.size());
  for (std::size_t i = 0; i < want.tensors.size(); ++i) {
    auto const &g = got.tensors[i], &w = want.tensors[i];
    EXPECT_EQ(g.name, w.name);
    EXPECT_EQ(g.type, w.type) << w.name;
    EXPECT_EQ(g.shape, w.shape) << w.name;
    EXPECT_EQ(g.byte_offset, w.byte_offset) << w.name;
    EXPECT_EQ(g.strides, w.strides) << w.name;
    EXPECT_EQ(g.aliases, w.aliases) << w.name;
  }
  EXPECT_EQ(got.labels, want.labels);
}

class BufferManifests : public ::testing::TestWithParam<call_transport> {
 protected:
  void SetUp() override
  {
    daemon_    = std::make_unique<daemon_process>();
    env_       = {"RMMD_RUNTIME_DIR=" + daemon_->runtime_dir().string()};
    auto stats = daemon_->stats();
    ASSERT_EQ(stats.pools(0).pool().backend(), v1::BACKEND_HOST);
    pool_ = stats.pools(0).pool().name();
  }

  session open(char const* name) const
  {
    return daemon_->open_session(name, GetParam());
  }
  std::uint32_t holders() const
  {
    return static_cast<std::uint32_t>(daemon_->stats().pools(0).shared_holders());
  }

  /// rmmd_share_client MODE ... on the host pool.
  std::unique_ptr<child_process> client(std::vector<std::string> args) const
  {
    std::vector<std::string> argv{program_path("rmmd_share_client").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--pool", pool_});
    if (GetParam() == call_transport::grpc) { argv.emplace_back("--grpc"); }
    return std::make_unique<child_process>(argv, env_);
  }

  std::unique_ptr<daemon_process> daemon_;
  std::vector<std::string> env_;
  std::string pool_;
};

TEST_P(BufferManifests, EveryOpenAndDescribeReturnsTheCreatorsManifest)
{
  auto creator  = open("creator");
  auto consumer = open("consumer");
  auto made     = shared_buffer::create(creator, "team/gpt2/w", bytes, {.pool = pool_});
  EXPECT_TRUE(made.manifest().empty());
  made.set_manifest(gpt_manifest());
  expect_same(made.manifest(), gpt_manifest());  // a host pool: no rmmd.gpu_uuid
  EXPECT_EQ(made.access(), buffer_access::read_write);
  made.publish();

  auto opened = shared_buffer::open(consumer, "team/gpt2/w", open_options{});
  EXPECT_EQ(opened.access(), buffer_access::read);
  expect_same(opened.manifest(), gpt_manifest());
  ASSERT_NE(opened.manifest().find("lm_head.weight"), nullptr);
  EXPECT_EQ(opened.manifest().find("lm_head.weight")->name, "wte");
  EXPECT_EQ(opened.manifest().find("attn.T")->byte_extent(), 2u * (1 + 63 + 31 * 64));

  auto [info, manifest] = shared_buffer::describe(consumer, "team/gpt2/w");
  EXPECT_EQ(info.name, "team/gpt2/w");
  EXPECT_EQ(info.id, made.id());
  EXPECT_EQ(info.size, bytes);
  EXPECT_EQ(info.pool, pool_);
  EXPECT_EQ(info.tensor_count, 3u);
  EXPECT_EQ(info.labels, gpt_manifest().labels);
  EXPECT_TRUE(info.published);
  EXPECT_FALSE(info.allow_writers);
  EXPECT_EQ(info.holders, 2u);
  expect_same(manifest, gpt_manifest());
  EXPECT_THROW(static_cast<void>(shared_buffer::describe(consumer, "team/none")),
               rmmd::not_found_error);
}

TEST_P(BufferManifests, AManifestFarLargerThanADatagramReachesEveryOpen)
{
  // 65,536 tensors of 16 bytes (about 1.5 MiB serialized): a session-socket
  // open gets it by GetBufferManifest, a gRPC one in its grant.
  auto creator = open("creator");
  auto made    = shared_buffer::create(creator, "w/large", bytes, {.pool = pool_});
  buffer_manifest large{.labels = {{"model", "large"}}};
  for (std::uint64_t i = 0; i < 65536; ++i) {
    large.tensors.push_back({.name        = "layers." + std::to_string(i) + ".weight",
                             .type        = dtype::float32,
                             .shape       = {4},
                             .byte_offset = 16 * i});
  }
  made.set_manifest(large);
  made.publish();
  auto opened = shared_buffer::open(open("consumer"), "w/large", open_options{});
  ASSERT_EQ(opened.manifest().tensors.size(), large.tensors.size());
  EXPECT_EQ(opened.manifest().tensors.back().name, "layers.65535.weight");
  EXPECT_EQ(opened.manifest().tensors.back().byte_offset, 16u * 65535u);
  EXPECT_EQ(shared_buffer::describe(open("lister"), "w/large").second.tensors.size(), 65536u);
}

TEST_P(BufferManifests, ListingFiltersByPrefixAndByEveryLabel)
{
  auto creator = open("creator");
  std::vector<shared_buffer> made;
  for (auto [name, rank] :
       {std::pair{"m/a/0", "0"}, {"m/a/1", "1"}, {"m/b/0", "0"}, {"other", "0"}}) {
    made.push_back(shared_buffer::create(creator, name, 4096, {.pool = pool_}));
    made.back().set_manifest({.labels = {{"rank", rank}, {"model", "gpt2"}}});
    made.back().publish();
  }
  auto names = [&](buffer_filter const& f) {
    std::vector<std::string> out;
    for (auto const& b : shared_buffer::list(open("lister"), f)) { out.push_back(b.name); }
    return out;
  };
  using ::testing::ElementsAre;
  using ::testing::UnorderedElementsAre;
  EXPECT_THAT(names({}), UnorderedElementsAre("m/a/0", "m/a/1", "m/b/0", "other"));
  EXPECT_THAT(names({.name_prefix = "m/a/"}), UnorderedElementsAre("m/a/0", "m/a/1"));
  EXPECT_THAT(names({.labels = {{"rank", "0"}}}), UnorderedElementsAre("m/a/0", "m/b/0", "other"));
  EXPECT_THAT(names({.name_prefix = "m/", .labels = {{"rank", "0"}, {"model", "gpt2"}}}),
              UnorderedElementsAre("m/a/0", "m/b/0"));
  EXPECT_THAT(names({.labels = {{"rank", "0"}, {"model", "llama"}}}), ElementsAre());
  EXPECT_THAT(names({.name_prefix = "nothing/"}), ElementsAre());
  auto all = shared_buffer::list(open("lister"), {.name_prefix = "m/a/1"});
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].labels.at("rank"), "1");
  EXPECT_EQ(all[0].tensor_count, 0u);
}

TEST_P(BufferManifests, TheFingerprintGuardRefusesTheFirstLabelThatDiffersAndHoldsNothing)
{
  auto creator = open("creator");
  auto made    = shared_buffer::create(creator, "w/guarded", bytes, {.pool = pool_});
  made.set_manifest(gpt_manifest());
  made.publish();
  auto consumer     = open("consumer");
  auto const before = holders();
  auto refused_with = [&](std::map<std::string, std::string, std::less<>> expect) {
    try {
      static_cast<void>(
          shared_buffer::open(consumer, "w/guarded", open_options{.expect_labels = expect}));
    } catch (rmmd::precondition_error const& e) {
      return std::string(e.what());
    }
    return std::string("(opened)");
  };
  // In key order: "model" < "rank" < "revision"; the first that differs.
  EXPECT_THAT(refused_with({{"revision", "def456"}, {"rank", "1"}}),
              HasSubstr("buffer 'w/guarded': label 'rank' is '0', expected '1'"));
  EXPECT_THAT(refused_with({{"quant", "fp8"}}),
              HasSubstr("buffer 'w/guarded': has no label 'quant'"));
  EXPECT_EQ(holders(), before);

  auto ok =
      shared_buffer::open(consumer,
                          "w/guarded",
                          open_options{.expect_labels = {{"revision", "abc123"}, {"rank", "0"}}});
  EXPECT_EQ(ok.size(), bytes);
  EXPECT_EQ(holders(), before + 1);
}

TEST_P(BufferManifests, ReadWriteOpensNeedTheCreatorsLeave)
{
  auto creator  = open("creator");
  auto consumer = open("consumer");
  auto kept     = shared_buffer::create(creator, "w/kept", 4096, {.pool = pool_});
  kept.publish();
  try {
    static_cast<void>(
        shared_buffer::open(consumer, "w/kept", open_options{.access = buffer_access::read_write}));
    ADD_FAILURE() << "a read-write open of a buffer without writers was allowed";
  } catch (rmmd::permission_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("w/kept"));
  }
  EXPECT_EQ(holders(), 1u);

  auto shared =
      shared_buffer::create(creator, "w/shared", 4096, {.pool = pool_, .allow_writers = true});
  fill(shared.data(), 4096, 1);
  shared.publish();
  auto writer =
      shared_buffer::open(consumer, "w/shared", open_options{.access = buffer_access::read_write});
  EXPECT_EQ(writer.access(), buffer_access::read_write);
  fill(writer.data(), 4096, 2);
  EXPECT_EQ(first_mismatch(shared.data(), 4096, 2), -1);  // the creator sees the write
  EXPECT_TRUE(shared_buffer::describe(consumer, "w/shared").first.allow_writers);
}

TEST_P(BufferManifests, ManifestsAreTheCreatorsToSetBeforePublishing)
{
  auto creator  = open("creator");
  auto consumer = open("consumer");
  auto made     = shared_buffer::create(creator, "w/rules", bytes, {.pool = pool_});

  auto overlapping                   = gpt_manifest();
  overlapping.tensors[1].byte_offset = 1024;  // inside wte
  try {
    made.set_manifest(overlapping);
    ADD_FAILURE() << "an overlapping table was taken";
  } catch (rmmd::logic_error const& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("wte"), HasSubstr("ln_f.weight")));
  }
  auto past_the_end                   = gpt_manifest();
  past_the_end.tensors[2].byte_offset = bytes - 2;
  try {
    made.set_manifest(past_the_end);
    ADD_FAILURE() << "a tensor past the buffer's end was taken";
  } catch (rmmd::logic_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("attn.T"));
  }
  try {
    made.set_manifest({.labels = {{"rmmd.gpu_uuid", "GPU-forged"}}});
    ADD_FAILURE() << "a creator set a label of the daemon's";
  } catch (rmmd::logic_error const& e) {
    EXPECT_THAT(e.what(), HasSubstr("rmmd.gpu_uuid"));
  }
  EXPECT_TRUE(made.manifest().empty());  // nothing refused was kept

  // A later set replaces the earlier one.
  made.set_manifest({.labels = {{"revision", "old"}}});
  made.set_manifest(gpt_manifest());
  expect_same(made.manifest(), gpt_manifest());
  made.publish();
  EXPECT_THROW(made.set_manifest({.labels = {{"revision", "new"}}}), rmmd::precondition_error);
  auto opened = shared_buffer::open(consumer, "w/rules");
  EXPECT_THROW(opened.set_manifest(gpt_manifest()), rmmd::precondition_error);
  expect_same(opened.manifest(), gpt_manifest());
}

TEST_P(BufferManifests, AReadOnlyHostOpenThatWritesDiesOfSigsegvAndOthersReadTheOriginalBytes)
{
  auto producer = client({"produce",
                          "w/ro",
                          std::to_string(bytes),
                          "7",
                          "--tensors",
                          "4",
                          "--label",
                          "model=pattern"});
  ASSERT_THAT(producer->read_line().value_or(""), StartsWith("created"));
  ASSERT_EQ(producer->read_line().value_or(""), "published");

  // The C++ API reads the manifest the producer set.
  auto shower = client({"show", "w/ro"});
  EXPECT_EQ(shower->read_line().value_or(""), "access read");
  EXPECT_EQ(shower->read_line().value_or(""), "tensor t0 float32 65536 0 262144 alias first");
  for (int i = 1; i < 4; ++i) {
    EXPECT_THAT(shower->read_line().value_or(""), StartsWith("tensor t" + std::to_string(i)));
  }
  EXPECT_EQ(shower->read_line().value_or(""), "label model=pattern");
  EXPECT_EQ(shower->read_line().value_or(""), "end");
  shower->close_stdin();
  EXPECT_EQ(shower->wait(), 0);

  auto reader = shared_buffer::open(open("reader"), "w/ro");
  ASSERT_EQ(first_mismatch(reader.data(), bytes, 7), -1);

  auto writer = client({"write", "w/ro", std::to_string(bytes), "8"});
  EXPECT_EQ(writer->read_line(), std::nullopt);  // never says "written"
  EXPECT_EQ(writer->wait(), 128 + SIGSEGV);
  EXPECT_EQ(first_mismatch(reader.data(), bytes, 7), -1);

  // A read-write open of a buffer without writers is refused before any
  // mapping.
  auto refused = client({"write", "w/ro", std::to_string(bytes), "8", "--writable"});
  EXPECT_THAT(refused->read_line().value_or(""), StartsWith("error permission"));
  EXPECT_EQ(refused->wait(), 2);

  auto consumer = client({"consume", "w/ro", std::to_string(bytes), "7"});
  EXPECT_THAT(consumer->read_line().value_or(""), StartsWith("verified"));
  consumer->close_stdin();
  EXPECT_EQ(consumer->read_line(), "intact");
  EXPECT_EQ(consumer->wait(), 0);
  producer->close_stdin();
  EXPECT_EQ(producer->wait(), 0);
}

TEST_P(BufferManifests, AWriterOfABufferThatAllowsWritersChangesWhatEveryoneReads)
{
  auto producer = client({"produce", "w/rw", std::to_string(bytes), "7", "--allow-writers"});
  ASSERT_THAT(producer->read_line().value_or(""), StartsWith("created"));
  ASSERT_EQ(producer->read_line().value_or(""), "published");
  auto reader = shared_buffer::open(open("reader"), "w/rw");
  auto writer = client({"write", "w/rw", std::to_string(bytes), "8", "--writable"});
  EXPECT_EQ(writer->read_line().value_or(""), "written");
  EXPECT_EQ(first_mismatch(reader.data(), bytes, 8), -1);
  writer->close_stdin();
  EXPECT_EQ(writer->read_line(), "intact");
  EXPECT_EQ(writer->wait(), 0);
  producer->close_stdin();
  EXPECT_EQ(producer->wait(), 0);
}

TEST_P(BufferManifests, OneProcessHoldingABufferBothWaysHasTwoMappings)
{
  auto creator = open("creator");
  auto made =
      shared_buffer::create(creator, "w/both", 4096, {.pool = pool_, .allow_writers = true});
  fill(made.data(), 4096, 3);
  made.publish();
  auto s          = open("both");
  auto reader     = shared_buffer::open(s, "w/both");
  auto reader_too = shared_buffer::open(s, "w/both");
  auto writer = shared_buffer::open(s, "w/both", open_options{.access = buffer_access::read_write});
  EXPECT_EQ(reader.data(), reader_too.data());  // one view per access
  EXPECT_NE(reader.data(), writer.data());
  EXPECT_EQ(reader.access(), buffer_access::read);
  EXPECT_EQ(writer.access(), buffer_access::read_write);
  fill(writer.data(), 4096, 4);
  EXPECT_EQ(first_mismatch(reader.data(), 4096, 4), -1);
  // The read-write view goes with its open; the read-only one stays.
  writer.close();
  EXPECT_EQ(first_mismatch(reader_too.data(), 4096, 4), -1);
  reader.close();
  EXPECT_EQ(first_mismatch(reader_too.data(), 4096, 4), -1);
}

INSTANTIATE_TEST_SUITE_P(Transports,
                         BufferManifests,
                         ::testing::Values(call_transport::session_socket, call_transport::grpc),
                         [](auto const& info) {
                           return info.param == call_transport::grpc ? "Grpc" : "SessionSocket";
                         });

// ---- the C ABI ---------------------------------------------------------------

/// A string the C ABI allocated.
struct c_string {
  char* s{};
  ~c_string()
  {
    rmmd_string_free(s);
  }
  [[nodiscard]] std::string str() const
  {
    return s != nullptr ? s : "";
  }
};

class BufferManifestsInC : public ::testing::Test {
 protected:
  void SetUp() override
  {
    daemon_   = std::make_unique<daemon_process>();
    dir_      = daemon_->runtime_dir().string();
    auto stat = daemon_->stats();
    pool_     = stat.pools(0).pool().name();
    creator_  = session("creator");
    consumer_ = session("consumer");
  }
  void TearDown() override
  {
    rmmd_session_destroy(consumer_);
    rmmd_session_destroy(creator_);
  }
  rmmd_session_t session(char const* name) const
  {
    rmmd_session_options o{};
    o.size        = sizeof(o);
    o.runtime_dir = dir_.c_str();
    o.client_name = name;
    rmmd_session_t s{};
    EXPECT_EQ(rmmd_session_create(&o, &s), RMMD_SUCCESS) << rmmd_last_error_message();
    return s;
  }
  rmmd_buffer_t create(char const* name, bool allow_writers) const
  {
    rmmd_buffer_options o{};
    o.size          = sizeof(o);
    o.pool          = pool_.c_str();
    o.device        = -1;
    o.allow_writers = allow_writers ? 1 : 0;
    rmmd_buffer_t b{};
    EXPECT_EQ(rmmd_buffer_create(creator_, name, 4096, &o, &b), RMMD_SUCCESS)
        << rmmd_last_error_message();
    return b;
  }

  std::unique_ptr<daemon_process> daemon_;
  std::string dir_;
  std::string pool_;
  rmmd_session_t creator_{};
  rmmd_session_t consumer_{};
};

TEST_F(BufferManifestsInC, ManifestsGoInAndComeOutAsProtobufJson)
{
  auto* made = create("c/w", false);
  // Both spellings protobuf's JSON mapping reads, and 64-bit numbers as
  // strings or numbers.
  char const* json = R"({"tensors": [
      {"name": "wte", "dtype": "DTYPE_FLOAT16", "shape": ["32", "32"], "byteOffset": "0",
       "aliases": ["lm_head"]},
      {"name": "b", "dtype": "DTYPE_INT64", "shape": [4], "byte_offset": 2048}],
    "labels": [{"key": "model", "value": "tiny"}, {"key": "rank", "value": "0"}]})";
  ASSERT_EQ(rmmd_buffer_set_manifest_json(made, json), RMMD_SUCCESS) << rmmd_last_error_message();
  ASSERT_EQ(rmmd_buffer_publish(made), RMMD_SUCCESS) << rmmd_last_error_message();

  rmmd_buffer_t opened{};
  ASSERT_EQ(rmmd_buffer_open_with(consumer_, "c/w", nullptr, &opened), RMMD_SUCCESS)
      << rmmd_last_error_message();
  rmmd_buffer_access access{RMMD_BUFFER_READ_WRITE};
  EXPECT_EQ(rmmd_buffer_access_mode(opened, &access), RMMD_SUCCESS);
  EXPECT_EQ(access, RMMD_BUFFER_READ);
  EXPECT_EQ(rmmd_buffer_access_mode(made, &access), RMMD_SUCCESS);
  EXPECT_EQ(access, RMMD_BUFFER_READ_WRITE);

  c_string manifest;
  ASSERT_EQ(rmmd_buffer_manifest_json(opened, &manifest.s), RMMD_SUCCESS);
  // The proto's field names, every field printed (an offset of 0 too).
  EXPECT_THAT(manifest.str(),
              AllOf(HasSubstr(R"("name":"wte")"),
                    HasSubstr(R"("dtype":"DTYPE_FLOAT16")"),
                    HasSubstr(R"("shape":["32","32"])"),
                    HasSubstr(R"("byte_offset":"0")"),
                    HasSubstr(R"("aliases":["lm_head"])"),
                    HasSubstr(R"("byte_offset":"2048")"),
                    HasSubstr(R"("strides":[])"),
                    HasSubstr(R"({"key":"model","value":"tiny"})")));

  c_string listed;
  char const* rank_key = "rank";
  char const* rank_0   = "0";
  char const* rank_1   = "1";
  ASSERT_EQ(rmmd_buffer_list_json(consumer_, "c/", &rank_key, &rank_0, 1, &listed.s), RMMD_SUCCESS)
      << rmmd_last_error_message();
  EXPECT_THAT(listed.str(), AllOf(HasSubstr(R"("name":"c/w")"), HasSubstr(R"("tensor_count":2)")));
  c_string none;
  ASSERT_EQ(rmmd_buffer_list_json(consumer_, nullptr, &rank_key, &rank_1, 1, &none.s),
            RMMD_SUCCESS);
  EXPECT_THAT(none.str(), ::testing::Not(HasSubstr("c/w")));

  c_string described;
  ASSERT_EQ(rmmd_buffer_describe_json(consumer_, "c/w", &described.s), RMMD_SUCCESS)
      << rmmd_last_error_message();
  EXPECT_THAT(described.str(),
              AllOf(HasSubstr(R"("info":{)"),
                    HasSubstr(R"("manifest":{)"),
                    HasSubstr(R"("aliases":["lm_head"])"),
                    HasSubstr(R"("tensor_count":2)")));
  c_string missing;
  EXPECT_EQ(rmmd_buffer_describe_json(consumer_, "c/none", &missing.s), RMMD_ERROR_NOT_FOUND);

  EXPECT_EQ(rmmd_buffer_close(opened, nullptr), RMMD_SUCCESS);
  EXPECT_EQ(rmmd_buffer_close(made, nullptr), RMMD_SUCCESS);
}

TEST_F(BufferManifestsInC, BadJsonAndRefusalsAreNamed)
{
  auto* made = create("c/bad", false);
  EXPECT_EQ(
      rmmd_buffer_set_manifest_json(made, R"({"tensors": [{"name": "x", "dtype": "DTYPE_NOPE"}]})"),
      RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(), AllOf(HasSubstr("c/bad"), HasSubstr("DTYPE_NOPE")));
  EXPECT_EQ(rmmd_buffer_set_manifest_json(made, "{\"tensors\": ["), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("bad JSON"));
  EXPECT_EQ(rmmd_buffer_set_manifest_json(made, R"({"labels": [{"key": "rmmd.x", "value": "1"}]})"),
            RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("rmmd.x"));
  ASSERT_EQ(
      rmmd_buffer_set_manifest_json(made, R"({"labels": [{"key": "revision", "value": "abc"}]})"),
      RMMD_SUCCESS)
      << rmmd_last_error_message();
  ASSERT_EQ(rmmd_buffer_publish(made), RMMD_SUCCESS);

  char const* revision     = "revision";
  char const* revisions[2] = {"revision", "revision"};
  char const* def          = "def";
  char const* abc          = "abc";
  char const* both[2]      = {"abc", "def"};
  rmmd_open_options o{};
  o.size          = sizeof(o);
  o.expect_keys   = &revision;
  o.expect_values = &def;
  o.expect_count  = 1;
  rmmd_buffer_t b{};
  EXPECT_EQ(rmmd_buffer_open_with(consumer_, "c/bad", &o, &b), RMMD_ERROR_FAILED_PRECONDITION);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("label 'revision' is 'abc', expected 'def'"));
  o.expect_keys   = revisions;  // a key twice
  o.expect_values = both;
  o.expect_count  = 2;
  EXPECT_EQ(rmmd_buffer_open_with(consumer_, "c/bad", &o, &b), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("'revision' is given twice"));
  o.expect_values = nullptr;  // with a count: refused, not read
  o.expect_count  = 1;
  EXPECT_EQ(rmmd_buffer_open_with(consumer_, "c/bad", &o, &b), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("NULL"));
  o.expect_count = 0;
  o.access       = RMMD_BUFFER_READ_WRITE;
  EXPECT_EQ(rmmd_buffer_open_with(consumer_, "c/bad", &o, &b), RMMD_ERROR_PERMISSION_DENIED);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("c/bad"));
  o.access = static_cast<rmmd_buffer_access>(7);
  EXPECT_EQ(rmmd_buffer_open_with(consumer_, "c/bad", &o, &b), RMMD_ERROR_INVALID_ARGUMENT);
  o.access        = RMMD_BUFFER_READ;
  o.expect_keys   = &revision;
  o.expect_values = &abc;
  o.expect_count  = 1;
  ASSERT_EQ(rmmd_buffer_open_with(consumer_, "c/bad", &o, &b), RMMD_SUCCESS)
      << rmmd_last_error_message();
  EXPECT_EQ(rmmd_buffer_close(b, nullptr), RMMD_SUCCESS);
  EXPECT_EQ(rmmd_buffer_close(made, nullptr), RMMD_SUCCESS);
}

TEST_F(BufferManifestsInC, AllowWritersIsReadOnlyFromCallersWhoseOptionsHaveIt)
{
  // A caller built before allow_writers: its size stops before the field,
  // whatever the memory after it holds.
  rmmd_buffer_options o{};
  std::memset(&o, 0xff, sizeof(o));
  o.size       = offsetof(rmmd_buffer_options, allow_writers);
  o.pool       = pool_.c_str();
  o.device     = -1;
  o.persistent = 0;
  o.has_gid    = 0;
  o.alignment  = 0;
  rmmd_buffer_t old{};
  ASSERT_EQ(rmmd_buffer_create(creator_, "c/old", 4096, &o, &old), RMMD_SUCCESS)
      << rmmd_last_error_message();
  ASSERT_EQ(rmmd_buffer_publish(old), RMMD_SUCCESS);
  auto* now = create("c/new", true);
  ASSERT_EQ(rmmd_buffer_publish(now), RMMD_SUCCESS);

  rmmd_open_options w{};
  w.size   = sizeof(w);
  w.access = RMMD_BUFFER_READ_WRITE;
  rmmd_buffer_t b{};
  EXPECT_EQ(rmmd_buffer_open_with(consumer_, "c/old", &w, &b), RMMD_ERROR_PERMISSION_DENIED);
  ASSERT_EQ(rmmd_buffer_open_with(consumer_, "c/new", &w, &b), RMMD_SUCCESS)
      << rmmd_last_error_message();
  rmmd_buffer_access access{};
  EXPECT_EQ(rmmd_buffer_access_mode(b, &access), RMMD_SUCCESS);
  EXPECT_EQ(access, RMMD_BUFFER_READ_WRITE);
  o.size = 3;  // no size any rmmd.h had
  rmmd_buffer_t bad{};
  EXPECT_EQ(rmmd_buffer_create(creator_, "c/odd", 4096, &o, &bad), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(rmmd_buffer_close(b, nullptr), RMMD_SUCCESS);
  EXPECT_EQ(rmmd_buffer_close(now, nullptr), RMMD_SUCCESS);
  EXPECT_EQ(rmmd_buffer_close(old, nullptr), RMMD_SUCCESS);
}

TEST_F(BufferManifestsInC, PinIsReadOnlyFromCallersWhoseOptionsHaveItAndAnUnknownValueIsRefused)
{
  // A caller built before pin (0.8): its size stops at the field, whatever
  // the memory after it holds, and it gets the automatic page-locking.
  rmmd_buffer_options o{};
  std::memset(&o, 0xff, sizeof(o));
  o.size          = offsetof(rmmd_buffer_options, pin);
  o.pool          = pool_.c_str();
  o.device        = -1;
  o.persistent    = 0;
  o.has_gid       = 0;
  o.alignment     = 0;
  o.allow_writers = 0;
  rmmd_buffer_t made{};
  ASSERT_EQ(rmmd_buffer_create(creator_, "c/pin", 4096, &o, &made), RMMD_SUCCESS)
      << rmmd_last_error_message();
  ASSERT_EQ(rmmd_buffer_publish(made), RMMD_SUCCESS);
  o.size = sizeof(o);
  o.pin  = static_cast<rmmd_pinning>(7);
  rmmd_buffer_t bad{};
  EXPECT_EQ(rmmd_buffer_create(creator_, "c/pin2", 4096, &o, &bad), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(),
              HasSubstr("create buffer 'c/pin2': options->pin is 7, none of "
                        "RMMD_PINNING_AUTOMATIC, _REQUIRED or _OFF"));

  rmmd_open_options w{};
  std::memset(&w, 0xff, sizeof(w));
  w.size          = offsetof(rmmd_open_options, pin);
  w.wait_ms       = 0;
  w.access        = RMMD_BUFFER_READ;
  w.expect_keys   = nullptr;
  w.expect_values = nullptr;
  w.expect_count  = 0;
  w.peer          = nullptr;
  w.has_device    = 0;
  w.exclusive     = 0;
  w.standby       = 0;
  rmmd_buffer_t b{};
  ASSERT_EQ(rmmd_buffer_open_with(consumer_, "c/pin", &w, &b), RMMD_SUCCESS)
      << rmmd_last_error_message();
  EXPECT_EQ(rmmd_buffer_close(b, nullptr), RMMD_SUCCESS);
  w.size = sizeof(w);
  w.pin  = static_cast<rmmd_pinning>(-1);
  EXPECT_EQ(rmmd_buffer_open_with(consumer_, "c/pin", &w, &b), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(),
              HasSubstr("open buffer 'c/pin': options->pin is -1, none of"));
  // Asked for a plain mapping: not page-locked, with a GPU or without.
  w.pin = RMMD_PINNING_OFF;
  ASSERT_EQ(rmmd_buffer_open_with(consumer_, "c/pin", &w, &b), RMMD_SUCCESS)
      << rmmd_last_error_message();
  int pinned = -1;
  EXPECT_EQ(rmmd_buffer_pinned(b, &pinned), RMMD_SUCCESS);
  EXPECT_EQ(pinned, 0);
  EXPECT_EQ(rmmd_buffer_pinned(b, nullptr), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(rmmd_buffer_close(b, nullptr), RMMD_SUCCESS);
  std::size_t holders = 0;
  EXPECT_EQ(rmmd_buffer_delete(creator_, "c/pin", &holders), RMMD_SUCCESS);
  EXPECT_EQ(holders, 1u);  // the creator alone: no refused open kept a hold
  EXPECT_EQ(rmmd_buffer_close(made, nullptr), RMMD_SUCCESS);
}

TEST_F(BufferManifestsInC, DeviceIsACheckForThisNodesBuffersAndZeroedOptionsKeepTheCurrentDevice)
{
  auto* made = create("c/dev", false);
  ASSERT_EQ(rmmd_buffer_publish(made), RMMD_SUCCESS);
  rmmd_open_options o{};
  o.size       = sizeof(o);
  o.has_device = 1;
  o.device     = 0;
  rmmd_buffer_t b{};
  // A host pool's buffer is on no GPU: refused, and nothing stays open.
  EXPECT_EQ(rmmd_buffer_open_with(consumer_, "c/dev", &o, &b), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(),
              AllOf(HasSubstr("open buffer 'c/dev': it is in host pool '" + pool_ +
                              "', on no GPU, not on device 0"),
                    HasSubstr("open it without device")));
  o.device = -1;
  EXPECT_EQ(rmmd_buffer_open_with(consumer_, "c/dev", &o, &b), RMMD_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(rmmd_last_error_message(), HasSubstr("options->device is -1 with has_device set"));
  // Zeroed options (has_device 0) and a caller built before has_device,
  // whatever its memory after the fields it knows holds: the current device,
  // which a host buffer ignores.
  o      = rmmd_open_options{};
  o.size = sizeof(o);
  ASSERT_EQ(rmmd_buffer_open_with(consumer_, "c/dev", &o, &b), RMMD_SUCCESS)
      << rmmd_last_error_message();
  EXPECT_EQ(rmmd_buffer_close(b, nullptr), RMMD_SUCCESS);
  std::memset(&o, 0xff, sizeof(o));
  o.size          = offsetof(rmmd_open_options, has_device);
  o.wait_ms       = 0;
  o.access        = RMMD_BUFFER_READ;
  o.expect_keys   = nullptr;
  o.expect_values = nullptr;
  o.expect_count  = 0;
  o.peer          = nullptr;
  ASSERT_EQ(rmmd_buffer_open_with(consumer_, "c/dev", &o, &b), RMMD_SUCCESS)
      << rmmd_last_error_message();
  EXPECT_EQ(rmmd_buffer_close(b, nullptr), RMMD_SUCCESS);
  std::size_t holders = 0;
  EXPECT_EQ(rmmd_buffer_delete(creator_, "c/dev", &holders), RMMD_SUCCESS);
  EXPECT_EQ(holders, 1u);  // the creator alone: no refused open kept a hold
  EXPECT_EQ(rmmd_buffer_close(made, nullptr), RMMD_SUCCESS);
}

TEST_F(BufferManifestsInC, ABufferOfAnotherNodeInAProcessThatSeesNoGpuIsRefusedBeforeAnyRequest)
{
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0) {
    GTEST_SKIP() << "this process sees " << gpus << " GPU(s): the case is one without any";
  }
  cudaGetLastError();
  // No daemon peers with nodeA here: the refusal comes before it is asked.
  for (int has_device : {0, 1}) {
    rmmd_open_options o{};
    o.size       = sizeof(o);
    o.has_device = has_device;
    o.device     = 0;
    rmmd_buffer_t b{};
    EXPECT_EQ(rmmd_buffer_open_with(consumer_, "nodeA:w", &o, &b), RMMD_ERROR_INVALID_ARGUMENT);
    EXPECT_THAT(rmmd_last_error_message(),
                StartsWith("rmmd: open buffer 'nodeA:w': a buffer of another node is mapped on "
                           "a GPU, and this process sees none (cudaError"));
  }
}

}  // namespace
}  // namespace rmmd::test
