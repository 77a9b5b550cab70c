// The C ABI of address-stable memory, sleep and wake (rmmd.h,
// "address-stable memory"): rmmd::stable_memory_resource behind a handle.

#include <rmmd/rmmd.h>
#include <rmmd/admin.hpp>
#include <rmmd/stable_memory_resource.hpp>

#include "client/c_api/c_internal.hpp"

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace {

using rmmd::c_api::fail;
using rmmd::c_api::guarded;
using rmmd::c_api::null_argument;

thread_local std::optional<rmmd::scoped_stable_tag> thread_tag;

std::vector<std::string> tags_of(char const* const* tags, std::size_t count)
{
  std::vector<std::string> out;
  if (tags == nullptr) { return out; }
  for (std::size_t i = 0; i < count; ++i) {
    if (tags[i] == nullptr) {
      throw rmmd::logic_error("rmmd: tag " + std::to_string(i) + " is NULL");
    }
    out.emplace_back(tags[i]);
  }
  return out;
}

std::string json_string(std::string const& s)
{
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

extern "C" {

rmmd_status rmmd_stable_resource_create(rmmd_session_t session,
                                        int device,
                                        char const* pool,
                                        char const* default_tag,
                                        rmmd_stable_resource_t* resource)
{
  if (session == nullptr || resource == nullptr) { return null_argument("session or resource"); }
  *resource = nullptr;
  return guarded([&] {
    std::string const tag = default_tag != nullptr ? default_tag : "default";
    if (pool != nullptr) {
      *resource =
          new rmmd_stable_resource_s{rmmd::stable_memory_resource(session->session, pool, tag)};
      return;
    }
    if (device < 0 && cudaGetDevice(&device) != cudaSuccess) {
      cudaGetLastError();
      throw rmm::bad_alloc("rmmd: cudaGetDevice failed; pass a device");
    }
    *resource =
        new rmmd_stable_resource_s{rmmd::stable_memory_resource(session->session, device, tag)};
  });
}

rmmd_status rmmd_stable_resource_destroy(rmmd_stable_resource_t resource)
{
  delete resource;
  return RMMD_SUCCESS;
}

rmmd_status rmmd_stable_allocate(rmmd_stable_resource_t resource,
                                 size_t bytes,
                                 char const* tag,
                                 void** ptr)
{
  if (resource == nullptr || ptr == nullptr) { return null_argument("resource or ptr"); }
  *ptr = nullptr;
  return guarded([&] {
    *ptr = tag != nullptr ? resource->mr.allocate_tagged(tag, bytes)
                          : resource->mr.allocate_sync(bytes, 256);
  });
}

rmmd_status rmmd_stable_deallocate(rmmd_stable_resource_t resource,
                                   void* ptr,
                                   size_t bytes,
                                   void* stream)
{
  if (resource == nullptr) { return null_argument("resource"); }
  resource->mr.deallocate(cuda::stream_ref{static_cast<cudaStream_t>(stream)}, ptr, bytes, 256);
  return RMMD_SUCCESS;
}

rmmd_status rmmd_stable_set_thread_tag(char const* tag)
{
  return guarded([&] {
    thread_tag.reset();
    if (tag != nullptr && *tag != '\0') { thread_tag.emplace(tag); }
  });
}

rmmd_status rmmd_stable_sleep(rmmd_stable_resource_t resource,
                              char const* const* tags,
                              size_t tag_count,
                              rmmd_sleep_backup backup,
                              char const* backup_name,
                              void* stream,
                              uint64_t* released_bytes)
{
  if (resource == nullptr) { return null_argument("resource"); }
  auto const how = rmmd::c_api::raw_enum(backup);
  if (how != RMMD_SLEEP_BACKUP_NONE && how != RMMD_SLEEP_BACKUP_HOST) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT,
                "rmmd_stable_sleep: backup " + std::to_string(how) +
                    " is neither RMMD_SLEEP_BACKUP_NONE nor RMMD_SLEEP_BACKUP_HOST");
  }
  return guarded([&] {
    auto released = resource->mr.sleep(
        tags_of(tags, tag_count),
        how == RMMD_SLEEP_BACKUP_HOST ? rmmd::sleep_backup::host : rmmd::sleep_backup::none,
        backup_name != nullptr ? backup_name : "",
        static_cast<cudaStream_t>(stream));
    if (released_bytes != nullptr) { *released_bytes = released; }
  });
}

rmmd_status rmmd_stable_wake(rmmd_stable_resource_t resource,
                             char const* const* tags,
                             size_t tag_count,
                             uint32_t deadline_ms,
                             void* stream,
                             uint64_t* woken_bytes)
{
  if (resource == nullptr) { return null_argument("resource"); }
  return guarded([&] {
    auto woken = resource->mr.wake(tags_of(tags, tag_count),
                                   std::chrono::milliseconds(deadline_ms),
                                   static_cast<cudaStream_t>(stream));
    if (woken_bytes != nullptr) { *woken_bytes = woken; }
  });
}

rmmd_status rmmd_stable_restore(rmmd_stable_resource_t resource,
                                char const* backup_name,
                                uint32_t deadline_ms,
                                void* stream,
                                char** json)
{
  if (resource == nullptr || backup_name == nullptr || json == nullptr) {
    return null_argument("resource, backup_name or json");
  }
  *json = nullptr;
  return guarded([&] {
    auto restored = resource->mr.restore(
        backup_name, std::chrono::milliseconds(deadline_ms), static_cast<cudaStream_t>(stream));
    std::string out = "[";
    for (auto const& r : restored) {
      if (out.size() > 1) { out += ","; }
      out += "{\"ptr\":" + std::to_string(reinterpret_cast<std::uintptr_t>(r.ptr)) +
             ",\"size\":" + std::to_string(r.size) + ",\"tag\":" + json_string(r.tag) + "}";
    }
    *json = rmmd::c_api::copy_string(out + "]");
  });
}

rmmd_status rmmd_stable_read_backup(
    rmmd_stable_resource_t resource, void const* ptr, size_t bytes, void* out, size_t* copied)
{
  if (resource == nullptr || ptr == nullptr || out == nullptr || copied == nullptr) {
    return null_argument("resource, ptr, out or copied");
  }
  return guarded([&] { *copied = resource->mr.read_backup(ptr, bytes, out) ? bytes : 0; });
}

rmmd_status rmmd_stable_keep_backups(rmmd_stable_resource_t resource, int keep)
{
  if (resource == nullptr) { return null_argument("resource"); }
  return guarded([&] { resource->mr.keep_backups(keep != 0); });
}

rmmd_status rmmd_stable_drop_backups(rmmd_session_t session,
                                     char const* backup_name,
                                     uint64_t* dropped_bytes)
{
  if (session == nullptr || backup_name == nullptr) {
    return null_argument("session or backup_name");
  }
  return guarded([&] {
    auto dropped = rmmd::admin(session->session).drop_backups(backup_name);
    if (dropped_bytes != nullptr) { *dropped_bytes = dropped; }
  });
}

rmmd_status rmmd_stable_sleepers_json(rmmd_session_t session, char** json)
{
  if (session == nullptr || json == nullptr) { return null_argument("session or json"); }
  *json = nullptr;
  return guarded(
      [&] { *json = rmmd::c_api::copy_string(rmmd::admin(session->session).sleepers_json()); });
}

}  // extern "C"
