// librmmd_c's memory resources: device (rmmd::ipc_memory_resource), host
// and pinned host resources over a session, their allocations, and the
// figures rmmd_resource_get_stats reports of each handle.

#include "client/c_api/c_internal.hpp"

#include <string>
#include <string_view>

static_assert(RMMD_CARVING_LANES_AUTO == rmmd::auto_carving_lanes);
static_assert(RMMD_CAPTURE_CHECKS_AUTOMATIC == static_cast<int>(rmmd::capture_checks::automatic));
static_assert(RMMD_CAPTURE_CHECKS_EVERY_CALL == static_cast<int>(rmmd::capture_checks::every_call));
static_assert(RMMD_CAPTURE_CHECKS_SLOW_PATH_ONLY ==
              static_cast<int>(rmmd::capture_checks::slow_path_only));

using rmmd::c_api::fail;
using rmmd::c_api::guarded;
using rmmd::c_api::null_argument;
using rmmd::c_api::raw_enum;

namespace rmmd::c_api {

void note_allocation(rmmd_resource_s& r, std::size_t bytes) noexcept
{
  auto now = r.allocated.fetch_add(bytes) + bytes;
  r.count.fetch_add(1);
  r.total.fetch_add(1);
  auto high = r.high_water.load();
  while (now > high && !r.high_water.compare_exchange_weak(high, now)) {}
}

void note_deallocation(rmmd_resource_s& r, std::size_t bytes) noexcept
{
  r.allocated.fetch_sub(bytes);
  r.count.fetch_sub(1);
}

}  // namespace rmmd::c_api

namespace {

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

/// The device resource's options of checked C ones; throws for an unknown
/// capture_checks.
rmmd::ipc_resource_options to_ipc_options(rmmd_resource_options const& o)
{
  rmmd::ipc_resource_options ro;
  ro.mode          = raw_enum(o.mode) == RMMD_MODE_DIRECT ? rmmd::allocation_mode::direct
                                                          : rmmd::allocation_mode::slab;
  ro.carving_lanes = o.carving_lanes;  // RMMD_CARVING_LANES_AUTO is auto_carving_lanes
  switch (raw_enum(o.capture_checks)) {
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
                              std::to_string(raw_enum(o.capture_checks)) +
                              "; use RMMD_CAPTURE_CHECKS_AUTOMATIC (0), _EVERY_CALL (1) or "
                              "_SLOW_PATH_ONLY (2)");
  }
  return ro;
}

/// A new handle of the resource checked C options `o` ask for on `s`.
rmmd_resource_s* make_resource(rmmd::session const& s, rmmd_resource_options const& o)
{
  std::string_view pool = o.pool == nullptr ? std::string_view{} : std::string_view(o.pool);
  switch (raw_enum(o.kind)) {
    case RMMD_RESOURCE_DEVICE: {
      auto const ro = to_ipc_options(o);
      auto mr       = !pool.empty()   ? rmmd::ipc_memory_resource(s, pool, ro)
                      : o.device >= 0 ? rmmd::ipc_memory_resource(s, o.device, ro)
                                      : rmmd::ipc_memory_resource(s, ro);
      auto device   = mr.pool().device;
      return new rmmd_resource_s{.mr = std::move(mr), .device = device};
    }
    case RMMD_RESOURCE_HOST:
      return new rmmd_resource_s{.mr = rmmd::host_memory_resource(s, pool)};
    case RMMD_RESOURCE_PINNED_HOST:
      return new rmmd_resource_s{.mr = rmmd::pinned_host_memory_resource(s, pool)};
  }
  throw rmmd::logic_error("rmmd: unknown resource kind " + std::to_string(raw_enum(o.kind)));
}

}  // namespace

extern "C" {

rmmd_status rmmd_resource_create(rmmd_session_t session,
                                 rmmd_resource_options const* options,
                                 rmmd_resource_t* resource)
{
  if (session == nullptr || resource == nullptr) { return null_argument("session or resource"); }
  auto o = rmmd::c_api::read_struct(
      options,
      rmmd_resource_options{.size           = sizeof(rmmd_resource_options),
                            .kind           = RMMD_RESOURCE_DEVICE,
                            .device         = -1,
                            .pool           = nullptr,
                            .mode           = RMMD_MODE_SLAB,
                            .carving_lanes  = RMMD_CARVING_LANES_AUTO,
                            .capture_checks = RMMD_CAPTURE_CHECKS_AUTOMATIC},
      {offsetof(rmmd_resource_options, capture_checks)});  // before capture_checks
  if (!o) { return fail(RMMD_ERROR_INVALID_ARGUMENT, "rmmd: options->size is not a size"); }
  return guarded([&] { *resource = make_resource(session->session, *o); });
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
    if (p != nullptr) { rmmd::c_api::note_allocation(*resource, bytes); }
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
    rmmd::c_api::note_deallocation(*resource, bytes);
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

}  // extern "C"
