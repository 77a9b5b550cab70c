// librmmd_c's peers: other nodes' daemons this node's daemon peers with.

#include "client/c_api/c_internal.hpp"

#include <rmmd/admin.hpp>

using rmmd::c_api::guarded;
using rmmd::c_api::null_argument;

extern "C" {

rmmd_status rmmd_peers_json(rmmd_session_t session, char** json)
{
  if (session == nullptr || json == nullptr) { return null_argument("session or json"); }
  return guarded(
      [&] { *json = rmmd::c_api::copy_string(rmmd::admin(session->session).peers_json()); });
}

}  // extern "C"
