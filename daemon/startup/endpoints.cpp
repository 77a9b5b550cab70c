#include "daemon/startup/endpoints.hpp"

#include "daemon/core/buffer_manifest_checks.hpp"
#include "daemon/log.hpp"
#include "daemon/metrics/prometheus_text.hpp"
#include "daemon/startup/runtime_dir_setup.hpp"
#include "daemon/version.hpp"
#include "daemon/wire/calls.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace rmmd::startup {
namespace {

/// The largest gRPC message the daemon accepts: what the settings say, and
/// never less than a manifest of the largest size with room for its request.
std::size_t grpc_message_bytes(config::daemon_settings const& settings)
{
  return std::max(settings.max_message_bytes, core::max_manifest_bytes + 64 * 1024);
}

}  // namespace

std::unique_ptr<endpoints> endpoints::start(core::daemon_core& core,
                                            config::daemon_settings const& settings,
                                            peering::probe_exchange probes)
{
  std::unique_ptr<endpoints> e(new endpoints(core));
  e->metrics_top_sessions_ = settings.metrics_top_sessions;
  if (!e->start_peering(settings, std::move(probes)) || !e->start_metrics(settings) ||
      !e->start_grpc(settings) || !e->start_sessions(settings)) {
    return nullptr;
  }
  return e;
}

endpoints::endpoints(core::daemon_core& core)
    : core_(core),
      daemon_metrics_(core,
                      std::string(daemon_version()),
                      wire::call_names(wire::transport::grpc),
                      wire::call_names(wire::transport::session_socket)),
      service_(core, daemon_metrics_.grpc_calls())
{
}

endpoints::~endpoints()
{
  stop();
}

std::size_t endpoints::open_sessions() const noexcept
{
  return listener_ ? listener_->open_sessions() : 0;
}

void endpoints::reconfigure(config::daemon_settings const& settings)
{
  listener_->set_admission_limits(settings.admission);
  metrics_top_sessions_ = settings.metrics_top_sessions;
  if (peering_) { peering_->reload(settings.peering); }
}

void endpoints::stop_accepting()
{
  listener_->stop_accepting();
}

void endpoints::stop()
{
  if (peering_) { peering_->stop(); }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
    ::unlink(grpc_path_.c_str());
  }
  if (listener_) {
    listener_->stop();
    listener_.reset();
  }
}

bool endpoints::start_metrics(config::daemon_settings const& settings)
{
  if (settings.metrics_address.empty()) { return true; }
  try {
    metrics_ = std::make_unique<metrics::metrics_server>(settings.metrics_address, [this] {
      auto text =
          render_prometheus(daemon_metrics_.snapshot(),
                            metrics::render_options{.top_sessions = metrics_top_sessions_.load()});
      if (peering_) { text += peering_->metrics_text(); }
      return text;
    });
  } catch (std::exception const& e) {
    log::error("metrics_address %s: %s", settings.metrics_address, e.what());
    return false;
  }
  service_.set_metrics_address(metrics_->address());
  log::info("metrics: http://%s/metrics", metrics_->address());
  return true;
}

bool endpoints::start_grpc(config::daemon_settings const& settings)
{
  grpc_path_ = settings.runtime_dir / "rmmd.sock";
  grpc::ServerBuilder builder;
  ::unlink(grpc_path_.c_str());
  builder.AddListeningPort("unix:" + grpc_path_.string(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service_);
  service_.set_request_caps(settings.max_message_bytes, grpc_message_bytes(settings));
  builder.SetMaxReceiveMessageSize(static_cast<int>(grpc_message_bytes(settings)));
  // The sync server's threads notice a shutdown only when their completion
  // queue poll times out (1 s by default): poll more often so SIGTERM is quick.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::CQ_TIMEOUT_MSEC, 50);
  server_ = builder.BuildAndStart();
  if (!server_) {
    log::error("cannot listen on %s (is another rmmd running?)", grpc_path_.string());
    return false;
  }
  if (::chmod(grpc_path_.c_str(), settings.socket_mode) != 0 ||
      !give_to_group(grpc_path_, settings)) {
    log::error("cannot set the mode or group of %s", grpc_path_.string());
    return false;
  }
  return true;
}

bool endpoints::start_sessions(config::daemon_settings const& settings)
{
  auto const path = settings.runtime_dir / "rmmd-session.sock";
  listener_       = std::make_unique<session_socket::session_listener>(
      core_,
      session_socket::listener_options{
                .socket_path       = path,
                .hello_deadline    = settings.hello_timeout,
                .admission         = settings.admission,
                .max_message_bytes = static_cast<std::uint32_t>(grpc_message_bytes(settings)),
                .socket_mode       = settings.socket_mode,
                .call_metrics      = &daemon_metrics_.session_calls(),
                .admission_metrics = &daemon_metrics_.admission()});
  try {
    listener_->start();
  } catch (std::exception const& e) {
    log::error("cannot listen on the session socket: %s", e.what());
    return false;
  }
  return give_to_group(path, settings);
}

bool endpoints::start_peering(config::daemon_settings const& settings,
                              peering::probe_exchange probes)
{
  if (!settings.peering.enabled()) { return true; }
  if (!probes.import) { probes = peering::no_fabric_probe(); }
  peering_ = peering::peering::start(core_, settings.peering, std::move(probes));
  if (!peering_) { return false; }
  service_.set_remote_buffers(peering_.get());
  return true;
}

}  // namespace rmmd::startup
