// librmmd_c's shared buffers: create, open (by name, with options, by
// labels), publish, close; their manifests; listing and describing them.

#include "client/c_api/c_internal.hpp"

#include "client/detail/manifest_convert.hpp"

#include <rmmd/admin.hpp>

#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <map>
#include <string>

using rmmd::c_api::copy_string;
using rmmd::c_api::fail;
using rmmd::c_api::guarded;
using rmmd::c_api::null_argument;
using rmmd::c_api::raw_enum;
using rmmd::c_api::read_struct;

// The structs' sizes before `pin` (0.8's, padding included) are where it
// begins: a caller built then passes them (LP64).
static_assert(offsetof(rmmd_buffer_options, pin) == 48);
static_assert(offsetof(rmmd_open_options, pin) == 72);

namespace {

/// Protobuf's JSON of `message`, as the rmmd_*_json functions write it
/// (rmmd/admin.hpp): the proto's field names (byte_offset), every field.
std::string to_json(google::protobuf::Message const& message, char const* what)
{
  std::string out;
  google::protobuf::util::JsonPrintOptions print;
  print.always_print_primitive_fields = true;
  print.preserve_proto_field_names    = true;
  if (auto status = google::protobuf::util::MessageToJsonString(message, &out, print);
      !status.ok()) {
    throw rmm::bad_alloc(std::string("rmmd: ") + what +
                         ": could not write JSON: " + std::string(status.message()));
  }
  return out;
}

/// `json` (protobuf's JSON mapping of `out`'s type) into `out`; a
/// rmmd::logic_error naming `what` and the parser's reason otherwise.
void from_json(char const* json, google::protobuf::Message* out, std::string const& what)
{
  google::protobuf::util::JsonParseOptions parse;
  if (auto status = google::protobuf::util::JsonStringToMessage(json, out, parse); !status.ok()) {
    throw rmmd::logic_error("rmmd: " + what + ": " + std::string(status.message()));
  }
}

/// The labels of key and value arrays (a C caller's), each key once.
void labels_from_arrays(char const* const* keys,
                        char const* const* values,
                        std::size_t count,
                        std::map<std::string, std::string, std::less<>>* labels,
                        std::string const& what)
{
  if (count == 0) { return; }
  if (keys == nullptr || values == nullptr) {
    throw rmmd::logic_error("rmmd: " + what + ": " + std::to_string(count) +
                            " labels, but the keys or values array is NULL");
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (keys[i] == nullptr || values[i] == nullptr) {
      throw rmmd::logic_error("rmmd: " + what + ": label " + std::to_string(i) +
                              " has a NULL key or value");
    }
    if (!labels->try_emplace(keys[i], values[i]).second) {
      throw rmmd::logic_error("rmmd: " + what + ": label '" + std::string(keys[i]) +
                              "' is given twice; name each label once");
    }
  }
}

/// Whether a caller's rmmd_pinning field holds one of its values.
bool known_pinning(rmmd_pinning const& field) noexcept
{
  auto const pin = raw_enum(field);
  return pin == RMMD_PINNING_AUTOMATIC || pin == RMMD_PINNING_REQUIRED || pin == RMMD_PINNING_OFF;
}

/// The C++ pinning of a checked C one.
rmmd::pinning to_pinning(rmmd_pinning pin) noexcept
{
  switch (pin) {
    case RMMD_PINNING_REQUIRED:
      return rmmd::pinning::required;
    case RMMD_PINNING_OFF:
      return rmmd::pinning::off;
    default:
      return rmmd::pinning::automatic;
  }
}

/// The caller's open options, whatever its struct's size (NULL: the
/// defaults); nullopt after setting `*refused` where they cannot be used.
std::optional<rmmd_open_options> read_open_options(rmmd_open_options const* options,
                                                   std::string const& what,
                                                   rmmd_status* refused)
{
  rmmd_open_options defaults{};
  defaults.size = sizeof(defaults);
  auto o        = read_struct(options,
                       defaults,
                       {offsetof(rmmd_open_options, peer),
                               offsetof(rmmd_open_options, has_device),
                               offsetof(rmmd_open_options, exclusive),
                               offsetof(rmmd_open_options, standby),
                               offsetof(rmmd_open_options, pin)});
  if (!o) {
    *refused = fail(RMMD_ERROR_INVALID_ARGUMENT, "rmmd: options->size is not a size");
    return std::nullopt;
  }
  if (o->has_device != 0 && o->device < 0) {
    *refused = fail(RMMD_ERROR_INVALID_ARGUMENT,
                    "rmmd: " + what + ": options->device is " + std::to_string(o->device) +
                        " with has_device set; give a CUDA device of this process (0 or more), "
                        "or clear has_device for the current one");
    return std::nullopt;
  }
  if (auto access = raw_enum(o->access);
      access != RMMD_BUFFER_READ && access != RMMD_BUFFER_READ_WRITE) {
    *refused = fail(RMMD_ERROR_INVALID_ARGUMENT,
                    "rmmd: options->access is " + std::to_string(access) +
                        ", neither RMMD_BUFFER_READ nor RMMD_BUFFER_READ_WRITE");
    return std::nullopt;
  }
  if (!known_pinning(o->pin)) {
    *refused = fail(RMMD_ERROR_INVALID_ARGUMENT,
                    "rmmd: " + what + ": options->pin is " + std::to_string(raw_enum(o->pin)) +
                        ", none of RMMD_PINNING_AUTOMATIC, _REQUIRED or _OFF");
    return std::nullopt;
  }
  return o;
}

/// The C++ open options of checked C ones (throws for bad expected labels).
rmmd::open_options to_open_options(rmmd_open_options const& o, std::string const& what)
{
  rmmd::open_options oo;
  oo.wait   = std::chrono::milliseconds(o.wait_ms);
  oo.access = o.access == RMMD_BUFFER_READ_WRITE ? rmmd::buffer_access::read_write
                                                 : rmmd::buffer_access::read;
  labels_from_arrays(o.expect_keys,
                     o.expect_values,
                     o.expect_count,
                     &oo.expect_labels,
                     what + ": expected labels");
  if (o.peer != nullptr) { oo.peer = o.peer; }
  if (o.has_device != 0) { oo.device = o.device; }
  oo.exclusive = o.exclusive != 0;
  oo.standby   = o.standby != 0;
  oo.pin       = to_pinning(o.pin);
  return oo;
}

}  // namespace

extern "C" {

rmmd_status rmmd_buffer_create(rmmd_session_t session,
                               char const* name,
                               size_t bytes,
                               rmmd_buffer_options const* options,
                               rmmd_buffer_t* buffer)
{
  if (session == nullptr || name == nullptr || buffer == nullptr) {
    return null_argument("session, name or buffer");
  }
  rmmd_buffer_options defaults{};
  defaults.size      = sizeof(defaults);
  defaults.device    = -1;
  defaults.alignment = 256;
  // Callers built before allow_writers existed pass the size up to it;
  // those built before pin, the size up to that.
  auto o = read_struct(
      options,
      defaults,
      {offsetof(rmmd_buffer_options, allow_writers), offsetof(rmmd_buffer_options, pin)});
  if (!o) { return fail(RMMD_ERROR_INVALID_ARGUMENT, "rmmd: options->size is not a size"); }
  if (!known_pinning(o->pin)) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT,
                "rmmd: create buffer '" + std::string(name) + "': options->pin is " +
                    std::to_string(raw_enum(o->pin)) +
                    ", none of RMMD_PINNING_AUTOMATIC, _REQUIRED or _OFF");
  }
  return guarded([&] {
    rmmd::shared_buffer_options so;
    so.allow_writers = o->allow_writers != 0;
    if (o->pool != nullptr) { so.pool = o->pool; }
    so.device     = o->device;
    so.persistent = o->persistent != 0;
    if (o->has_gid != 0) { so.gid = static_cast<gid_t>(o->gid); }
    so.alignment = o->alignment == 0 ? 256 : o->alignment;
    so.pin       = to_pinning(o->pin);
    auto b       = rmmd::shared_buffer::create(session->session, name, bytes, so);
    auto device  = b.device();
    *buffer      = new rmmd_buffer_s{.buffer = std::move(b), .device = device};
  });
}

rmmd_status rmmd_buffer_open(rmmd_session_t session,
                             char const* name,
                             uint32_t wait_ms,
                             rmmd_buffer_t* buffer)
{
  if (session == nullptr || name == nullptr || buffer == nullptr) {
    return null_argument("session, name or buffer");
  }
  return guarded([&] {
    auto b = rmmd::shared_buffer::open(session->session, name, std::chrono::milliseconds(wait_ms));
    auto device = b.device();
    *buffer     = new rmmd_buffer_s{.buffer = std::move(b), .device = device};
  });
}

rmmd_status rmmd_buffer_publish(rmmd_buffer_t buffer)
{
  if (buffer == nullptr) { return null_argument("buffer"); }
  return guarded([&] { buffer->buffer.publish(); });
}

rmmd_status rmmd_buffer_publish_on_stream(rmmd_buffer_t buffer, void* stream)
{
  if (buffer == nullptr) { return null_argument("buffer"); }
  return guarded([&] {
    buffer->buffer.publish(
        cuda::stream_ref{stream == nullptr ? cudaStreamLegacy : static_cast<cudaStream_t>(stream)});
  });
}

rmmd_status rmmd_buffer_close(rmmd_buffer_t buffer, void* stream)
{
  if (buffer == nullptr) { return RMMD_SUCCESS; }
  return guarded([&] {
    if (stream != nullptr) {
      buffer->buffer.close(cuda::stream_ref{static_cast<cudaStream_t>(stream)});
    } else if (buffer->device >= 0) {
      buffer->buffer.close(cuda::stream_ref{cudaStreamLegacy});
    }
    delete buffer;  // closes at once what is left
  });
}

rmmd_status rmmd_buffer_destroy(rmmd_buffer_t buffer)
{
  return rmmd_buffer_close(buffer, nullptr);
}

rmmd_status rmmd_buffer_pointer(rmmd_buffer_t buffer, void** ptr)
{
  if (buffer == nullptr || ptr == nullptr) { return null_argument("buffer or ptr"); }
  *ptr = buffer->buffer.data();
  return RMMD_SUCCESS;
}

rmmd_status rmmd_buffer_size(rmmd_buffer_t buffer, size_t* bytes)
{
  if (buffer == nullptr || bytes == nullptr) { return null_argument("buffer or bytes"); }
  *bytes = buffer->buffer.size();
  return RMMD_SUCCESS;
}

rmmd_status rmmd_buffer_id(rmmd_buffer_t buffer, uint64_t* id)
{
  if (buffer == nullptr || id == nullptr) { return null_argument("buffer or id"); }
  *id = buffer->buffer.id();
  return RMMD_SUCCESS;
}

rmmd_status rmmd_buffer_device(rmmd_buffer_t buffer, int* device)
{
  if (buffer == nullptr || device == nullptr) { return null_argument("buffer or device"); }
  *device = buffer->device;
  return RMMD_SUCCESS;
}

rmmd_status rmmd_buffer_delete(rmmd_session_t session, char const* name, size_t* holders)
{
  if (session == nullptr || name == nullptr) { return null_argument("session or name"); }
  return guarded([&] {
    auto n = rmmd::shared_buffer::remove(session->session, name);
    if (holders != nullptr) { *holders = n; }
  });
}

rmmd_status rmmd_buffer_open_with(rmmd_session_t session,
                                  char const* name,
                                  rmmd_open_options const* options,
                                  rmmd_buffer_t* buffer)
{
  if (session == nullptr || name == nullptr || buffer == nullptr) {
    return null_argument("session, name or buffer");
  }
  auto const what     = "open buffer '" + std::string(name) + "'";
  rmmd_status refused = RMMD_SUCCESS;
  auto o              = read_open_options(options, what, &refused);
  if (!o) { return refused; }
  return guarded([&] {
    auto b      = rmmd::shared_buffer::open(session->session, name, to_open_options(*o, what));
    auto device = b.device();
    *buffer     = new rmmd_buffer_s{.buffer = std::move(b), .device = device};
  });
}

rmmd_status rmmd_buffer_set_manifest_json(rmmd_buffer_t buffer, char const* json)
{
  if (buffer == nullptr || json == nullptr) { return null_argument("buffer or json"); }
  return guarded([&] {
    rmmd::v1::BufferManifest parsed;
    from_json(json, &parsed, "set manifest of buffer '" + buffer->buffer.name() + "': bad JSON");
    buffer->buffer.set_manifest(rmmd::detail::from_proto(parsed));
  });
}

rmmd_status rmmd_buffer_manifest_json(rmmd_buffer_t buffer, char** json)
{
  if (buffer == nullptr || json == nullptr) { return null_argument("buffer or json"); }
  return guarded([&] {
    rmmd::v1::BufferManifest m;
    rmmd::detail::to_proto(buffer->buffer.manifest(), &m);
    *json = copy_string(to_json(m, "manifest"));
  });
}

rmmd_status rmmd_buffer_access_mode(rmmd_buffer_t buffer, rmmd_buffer_access* access)
{
  if (buffer == nullptr || access == nullptr) { return null_argument("buffer or access"); }
  *access = buffer->buffer.access() == rmmd::buffer_access::read_write ? RMMD_BUFFER_READ_WRITE
                                                                       : RMMD_BUFFER_READ;
  return RMMD_SUCCESS;
}

rmmd_status rmmd_buffer_lease_generation(rmmd_buffer_t buffer, uint64_t* generation)
{
  if (buffer == nullptr || generation == nullptr) { return null_argument("buffer or generation"); }
  *generation = buffer->buffer.lease_generation();
  return RMMD_SUCCESS;
}

rmmd_status rmmd_buffer_wait_lease(rmmd_buffer_t buffer, int64_t timeout_ms, uint64_t* generation)
{
  if (buffer == nullptr) { return null_argument("buffer"); }
  return guarded([&] {
    // Without end: as long as the API's wait can say (about 49 days).
    auto const wait    = timeout_ms < 0 ? std::chrono::milliseconds(0xffffffff)
                                        : std::chrono::milliseconds(timeout_ms);
    auto const granted = buffer->buffer.wait_lease(wait);
    if (generation != nullptr) { *generation = granted; }
  });
}

rmmd_status rmmd_buffer_pinned(rmmd_buffer_t buffer, int* pinned)
{
  if (buffer == nullptr || pinned == nullptr) { return null_argument("buffer or pinned"); }
  return guarded([&] { *pinned = buffer->buffer.pinned() ? 1 : 0; });
}

rmmd_status rmmd_buffer_holds_lease(rmmd_buffer_t buffer, int* holds)
{
  if (buffer == nullptr || holds == nullptr) { return null_argument("buffer or holds"); }
  *holds = buffer->buffer.holds_lease() ? 1 : 0;
  return RMMD_SUCCESS;
}

rmmd_status rmmd_buffer_list_json(rmmd_session_t session,
                                  char const* name_prefix,
                                  char const* const* label_keys,
                                  char const* const* label_values,
                                  size_t label_count,
                                  char** json)
{
  return rmmd_buffer_list_peer_json(
      session, nullptr, name_prefix, label_keys, label_values, label_count, json);
}

rmmd_status rmmd_buffer_list_peer_json(rmmd_session_t session,
                                       char const* peer,
                                       char const* name_prefix,
                                       char const* const* label_keys,
                                       char const* const* label_values,
                                       size_t label_count,
                                       char** json)
{
  if (session == nullptr || json == nullptr) { return null_argument("session or json"); }
  return guarded([&] {
    rmmd::buffer_filter filter;
    if (name_prefix != nullptr) { filter.name_prefix = name_prefix; }
    if (peer != nullptr) { filter.peer = peer; }
    labels_from_arrays(label_keys, label_values, label_count, &filter.labels, "list buffers");
    *json = copy_string(rmmd::admin(session->session).buffers_json(filter));
  });
}

rmmd_status rmmd_buffer_open_by_labels(rmmd_session_t session,
                                       char const* const* label_keys,
                                       char const* const* label_values,
                                       size_t label_count,
                                       rmmd_open_options const* options,
                                       rmmd_buffer_t* buffer)
{
  if (session == nullptr || buffer == nullptr) { return null_argument("session or buffer"); }
  std::string const what = "open a buffer by labels";
  rmmd_status refused    = RMMD_SUCCESS;
  auto o                 = read_open_options(options, what, &refused);
  if (!o) { return refused; }
  return guarded([&] {
    std::map<std::string, std::string, std::less<>> labels;
    labels_from_arrays(label_keys, label_values, label_count, &labels, what);
    auto b =
        rmmd::shared_buffer::open_by_labels(session->session, labels, to_open_options(*o, what));
    auto device = b.device();
    *buffer     = new rmmd_buffer_s{.buffer = std::move(b), .device = device};
  });
}

rmmd_status rmmd_buffer_name(rmmd_buffer_t buffer, char** name)
{
  if (buffer == nullptr || name == nullptr) { return null_argument("buffer or name"); }
  return guarded([&] { *name = copy_string(buffer->buffer.name()); });
}

rmmd_status rmmd_buffer_describe_json(rmmd_session_t session, char const* name, char** json)
{
  if (session == nullptr || name == nullptr || json == nullptr) {
    return null_argument("session, name or json");
  }
  return guarded([&] { *json = copy_string(rmmd::admin(session->session).buffer_json(name)); });
}

}  // extern "C"
