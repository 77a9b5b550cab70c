// librmmd_c: include/rmmd/rmmd.h over the C++ client. Every exported
// function catches everything: an exception becomes a status and the
// thread's message (STYLE.md: nothing throws across the ABI).

#include <rmmd/rmmd.h>

#include "client/detail/manifest_convert.hpp"
#include "client/detail/process_exit.hpp"
#include "client/detail/session_impl.hpp"

#include <rmmd/host_memory_resource.hpp>
#include <rmmd/ipc_memory_resource.hpp>
#include <rmmd/pinned_host_memory_resource.hpp>
#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>

static_assert(RMMD_VERSION == RMMD_PROJECT_VERSION_NUMBER,
              "include/rmmd/rmmd.h's RMMD_VERSION_* differ from the CMake project's version");
static_assert(RMMD_CARVING_LANES_AUTO == rmmd::auto_carving_lanes);
static_assert(RMMD_CAPTURE_CHECKS_AUTOMATIC == static_cast<int>(rmmd::capture_checks::automatic));
static_assert(RMMD_CAPTURE_CHECKS_EVERY_CALL == static_cast<int>(rmmd::capture_checks::every_call));
static_assert(RMMD_CAPTURE_CHECKS_SLOW_PATH_ONLY ==
              static_cast<int>(rmmd::capture_checks::slow_path_only));

struct rmmd_session_s {
  rmmd::session session;
};

struct rmmd_resource_s {
  std::variant<rmmd::ipc_memory_resource,
               rmmd::host_memory_resource,
               rmmd::pinned_host_memory_resource>
      mr;
  int device{-1};
  std::atomic<std::uint64_t> allocated{};
  std::atomic<std::uint64_t> count{};
  std::atomic<std::uint64_t> high_water{};
  std::atomic<std::uint64_t> total{};
};

struct rmmd_buffer_s {
  rmmd::shared_buffer buffer;
  int device{-1};
};

namespace {

thread_local std::string last_error;

rmmd_status fail(rmmd_status status, std::string message)
{
  last_error = std::move(message);
  return status;
}

/// `what` without the C++ type names rmm::bad_alloc and rmm::out_of_memory
/// put before the message ("std::bad_alloc: out_of_memory: rmmd: ..."): the
/// status already says which it is.
std::string words(char const* what)
{
  std::string_view text(what);
  for (std::string_view prefix : {"std::bad_alloc: ", "out_of_memory: "}) {
    if (text.substr(0, prefix.size()) == prefix) { text.remove_prefix(prefix.size()); }
  }
  return std::string(text);
}

/// The status and message of the exception in flight (DESIGN.md's table).
rmmd_status from_exception() noexcept
{
  try {
    throw;
  } catch (rmmd::not_found_error const& e) {
    return fail(RMMD_ERROR_NOT_FOUND, e.what());
  } catch (rmmd::already_exists_error const& e) {
    return fail(RMMD_ERROR_ALREADY_EXISTS, e.what());
  } catch (rmmd::precondition_error const& e) {
    return fail(RMMD_ERROR_FAILED_PRECONDITION, e.what());
  } catch (rmmd::logic_error const& e) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT, e.what());
  } catch (rmmd::permission_error const& e) {
    return fail(RMMD_ERROR_PERMISSION_DENIED, words(e.what()));
  } catch (rmmd::session_error const& e) {
    return fail(RMMD_ERROR_SESSION, words(e.what()));
  } catch (rmm::out_of_memory const& e) {
    return fail(RMMD_ERROR_OUT_OF_MEMORY, words(e.what()));
  } catch (rmm::bad_alloc const& e) {
    // error.hpp's "anything else": a CUDA or system error, named. (It
    // derives from std::bad_alloc, which must not make it out of memory.)
    return fail(RMMD_ERROR_INTERNAL, words(e.what()));
  } catch (rmm::logic_error const& e) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT, words(e.what()));
  } catch (std::logic_error const& e) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT, words(e.what()));
  } catch (std::bad_alloc const& e) {
    // std::bad_alloc itself (the heap): out of memory too.
    return fail(RMMD_ERROR_OUT_OF_MEMORY, std::string("rmmd: ") + e.what());
  } catch (std::exception const& e) {
    return fail(RMMD_ERROR_INTERNAL, words(e.what()));
  } catch (...) {
    return fail(RMMD_ERROR_INTERNAL, "rmmd: an unknown exception");
  }
}

/// Runs `body`, which returns nothing or throws; the status.
template <typename Body>
rmmd_status guarded(Body&& body) noexcept
{
  try {
    body();
    return RMMD_SUCCESS;
  } catch (...) {
    return from_exception();
  }
}

rmmd_status null_argument(char const* what)
{
  return fail(RMMD_ERROR_INVALID_ARGUMENT, std::string("rmmd: ") + what + " is NULL");
}

/// Reads a caller's struct that begins with its size: a copy of the fields
/// the caller knows, the rest as `defaults` has them. `older_sizes`: the sizes
/// released before (a caller built against them knows the fields up to
/// there); any other size would cut a field (a pointer) in half.
template <typename Struct>
std::optional<Struct> read_struct(Struct const* in,
                                  Struct defaults,
                                  std::initializer_list<std::size_t> older_sizes = {})
{
  if (in == nullptr) { return defaults; }
  // Only the sizes of released layouts: any other would cut a field (a
  // pointer) in half. A caller built with an older, smaller layout keeps
  // the defaults of the fields added since.
  bool const known =
      in->size == sizeof(Struct) ||
      std::find(older_sizes.begin(), older_sizes.end(), in->size) != older_sizes.end();
  if (!known) { return std::nullopt; }
  std::memcpy(&defaults, in, in->size);
  defaults.size = sizeof(Struct);
  return defaults;
}

/// Protobuf's JSON of `message`, as the rmmd_*_json functions write it: the
/// proto's field names (byte_offset), every field (zeros and empty lists
/// too, so that a reader need not know the defaults).
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

/// A C enum field as the int its caller stored: C lets any int stand there,
/// and C++ reading a value beyond the enumerators' range as the enum is
/// undefined (UBSan says so), so it is read as bytes.
template <typename Enum>
int raw_enum(Enum const& field) noexcept
{
  static_assert(sizeof(Enum) == sizeof(int));
  int value = 0;
  std::memcpy(&value, &field, sizeof value);
  return value;
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

char* copy_string(std::string const& s)
{
  auto* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out == nullptr) { throw std::bad_alloc(); }
  std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

std::string json_escape(std::string const& s)
{
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

void note_allocation(rmmd_resource_s& r, std::size_t bytes) noexcept
{
  auto now = r.allocated.fetch_add(bytes) + bytes;
  r.count.fetch_add(1);
  r.total.fetch_add(1);
  auto high = r.high_water.load();
  while (now > high && !r.high_water.compare_exchange_weak(high, now)) {}
}

void note_deallocation(rmmd_resource_s& r, std::size_t bytes)
{
  r.allocated.fetch_sub(bytes);
  r.count.fetch_sub(1);
}

void fill_stats(rmmd_resource_s const& r, rmmd_resource_stats* out)
{
  rmmd_resource_stats s{};
  s.size              = sizeof(s);
  s.allocated_bytes   = r.allocated.load();
  s.allocation_count  = r.count.load();
  s.high_water_bytes  = r.high_water.load();
  s.total_allocations = r.total.load();
  s.device            = r.device;
  std::memcpy(out, &s, std::min(out->size, sizeof(s)));
  out->size = std::min(out->size, sizeof(s));
}

}  // namespace

extern "C" {

char const* rmmd_version(void)
{
  return RMMD_VERSION_STRING;
}

int rmmd_version_number(void)
{
  return RMMD_VERSION;
}

char const* rmmd_last_error_message(void)
{
  return last_error.c_str();
}

char const* rmmd_status_name(rmmd_status status)
{
  switch (status) {
    case RMMD_SUCCESS:
      return "RMMD_SUCCESS";
    case RMMD_ERROR_INVALID_ARGUMENT:
      return "RMMD_ERROR_INVALID_ARGUMENT";
    case RMMD_ERROR_NOT_FOUND:
      return "RMMD_ERROR_NOT_FOUND";
    case RMMD_ERROR_ALREADY_EXISTS:
      return "RMMD_ERROR_ALREADY_EXISTS";
    case RMMD_ERROR_PERMISSION_DENIED:
      return "RMMD_ERROR_PERMISSION_DENIED";
    case RMMD_ERROR_OUT_OF_MEMORY:
      return "RMMD_ERROR_OUT_OF_MEMORY";
    case RMMD_ERROR_FAILED_PRECONDITION:
      return "RMMD_ERROR_FAILED_PRECONDITION";
    case RMMD_ERROR_INTERNAL:
      return "RMMD_ERROR_INTERNAL";
    case RMMD_ERROR_SESSION:
      return "RMMD_ERROR_SESSION";
  }
  return "RMMD_ERROR_UNKNOWN";
}

void rmmd_string_free(char* s)
{
  std::free(s);
}

rmmd_status rmmd_session_create(rmmd_session_options const* options, rmmd_session_t* session)
{
  if (session == nullptr) { return null_argument("session"); }
  rmmd_session_options defaults{};
  defaults.size = sizeof(defaults);
  // 40: the layout before reconnect_ms, on_reconnect and its user data.
  auto o = read_struct(options, defaults, {offsetof(rmmd_session_options, on_reconnect)});
  if (!o) { return fail(RMMD_ERROR_INVALID_ARGUMENT, "rmmd: options->size is not a size"); }
  return guarded([&] {
    rmmd::session::options so;
    if (o->reconnect_ms < 0) {
      so.reconnect = std::chrono::milliseconds(0);
    } else if (o->reconnect_ms > 0) {
      so.reconnect = std::chrono::milliseconds(o->reconnect_ms);
    }
    if (o->on_reconnect != nullptr) {
      so.on_reconnect = [fn   = o->on_reconnect,
                         user = o->on_reconnect_user_data](rmmd::reconnect_info const& i) {
        rmmd_reconnect_info info{};
        info.size                = sizeof(info);
        info.previous_session_id = i.previous_session_id;
        info.session_id          = i.session_id;
        info.reconnects          = i.reconnects;
        info.buffers_held_again  = static_cast<std::uint32_t>(i.buffers_held_again);
        info.buffers_unknown     = static_cast<std::uint32_t>(i.buffers_unknown);
        fn(user, &info);
      };
    }
    if (o->runtime_dir != nullptr) { so.runtime_dir = o->runtime_dir; }
    if (o->client_name != nullptr) { so.client_name = o->client_name; }
    so.lease_calls =
        o->use_grpc != 0 ? rmmd::call_transport::grpc : rmmd::call_transport::session_socket;
    so.import_by_fabric = o->import_by_fabric != 0;
    if (o->call_timeout_ms != 0) {
      so.call_timeout = std::chrono::milliseconds(o->call_timeout_ms);
    }
    *session = new rmmd_session_s{rmmd::session(std::move(so))};
  });
}

rmmd_status rmmd_session_destroy(rmmd_session_t session)
{
  return guarded([&] { delete session; });
}

rmmd_status rmmd_session_id(rmmd_session_t session, uint64_t* id)
{
  if (session == nullptr || id == nullptr) { return null_argument("session or id"); }
  *id = session->session.id();
  return RMMD_SUCCESS;
}

rmmd_status rmmd_session_reconnects(rmmd_session_t session, uint32_t* reconnects)
{
  if (session == nullptr || reconnects == nullptr) {
    return null_argument("session or reconnects");
  }
  *reconnects = session->session.reconnects();
  return RMMD_SUCCESS;
}

rmmd_status rmmd_session_pools_json(rmmd_session_t session, char** json)
{
  if (session == nullptr || json == nullptr) { return null_argument("session or json"); }
  return guarded([&] {
    std::string out = "[";
    for (auto const& p : session->session.pools()) {
      if (out.size() > 1) { out += ","; }
      out += "{\"id\":" + std::to_string(p.id) + ",\"name\":\"" + json_escape(p.name) +
             "\",\"backend\":\"" + (p.backend == rmmd::backend_kind::cuda ? "cuda" : "host") +
             "\",\"device\":" + std::to_string(p.device) +
             ",\"capacity_bytes\":" + std::to_string(p.capacity_bytes) +
             ",\"max_alignment\":" + std::to_string(p.max_alignment) +
             ",\"pinnable\":" + (p.pinnable ? "true" : "false") +
             ",\"has_fabric_handle\":" + (p.has_fabric_handle ? "true" : "false") +
             ",\"gpu_uuid\":\"" + json_escape(p.gpu_uuid) + "\",\"pci_bus_id\":\"" +
             json_escape(p.pci_bus_id) + "\"}";
    }
    out += "]";
    *json = copy_string(out);
  });
}

rmmd_status rmmd_session_stats_json(rmmd_session_t session, char** json)
{
  if (session == nullptr || json == nullptr) { return null_argument("session or json"); }
  return guarded([&] {
    auto& impl = session->session.impl();
    rmmd::v1::GetStatsRequest request;
    rmmd::v1::Stats stats;
    auto ctx = impl.context();
    if (auto status = impl.stub().GetStats(ctx.get(), request, &stats); !status.ok()) {
      rmmd::detail::throw_status(status, "stats");
    }
    std::string out;
    // As rmmctl stats --json prints it: zeros too (protobuf leaves fields at
    // their default out otherwise, pool 0's id among them).
    google::protobuf::util::JsonPrintOptions print;
    print.always_print_primitive_fields = true;
    print.preserve_proto_field_names    = true;
    if (!google::protobuf::util::MessageToJsonString(stats, &out, print).ok()) {
      throw rmm::bad_alloc("rmmd: stats: could not write JSON");
    }
    *json = copy_string(out);
  });
}

rmmd_status rmmd_resource_create(rmmd_session_t session,
                                 rmmd_resource_options const* options,
                                 rmmd_resource_t* resource)
{
  if (session == nullptr || resource == nullptr) { return null_argument("session or resource"); }
  auto o = read_struct(options,
                       rmmd_resource_options{.size           = sizeof(rmmd_resource_options),
                                             .kind           = RMMD_RESOURCE_DEVICE,
                                             .device         = -1,
                                             .pool           = nullptr,
                                             .mode           = RMMD_MODE_SLAB,
                                             .carving_lanes  = RMMD_CARVING_LANES_AUTO,
                                             .capture_checks = RMMD_CAPTURE_CHECKS_AUTOMATIC},
                       {offsetof(rmmd_resource_options, capture_checks)});  // before capture_checks
  if (!o) { return fail(RMMD_ERROR_INVALID_ARGUMENT, "rmmd: options->size is not a size"); }
  return guarded([&] {
    auto const& s         = session->session;
    std::string_view pool = o->pool == nullptr ? std::string_view{} : std::string_view(o->pool);
    switch (raw_enum(o->kind)) {
      case RMMD_RESOURCE_DEVICE: {
        rmmd::ipc_resource_options ro;
        ro.mode          = raw_enum(o->mode) == RMMD_MODE_DIRECT ? rmmd::allocation_mode::direct
                                                                 : rmmd::allocation_mode::slab;
        ro.carving_lanes = o->carving_lanes;  // RMMD_CARVING_LANES_AUTO is auto_carving_lanes
        switch (raw_enum(o->capture_checks)) {
          case RMMD_CAPTURE_CHECKS_AUTOMATIC:
            break;
          case RMMD_CAPTURE_CHECKS_EVERY_CALL:
            ro.capture = rmmd::capture_checks::every_call;
            break;
          case RMMD_CAPTURE_CHECKS_SLOW_PATH_ONLY:
            ro.capture = rmmd::capture_checks::slow_path_only;
            break;
          default:
            throw rmmd::logic_error("rmmd: options->capture_checks is " +
                                    std::to_string(raw_enum(o->capture_checks)) +
                                    "; use RMMD_CAPTURE_CHECKS_AUTOMATIC (0), _EVERY_CALL (1) or "
                                    "_SLOW_PATH_ONLY (2)");
        }
        auto mr     = !pool.empty()    ? rmmd::ipc_memory_resource(s, pool, ro)
                      : o->device >= 0 ? rmmd::ipc_memory_resource(s, o->device, ro)
                                       : rmmd::ipc_memory_resource(s, ro);
        auto device = mr.pool().device;
        *resource   = new rmmd_resource_s{.mr = std::move(mr), .device = device};
        return;
      }
      case RMMD_RESOURCE_HOST:
        *resource = new rmmd_resource_s{.mr = rmmd::host_memory_resource(s, pool)};
        return;
      case RMMD_RESOURCE_PINNED_HOST:
        *resource = new rmmd_resource_s{.mr = rmmd::pinned_host_memory_resource(s, pool)};
        return;
    }
    throw rmmd::logic_error("rmmd: unknown resource kind " + std::to_string(raw_enum(o->kind)));
  });
}

rmmd_status rmmd_resource_destroy(rmmd_resource_t resource)
{
  return guarded([&] { delete resource; });
}

rmmd_status rmmd_allocate(
    rmmd_resource_t resource, size_t bytes, size_t alignment, void* stream, void** ptr)
{
  if (resource == nullptr || ptr == nullptr) { return null_argument("resource or ptr"); }
  return guarded([&] {
    if (alignment == 0) { alignment = 256; }
    cuda::stream_ref s{static_cast<cudaStream_t>(stream)};
    void* p = std::visit([&](auto& mr) { return mr.allocate(s, bytes, alignment); }, resource->mr);
    if (p != nullptr) { note_allocation(*resource, bytes); }
    *ptr = p;
  });
}

rmmd_status rmmd_deallocate(
    rmmd_resource_t resource, void* ptr, size_t bytes, size_t alignment, void* stream)
{
  if (resource == nullptr) { return null_argument("resource"); }
  if (ptr == nullptr) { return RMMD_SUCCESS; }
  return guarded([&] {
    if (alignment == 0) { alignment = 256; }
    cuda::stream_ref s{static_cast<cudaStream_t>(stream)};
    std::visit([&](auto& mr) { mr.deallocate(s, ptr, bytes, alignment); }, resource->mr);
    note_deallocation(*resource, bytes);
  });
}

rmmd_status rmmd_resource_get_stats(rmmd_resource_t resource, rmmd_resource_stats* stats)
{
  if (resource == nullptr || stats == nullptr) { return null_argument("resource or stats"); }
  if (stats->size < sizeof(std::size_t)) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT, "rmmd: stats->size is not set");
  }
  fill_stats(*resource, stats);
  return RMMD_SUCCESS;
}

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
  // Callers built before allow_writers existed pass the size up to it.
  auto o = read_struct(options, defaults, {offsetof(rmmd_buffer_options, allow_writers)});
  if (!o) { return fail(RMMD_ERROR_INVALID_ARGUMENT, "rmmd: options->size is not a size"); }
  return guarded([&] {
    rmmd::shared_buffer_options so;
    so.allow_writers = o->allow_writers != 0;
    if (o->pool != nullptr) { so.pool = o->pool; }
    so.device     = o->device;
    so.persistent = o->persistent != 0;
    if (o->has_gid != 0) { so.gid = static_cast<gid_t>(o->gid); }
    so.alignment = o->alignment == 0 ? 256 : o->alignment;
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

namespace {

/// The caller's open options, whatever its struct's size (NULL: the
/// defaults); nullopt after setting `*refused` where they cannot be used.
std::optional<rmmd_open_options> read_open_options(rmmd_open_options const* options,
                                                   std::string const& what,
                                                   rmmd_status* refused)
{
  rmmd_open_options defaults{};
  defaults.size = sizeof(defaults);
  auto o =
      read_struct(options,
                  defaults,
                  {offsetof(rmmd_open_options, peer), offsetof(rmmd_open_options, has_device)});
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
  return oo;
}

}  // namespace

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
    auto& impl = session->session.impl();
    rmmd::v1::ListBuffersRequest request;
    if (name_prefix != nullptr) { request.set_name_prefix(name_prefix); }
    if (peer != nullptr) { request.set_peer(peer); }
    std::map<std::string, std::string, std::less<>> labels;
    labels_from_arrays(label_keys, label_values, label_count, &labels, "list buffers");
    rmmd::detail::copy_labels(labels, request.mutable_labels());
    rmmd::v1::ListBuffersResponse response;
    if (auto status = impl.list_buffers(request, &response); !status.ok()) {
      rmmd::detail::throw_status(status, "list buffers");
    }
    *json = copy_string(to_json(response, "list buffers"));
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

rmmd_status rmmd_peers_json(rmmd_session_t session, char** json)
{
  if (session == nullptr || json == nullptr) { return null_argument("session or json"); }
  return guarded([&] {
    rmmd::v1::ListPeersResponse response;
    if (auto status = session->session.impl().list_peers(&response); !status.ok()) {
      rmmd::detail::throw_status(status, "list peers");
    }
    *json = copy_string(to_json(response, "list peers"));
  });
}

rmmd_status rmmd_buffer_describe_json(rmmd_session_t session, char const* name, char** json)
{
  if (session == nullptr || name == nullptr || json == nullptr) {
    return null_argument("session, name or json");
  }
  return guarded([&] {
    auto& impl = session->session.impl();
    rmmd::v1::DescribeBufferResponse response;
    if (auto status = impl.describe_buffer(name, &response); !status.ok()) {
      // The daemon's refusals name the call and the buffer already.
      bool const named = status.error_message().rfind("describe buffer ", 0) == 0;
      rmmd::detail::throw_status(
          status, named ? std::string() : "describe buffer '" + std::string(name) + "'");
    }
    *json = copy_string(to_json(response, "describe buffer"));
  });
}

}  // extern "C"

// ---- PyTorch's pluggable allocator ----------------------------------------

namespace {

/// The process-wide session and per-device resources of the PyTorch entry
/// points. Made at the first allocation and never destroyed: PyTorch may free
/// tensors while the interpreter exits, after any static would have gone,
/// and the process's end closes the session (the daemon then reclaims it
/// all), so nothing needs to run, or print, at exit.
struct torch_allocator {
  static constexpr int max_devices = 64;

  std::mutex mutex;  // guards all but `resources`' loads
  bool started{false};
  bool configured{false};  // rmmd_torch_configure() was called: it wins over the environment
  std::optional<std::string> runtime_dir;
  rmmd_allocation_mode mode{RMMD_MODE_SLAB};
  std::optional<rmmd::session> session;
  std::array<std::atomic<rmmd_resource_s*>, max_devices> resources{};

  static torch_allocator& get()
  {
    static auto* const instance = new torch_allocator;
    return *instance;
  }

  rmmd_resource_s& resource(int device)
  {
    if (device < 0 || device >= max_devices) {
      throw rmmd::logic_error("rmmd: device " + std::to_string(device) + " is not a CUDA device");
    }
    if (auto* r = resources[device].load(std::memory_order_acquire)) { return *r; }
    std::lock_guard lock(mutex);
    if (auto* r = resources[device].load()) { return *r; }
    if (!session) {
      rmmd::session::options o;
      if (runtime_dir) { o.runtime_dir = *runtime_dir; }
      if (!configured) {
        if (char const* m = std::getenv("RMMD_TORCH_MODE")) {
          std::string_view text(m);
          if (text == "direct") {
            mode = RMMD_MODE_DIRECT;
          } else if (text != "slab" && !text.empty()) {
            throw rmmd::logic_error("rmmd: RMMD_TORCH_MODE is '" + std::string(text) +
                                    "'; use slab (the default) or direct");
          }
        }
      }
      o.client_name = "torch";
      session.emplace(std::move(o));
      started = true;
    }
    rmmd::ipc_resource_options ro;
    ro.mode =
        mode == RMMD_MODE_DIRECT ? rmmd::allocation_mode::direct : rmmd::allocation_mode::slab;
    // Graph-safe: PyTorch captures graphs (torch.cuda.graph), its capture
    // stream's allocations would make RMM's pool wait on events of other
    // streams (which CUDA refuses in a capture), and the check's ~30 ns is
    // nothing next to a tensor allocation's own cost in PyTorch.
    ro.capture = rmmd::capture_checks::every_call;
    auto* r    = new rmmd_resource_s{.mr     = rmmd::ipc_memory_resource(*session, device, ro),
                                     .device = device};
    resources[device].store(r, std::memory_order_release);
    return *r;
  }
};

/// The PyTorch entry points' allocation: the status, and the pointer in *ptr (written only
/// when it succeeds: note_allocation() does not throw).
rmmd_status torch_allocate(std::size_t size, int device, void* stream, void** ptr) noexcept
{
  return guarded([&] {
    auto& r = torch_allocator::get().resource(device);
    *ptr    = std::get<rmmd::ipc_memory_resource>(r.mr).allocate(
        cuda::stream_ref{static_cast<cudaStream_t>(stream)}, size, 256);
    if (*ptr != nullptr) { note_allocation(r, size); }
  });
}

}  // namespace

extern "C" {

void* rmmd_torch_malloc(size_t size, int device, void* stream)
{
  void* ptr = nullptr;
  return torch_allocate(size, device, stream, &ptr) == RMMD_SUCCESS ? ptr : nullptr;
}

rmmd_status rmmd_torch_allocate(size_t size, int device, void* stream, void** ptr)
{
  if (ptr == nullptr) { return null_argument("ptr"); }
  return torch_allocate(size, device, stream, ptr);  // writes *ptr only on success
}

void* rmmd_torch_malloc_or_raise(size_t size, int device, void* stream)
{
  void* ptr = nullptr;
  if (torch_allocate(size, device, stream, &ptr) != RMMD_SUCCESS) {
    throw std::runtime_error(last_error);
  }
  return ptr;
}

void rmmd_torch_free(void* ptr, size_t size, int device, void* stream)
{
  if (ptr == nullptr || rmmd::detail::process_is_exiting()) { return; }
  static_cast<void>(guarded([&] {
    auto& r = torch_allocator::get().resource(device);
    std::get<rmmd::ipc_memory_resource>(r.mr).deallocate(
        cuda::stream_ref{static_cast<cudaStream_t>(stream)}, ptr, size, 256);
    note_deallocation(r, size);
  }));
}

rmmd_status rmmd_torch_configure(char const* runtime_dir, rmmd_allocation_mode mode)
{
  if (mode != RMMD_MODE_SLAB && mode != RMMD_MODE_DIRECT) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT,
                "rmmd: mode is neither RMMD_MODE_SLAB nor RMMD_MODE_DIRECT");
  }
  auto& t = torch_allocator::get();
  std::lock_guard lock(t.mutex);
  if (t.started) {
    return fail(RMMD_ERROR_FAILED_PRECONDITION,
                "rmmd: torch allocator: configure before the first allocation; it has begun");
  }
  return guarded([&] {
    t.runtime_dir = runtime_dir == nullptr ? std::nullopt : std::optional<std::string>(runtime_dir);
    t.mode        = mode;
    t.configured  = true;
  });
}

rmmd_status rmmd_torch_get_stats(int device, rmmd_resource_stats* stats)
{
  if (stats == nullptr) { return null_argument("stats"); }
  if (device < 0 || device >= torch_allocator::max_devices) {
    return fail(RMMD_ERROR_INVALID_ARGUMENT,
                "rmmd: device " + std::to_string(device) + " is not a CUDA device");
  }
  auto* r = torch_allocator::get().resources[device].load(std::memory_order_acquire);
  if (r == nullptr) {
    return fail(
        RMMD_ERROR_NOT_FOUND,
        "rmmd: the torch allocator has made no allocation on device " + std::to_string(device));
  }
  return rmmd_resource_get_stats(r, stats);
}

}  // extern "C"
