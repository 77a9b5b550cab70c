#pragma once

// Private to librmmd_client and rmmd's own tools: what an rmmd::session
// shares between its copies. Public headers never include this (no gRPC
// outside).
//
// It owns nothing but its parts, each with its own state and locks:
// - session_channel: one call() for every request (it chooses the
//   transport and decides reconnects), over parts of its own: the session
//   socket, the daemon's ids and token, the reader thread, the release
//   queue (session_channel.hpp);
// - pool_mappings: the pools and this process's mappings and imports of them;
// - usage_reports: carved-usage reports and reclaim watches;
// - packed_block_imports (client/packed_block_imports.hpp): the imports of
//   packed blocks, for ipc_memory_resource's direct path;
// - buffer_views: the shared buffers this process holds.
// The members below only translate between the public API and those parts.
// Destruction: the channel stops its reader and detaches the release queue
// first; then the parts go in reverse order, the channel (the socket's close
// ends the session in the daemon) last.

#include <rmmd/session.hpp>

#include "client/detail/buffer_views.hpp"
#include "client/detail/pool_mappings.hpp"
#include "client/detail/process_exit.hpp"
#include "client/detail/session_channel.hpp"
#include "client/detail/usage_reports.hpp"
#include "client/packed_block_imports.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rmmd::detail {

class session_impl {
 public:
  explicit session_impl(session::options opts);
  session_impl(session_impl const&)            = delete;
  session_impl& operator=(session_impl const&) = delete;
  ~session_impl();

  session::options const options;

  [[nodiscard]] session_channel& channel() noexcept
  {
    return channel_;
  }
  [[nodiscard]] pool_mappings& mappings() noexcept
  {
    return mappings_;
  }
  [[nodiscard]] usage_reports& reports() noexcept
  {
    return reports_;
  }
  [[nodiscard]] packed_block_imports& packed() noexcept
  {
    return packed_;
  }
  [[nodiscard]] buffer_views& buffers() noexcept
  {
    return buffers_;
  }

  /// A lease, and where it lies when it is packed.
  struct granted_lease {
    lease granted;  ///< its id a client id (session_channel.hpp)
    /// The daemon that granted it (session_channel.hpp): its pool mappings
    /// are those of this generation.
    std::uint32_t generation{};
    std::uint64_t block_id{};  ///< 0: an allocation of its own
    std::uint64_t block_offset{};
  };
  /// Allocate, checked (session::allocate). With `may_pack` (and the session
  /// socket), the daemon may carve a small CUDA allocation out of a packed
  /// block (AllocateRequest.may_pack): the caller finds it with
  /// packed().base(). Throws as error.hpp says.
  granted_lease lease_memory(std::uint32_t pool_id,
                             std::size_t bytes,
                             std::size_t alignment,
                             bool may_pack);

  /// Single calls through the channel, unchecked: each returns the call's
  /// status (tests send what a well-behaved client would not).
  [[nodiscard]] grpc::Status allocate(v1::AllocateRequest const& request,
                                      v1::AllocateResponse* response);
  [[nodiscard]] grpc::Status free(v1::FreeRequest const& request);
  [[nodiscard]] grpc::Status create_buffer(v1::CreateBufferRequest const& request,
                                           v1::BufferGrant* grant);
  /// An open that may wait (`wait` > 0) and finds the buffer missing or
  /// unpublished waits for it, up to `wait`.
  [[nodiscard]] grpc::Status open_buffer(std::string const& name,
                                         std::chrono::milliseconds wait,
                                         v1::BufferGrant* grant);
  /// The same with the request's access and fingerprint guard.
  [[nodiscard]] grpc::Status open_buffer(v1::OpenBufferRequest const& request,
                                         v1::BufferGrant* grant);
  /// A standby's WaitBufferLease (gRPC whatever the transport: the daemon
  /// holds the call), for up to `wait` (at most 2^32-1 ms), within the
  /// call's deadline of `wait` plus call_timeout.
  [[nodiscard]] grpc::Status wait_buffer_lease(std::uint64_t id,
                                               std::chrono::milliseconds wait,
                                               v1::WaitBufferLeaseResponse* response);
  /// The manifest and listing calls: gRPC whatever the transport (a manifest
  /// does not fit a session-socket datagram).
  [[nodiscard]] grpc::Status set_buffer_manifest(v1::SetBufferManifestRequest const& request);
  [[nodiscard]] grpc::Status get_buffer_manifest(std::uint64_t id, v1::BufferManifest* manifest);
  [[nodiscard]] grpc::Status describe_buffer(std::string const& name,
                                             v1::DescribeBufferResponse* response);
  [[nodiscard]] grpc::Status list_buffers(v1::ListBuffersRequest const& request,
                                          v1::ListBuffersResponse* response);
  /// The daemon's peers (ListPeers): other nodes' daemons, their state and
  /// the holds each way; none from a daemon that serves no ListPeers.
  [[nodiscard]] grpc::Status list_peers(v1::ListPeersResponse* response);
  [[nodiscard]] grpc::Status publish_buffer(std::uint64_t id);
  /// Ends one of the session's opens of buffer `id`: one of `hold` (the
  /// default: a read open) where it has one.
  [[nodiscard]] grpc::Status close_buffer(std::uint64_t id,
                                          v1::BufferHold hold = v1::BUFFER_HOLD_READ);
  /// One round trip on the session socket that changes nothing.
  /// FAILED_PRECONDITION when the session's calls go over gRPC.
  [[nodiscard]] grpc::Status ping();

  /// What rmmd's tools and the resources reach through the channel.
  using queued_call   = session_channel::queued_call;
  using release_queue = session_channel::release_queue;
  /// For a call made on stub() itself: reconnects first when the daemon
  /// went away (session_channel::context). unary() also tries again.
  [[nodiscard]] std::unique_ptr<grpc::ClientContext> context()
  {
    return channel_.context();
  }
  /// One call of the Rmmd service through the channel's call(): `method`
  /// of the stub of now, reconnecting as every call does.
  template <class Request, class Response>
  [[nodiscard]] grpc::Status unary(grpc::Status (v1::Rmmd::Stub::*method)(grpc::ClientContext*,
                                                                          Request const&,
                                                                          Response*),
                                   Request const& request,
                                   Response* response)
  {
    return channel_.call([&](v1::Rmmd::Stub& stub, grpc::ClientContext* ctx, std::uint32_t) {
      response->Clear();
      return (stub.*method)(ctx, request, response);
    });
  }
  [[nodiscard]] v1::Rmmd::Stub& stub() const noexcept
  {
    return channel_.stub();
  }
  [[nodiscard]] std::string token_hex() const
  {
    return channel_.token_hex();
  }
  [[nodiscard]] bool uses_session_calls() const noexcept
  {
    return channel_.uses_session_calls();
  }
  [[nodiscard]] std::shared_ptr<release_queue> const& releases() const noexcept
  {
    return channel_.releases();
  }
  /// From a CUDA host function: frees allocation `id` now that the stream
  /// freed its import (session_channel::send_when_reached).
  static void free_when_reached(release_queue& queue, std::uint64_t id) noexcept
  {
    session_channel::send_when_reached(queue,
                                       queued_call{.what = queued_call::kind::free, .id = id});
  }
  static void send_when_reached(release_queue& queue, queued_call call) noexcept
  {
    session_channel::send_when_reached(queue, call);
  }

  /// Registers the process-exit watch (process_exit.hpp) for a buffer,
  /// before its memory is imported (CUDA may not have started yet).
  void watch_exit_once() noexcept
  {
    watch_process_exit_before_cuda();
  }

 private:
  /// For the constructor: hands the welcome to the mappings.
  session_welcome&& take_welcome() noexcept;

  session_welcome welcome_;  // the constructor's only
  session_channel channel_;
  pool_mappings mappings_;
  usage_reports reports_;
  packed_block_imports packed_;
  buffer_views buffers_;
};

}  // namespace rmmd::detail
