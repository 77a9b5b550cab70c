// Writes the state_file fuzzer's seeds into DIR/state_file/ (run it again
// after a change to proto/rmmd/v1/state.proto):
//   rmmd_fuzz_state_file_corpus tests/fuzz/corpus
// Seeds: an empty registry, a host and a CUDA buffer with a manifest (the
// CUDA one with a fabric handle), a registry of 64 buffers, two buffers
// with three sleep backups, and three files a reader must refuse
// (truncated, a flipped payload byte, another format version).

#include "daemon/restart/fd_store.hpp"
#include "daemon/restart/state_file.hpp"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

namespace {

namespace fs = std::filesystem;
using namespace rmmd;

v1::StoredBuffer buffer(std::uint64_t id, std::string const& name, bool cuda)
{
  v1::StoredBuffer b;
  b.set_fd_id(id);
  b.set_fd_name(restart::buffer_fd_name(id, name));
  b.set_name(name);
  b.set_size(1000 * id + 1);
  b.set_allocation_bytes(2 << 20);
  b.set_pool_name(cuda ? "gpu0" : "host");
  if (cuda) { b.set_gpu_uuid("GPU-5f3c2a1e-0000-1111-2222-333344445555"); }
  if (cuda && id % 4 == 2) {  // a fabric pool's buffer: its 64-byte handle
    b.set_fabric(true);
    b.set_fabric_handle(std::string(64, static_cast<char>(0xa0 + id % 16)));
  }
  b.set_kind(cuda ? v1::STORED_BUFFER_KIND_VMM_POSIX_FD : v1::STORED_BUFFER_KIND_HOST_MEMFD);
  b.set_creator_uid(1000);
  b.set_creator_pid(4242);
  if (id % 2 == 0) { b.set_gid(100); }
  b.set_allow_writers(id % 3 == 0);
  b.set_persistent(true);
  b.set_state(v1::BUFFER_STATE_PUBLISHED);
  b.set_created_unix_ms(1'790'000'000'000);
  return b;
}

v1::BufferRegistryState registry(int buffers)
{
  v1::BufferRegistryState s;
  s.set_format_version(restart::state_format_version);
  s.set_daemon_generation(4);
  s.set_next_fd_id(static_cast<std::uint64_t>(buffers) + 1);
  s.set_written_unix_ms(1'790'000'000'000);
  for (int i = 1; i <= buffers; ++i) {
    auto b =
        buffer(static_cast<std::uint64_t>(i), "team/model/layer" + std::to_string(i), i % 2 == 0);
    if (i == 2) {
      auto* t = b.mutable_manifest()->add_tensors();
      t->set_name("weight");
      auto* l = b.mutable_manifest()->add_labels();
      l->set_key("model");
      l->set_value("llama-3-8b");
    }
    *s.add_buffers() = b;
  }
  return s;
}

/// `registry(buffers)` and `backups` sleep backups after them (two names).
v1::BufferRegistryState with_backups(int buffers, int backups)
{
  auto s = registry(buffers);
  for (int i = 1; i <= backups; ++i) {
    auto const id = static_cast<std::uint64_t>(buffers + i);
    v1::StoredBackup b;
    b.set_fd_id(id);
    auto const name = i % 2 == 0 ? std::string("engine-1") : std::string("engine-0");
    b.set_fd_name(restart::backup_fd_name(id, name));
    b.set_backup_name(name);
    b.set_uid(1000);
    b.set_gid(100);
    b.set_pid(4343);
    b.set_command("python -m engine");
    b.set_tag(i == 1 ? "kv" : "weights");
    b.set_size(3000 * id);
    b.set_allocation_bytes(2 << 20);
    b.set_pool_name("gpu0");
    b.set_gpu_uuid("GPU-5f3c2a1e-0000-1111-2222-333344445555");
    b.set_host_pool_name("host");
    b.set_backup_bytes(2 << 20);
    b.set_asleep_since_unix_ms(1'790'000'000'000);
    *s.add_backups() = b;
  }
  s.set_next_fd_id(static_cast<std::uint64_t>(buffers + backups) + 1);
  return s;
}

void write(fs::path const& dir, std::string const& name, std::string const& bytes)
{
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

}  // namespace

int main(int argc, char** argv)
{
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " CORPUS_DIR\n";
    return 2;
  }
  auto const dir = fs::path(argv[1]) / "state_file";
  fs::create_directories(dir);
  write(dir, "empty_registry", restart::encode_state(registry(0)));
  auto const two = restart::encode_state(registry(2));
  write(dir, "host_and_cuda_with_manifest", two);
  write(dir, "sixty_four_buffers", restart::encode_state(registry(64)));
  write(dir, "buffers_and_backups", restart::encode_state(with_backups(2, 3)));
  write(dir, "truncated", two.substr(0, two.size() - 7));
  auto flipped = two;
  flipped[restart::state_file_header_bytes + 3] ^= 0x01;
  write(dir, "flipped_byte", flipped);
  auto other_version = registry(1);
  other_version.set_format_version(2);
  write(dir, "other_format_version", restart::encode_state(other_version));
  std::cout << "wrote the state_file seeds in " << dir << "\n";
  return 0;
}
