// Writes the fuzzers' seed corpora (tests/fuzz/corpus/<fuzzer>/) from real
// messages: hellos, calls and requests built with the protocol's own types,
// and the welcome and replies that a real core answers to them through the
// daemon's own code. Deterministic, so the files in the tree are what it
// writes: rerun it after a protocol change.
//
//   build-fuzz/tests/fuzz/rmmd_fuzz_corpus tests/fuzz/corpus
//
// The config corpus is text, kept by hand (corpus/config/).

#include "daemon/session/session_protocol.hpp"
#include "rmmd/v1/rmmd.pb.h"
#include "tests/fuzz/fuzz_input.hpp"
#include "tests/fuzz/service_methods.hpp"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

namespace {

using namespace rmmd;
namespace fs = std::filesystem;
using fuzz::append_record;

void write(fs::path const& dir, std::string const& name, std::string const& bytes)
{
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::string hello(std::uint32_t version = 1, std::string name = "seed")
{
  v1::SessionHello h;
  h.set_protocol_version(version);
  h.set_client_name(std::move(name));
  return h.SerializeAsString();
}

std::string allocate(std::uint64_t tag, std::uint32_t pool, std::uint64_t size, std::uint64_t align)
{
  v1::SessionCall c;
  c.set_tag(tag);
  c.mutable_allocate()->set_pool_id(pool);
  c.mutable_allocate()->set_size(size);
  c.mutable_allocate()->set_alignment(align);
  return c.SerializeAsString();
}

std::string free_call(std::uint64_t tag,
                      std::uint64_t id,
                      bool quiet        = false,
                      std::string event = {})
{
  v1::SessionCall c;
  c.set_tag(tag);
  c.mutable_free()->set_allocation_id(id);
  if (!event.empty()) { c.mutable_free()->set_removed_release_event(event); }
  c.set_reply_only_on_error(quiet);
  return c.SerializeAsString();
}

std::string ping(std::uint64_t tag)
{
  v1::SessionCall c;
  c.set_tag(tag);
  c.mutable_ping();
  return c.SerializeAsString();
}

/// The session fuzzer's input: [peer byte] hello, calls.
std::string session_input(bool allowed, std::string const& h, std::vector<std::string> const& calls)
{
  std::string out(1, allowed ? '\x01' : '\x00');
  append_record(out, h);
  for (auto const& c : calls) { append_record(out, c); }
  return out;
}

std::string buffer_call(std::uint64_t tag, int kind, std::string name, std::uint64_t id = 0)
{
  v1::SessionCall c;
  c.set_tag(tag);
  switch (kind) {
    case 0:  // create, persistent
      c.mutable_create_buffer()->set_name(name);
      c.mutable_create_buffer()->set_pool_id(0);
      c.mutable_create_buffer()->set_size(65536);
      c.mutable_create_buffer()->set_persistent(true);
      break;
    case 1:
      c.mutable_publish_buffer()->set_buffer_id(id);
      c.set_reply_only_on_error(true);
      break;
    case 2:
      c.mutable_open_buffer()->set_name(name);
      break;
    case 3:
      c.mutable_close_buffer()->set_buffer_id(id);
      c.set_reply_only_on_error(true);
      break;
    default:
      c.mutable_buffer_fd()->set_buffer_id(id);
  }
  return c.SerializeAsString();
}

void session_corpus(fs::path const& dir)
{
  write(dir,
        "shared_buffers",
        session_input(true,
                      hello(),
                      {buffer_call(1, 0, "team/w0"),
                       buffer_call(2, 2, "team/w0"),
                       buffer_call(3, 1, "team/w0", 1),
                       buffer_call(4, 2, "team/w0"),
                       buffer_call(5, 3, "team/w0", 1),
                       buffer_call(6, 4, "team/w0", 1),
                       buffer_call(7, 0, "bad//name"),
                       buffer_call(8, 1, "", 99)}));
  write(dir,
        "allocate_free_ping",
        session_input(true,
                      hello(),
                      {allocate(1, 0, 4096, 0),
                       allocate(2, 1, 65536, 65536),
                       free_call(3, 1),
                       free_call(4, 2, true),
                       ping(5)}));
  write(dir,
        "quota_and_pool_limits",
        session_input(true,
                      hello(1, "greedy"),
                      {allocate(1, 0, 3 << 20, 256),
                       allocate(2, 0, 1 << 20, 256),
                       allocate(3, 1, 1 << 20, 4096),
                       allocate(4, 0, 5 << 20, 256),
                       free_call(5, 1),
                       allocate(6, 0, 2 << 20, 1 << 21)}));
  write(dir,
        "bad_calls",
        session_input(true,
                      hello(),
                      {allocate(1, 7, 4096, 256),
                       allocate(2, 0, 0, 256),
                       allocate(3, 0, 4096, 3),
                       free_call(4, 99),
                       allocate(5, 0, 4096, 256),
                       free_call(6, 1, false, std::string(64, 'e')),
                       free_call(7, 1, true, std::string(64, 'e')),
                       std::string(),
                       std::string("\xff\xff\xff", 3),
                       std::string(5000, 'x')}));
  write(dir, "refused_uid", session_input(false, hello(), {ping(1)}));
  write(dir, "other_version", session_input(true, hello(2), {ping(1)}));
  write(dir, "not_a_hello", session_input(true, std::string("\x0a\x05", 2), {}));
}

/// The service fuzzer's input: records of [method][token] request.
struct request {
  std::string_view method;  // the gRPC method's name
  int token;                // 0 first session, 1 second, 2 a wrong token, 3 none
  std::string bytes;
};

std::string service_input(std::vector<request> const& requests)
{
  std::string out;
  for (auto const& r : requests) {
    out.push_back(static_cast<char>(fuzz::method_byte(r.method)));
    out.push_back(static_cast<char>(r.token));
    append_record(out, r.bytes);
  }
  return out;
}

void service_corpus(fs::path const& dir)
{
  v1::AllocateRequest a;
  a.set_pool_id(0);
  a.set_size(4096);
  a.set_alignment(256);
  v1::AllocateRequest pinned;
  pinned.set_pool_id(1);
  pinned.set_size(1 << 16);
  pinned.set_alignment(1 << 16);
  v1::FreeRequest f;
  f.set_allocation_id(1);
  v1::UsageReport usage;
  auto* u = usage.add_pools();
  u->set_pool_id(0);
  u->set_bytes(1024);
  u->set_allocation_count(2);
  v1::UsageReport twice = usage;
  *twice.add_pools()    = *u;
  v1::TrimRequest trim;
  trim.add_pool_ids(0);
  trim.add_pool_ids(1);
  v1::TrimRequest trim_unknown;
  trim_unknown.add_pool_ids(9);

  write(dir,
        "lease_round_trip",
        service_input({{"Allocate", 0, a.SerializeAsString()},
                       {"Allocate", 0, pinned.SerializeAsString()},
                       {"ReportUsage", 0, usage.SerializeAsString()},
                       {"GetStats", 0, ""},
                       {"Free", 1, f.SerializeAsString()},
                       {"Free", 0, f.SerializeAsString()},
                       {"Free", 0, f.SerializeAsString()}}));
  write(dir,
        "views",
        service_input({{"Allocate", 1, a.SerializeAsString()},
                       {"ListSessions", 0, ""},
                       {"ListPools", 1, ""},
                       {"Health", 3, ""},
                       {"Trim", 0, trim.SerializeAsString()},
                       {"Trim", 0, trim_unknown.SerializeAsString()},
                       {"Trim", 0, ""}}));
  write(dir,
        "unauthenticated",
        service_input({{"Allocate", 2, a.SerializeAsString()},
                       {"Free", 3, f.SerializeAsString()},
                       {"GetStats", 3, ""},
                       {"ReportUsage", 2, usage.SerializeAsString()}}));
  write(dir,
        "bad_usage_reports",
        service_input({{"Allocate", 0, a.SerializeAsString()},
                       {"ReportUsage", 0, twice.SerializeAsString()},
                       {"ReportUsage", 1, usage.SerializeAsString()},
                       {"ReportUsage", 0, std::string("\x0a\x04\x08\x05\x10\x01", 6)}}));

  v1::CreateBufferRequest create;
  create.set_name("team/seed");
  create.set_size(4096);
  create.set_persistent(true);
  v1::PublishBufferRequest publish;
  publish.set_buffer_id(1);
  v1::OpenBufferRequest open;
  open.set_name("team/seed");
  v1::DescribeBufferRequest describe;
  describe.set_name("team/seed");
  v1::CloseBufferRequest close;
  close.set_buffer_id(1);
  v1::DeleteBufferRequest remove;
  remove.set_name("team/seed");
  write(dir,
        "buffers",
        service_input({{"CreateBuffer", 0, create.SerializeAsString()},
                       {"PublishBuffer", 0, publish.SerializeAsString()},
                       {"OpenBuffer", 1, open.SerializeAsString()},
                       {"DescribeBuffer", 1, describe.SerializeAsString()},
                       {"ListBuffers", 1, ""},
                       {"CloseBuffer", 1, close.SerializeAsString()},
                       {"DeleteBuffer", 0, remove.SerializeAsString()},
                       {"ListPeers", 0, ""}}));
}

/// The client fuzzer's input: [mode][param] message.
std::string client_input(int mode, int param, std::string const& message)
{
  std::string out;
  out.push_back(static_cast<char>(mode));
  out.push_back(static_cast<char>(param));
  return out + message;
}

void client_corpus(fs::path const& dir)
{
  auto core = fuzz::make_host_core();
  core::peer_credentials const peer{
      .pid = 4242, .uid = fuzz::allowed_uid(), .gid = 4242, .supplementary_gids = {}};
  auto welcome =
      session_socket::handle_hello(*core, {.bytes = hello(), .truncated = false}, peer, "seed", {});
  // The token is random: a fixed one keeps the file the same on every run.
  v1::SessionWelcome w;
  w.ParseFromString(welcome.message);
  w.set_token(std::string(16, '\x5a'));
  write(
      dir, "welcome", client_input(0, static_cast<int>(welcome.fds.size()), w.SerializeAsString()));
  auto refused = session_socket::handle_hello(
      *core, {.bytes = hello(), .truncated = false}, {.uid = fuzz::refused_uid}, "seed", {});
  write(dir, "welcome_refused", client_input(0, 0, refused.message));
  write(dir,
        "welcome_bad_version",
        client_input(
            0,
            0,
            session_socket::handle_hello(*core, {.bytes = hello(3)}, peer, "seed", {}).message));

  auto const id    = welcome.grant->id;
  auto const reply = [&](std::string const& call) {
    return *session_socket::handle_call(*core, id, {.bytes = call}, 4096, nullptr);
  };
  write(dir, "reply_allocate_host", client_input(3, 1, reply(allocate(7, 0, 1000, 256))));
  // Past the first allocation: a lease whose offset is not 0 (an offset of
  // 0 is not on the wire at all, so the fuzzer would have to invent it).
  write(dir, "reply_allocate_host_offset", client_input(3, 1, reply(allocate(7, 0, 1000, 256))));
  write(dir, "reply_allocate_pinned", client_input(3, 1, reply(allocate(7, 1, 4096, 4096))));
  write(dir, "reply_free", client_input(1, 2, reply(free_call(7, 1))));
  write(dir, "reply_ping", client_input(1, 3, reply(ping(7))));
  write(dir, "reply_error", client_input(1, 1, reply(allocate(7, 0, 0, 256))));
  write(dir, "reply_late", client_input(1, 1, reply(free_call(3, 99))));
  write(dir, "reply_unparsed", client_input(1, 1, reply(std::string("\xff", 1))));
  core->close_session(id);
}

}  // namespace

int main(int argc, char** argv)
{
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " CORPUS_DIR (tests/fuzz/corpus)\n";
    return 2;
  }
  fs::path const root = argv[1];
  session_corpus(root / "session");
  service_corpus(root / "service");
  client_corpus(root / "client_messages");
  std::cout << "wrote the session, service and client_messages corpora under " << root << "\n";
  return 0;
}
