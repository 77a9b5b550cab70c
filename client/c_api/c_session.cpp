// librmmd_c's sessions: create and destroy, what the welcome said (id,
// pools), and the daemon's stats.

#include "client/c_api/c_internal.hpp"

#include <rmmd/admin.hpp>

#include <chrono>
#include <cstdio>
#include <string>

using rmmd::c_api::fail;
using rmmd::c_api::guarded;
using rmmd::c_api::null_argument;

namespace {

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

/// The C++ options of checked C ones.
rmmd::session::options to_session_options(rmmd_session_options const& o)
{
  rmmd::session::options so;
  if (o.reconnect_ms < 0) {
    so.reconnect = std::chrono::milliseconds(0);
  } else if (o.reconnect_ms > 0) {
    so.reconnect = std::chrono::milliseconds(o.reconnect_ms);
  }
  if (o.on_reconnect != nullptr) {
    so.on_reconnect = [fn   = o.on_reconnect,
                       user = o.on_reconnect_user_data](rmmd::reconnect_info const& i) {
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
  if (o.runtime_dir != nullptr) { so.runtime_dir = o.runtime_dir; }
  if (o.client_name != nullptr) { so.client_name = o.client_name; }
  so.lease_calls =
      o.use_grpc != 0 ? rmmd::call_transport::grpc : rmmd::call_transport::session_socket;
  so.import_by_fabric = o.import_by_fabric != 0;
  if (o.call_timeout_ms != 0) { so.call_timeout = std::chrono::milliseconds(o.call_timeout_ms); }
  return so;
}

}  // namespace

extern "C" {

rmmd_status rmmd_session_create(rmmd_session_options const* options, rmmd_session_t* session)
{
  if (session == nullptr) { return null_argument("session"); }
  rmmd_session_options defaults{};
  defaults.size = sizeof(defaults);
  // 40: the layout before reconnect_ms, on_reconnect and its user data.
  auto o =
      rmmd::c_api::read_struct(options, defaults, {offsetof(rmmd_session_options, on_reconnect)});
  if (!o) { return fail(RMMD_ERROR_INVALID_ARGUMENT, "rmmd: options->size is not a size"); }
  return guarded([&] { *session = new rmmd_session_s{rmmd::session(to_session_options(*o))}; });
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
    *json = rmmd::c_api::copy_string(out);
  });
}

rmmd_status rmmd_session_stats_json(rmmd_session_t session, char** json)
{
  if (session == nullptr || json == nullptr) { return null_argument("session or json"); }
  return guarded(
      [&] { *json = rmmd::c_api::copy_string(rmmd::admin(session->session).stats_json()); });
}

}  // extern "C"
