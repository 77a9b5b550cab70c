#include "client/detail/stream_capture.hpp"

#include "common/driver_entry.hpp"

#include <cuda.h>

#include <new>
#include <utility>

namespace rmmd::detail {
namespace {

using is_capturing_fn = CUresult (*)(CUstream, CUstreamCaptureStatus*);

/// The driver's cuStreamIsCapturing, or null where the runtime cannot give
/// it. Asked on every allocate and free, it is cheaper than the runtime's
/// cudaStreamGetCaptureInfo (bench a8: a one-thread slab pair at 1.38x
/// RMM's pool with the runtime's query on an H200, 1.14x with this one on an
/// H100; about 1.0x before either).
is_capturing_fn load_is_capturing() noexcept
{
  is_capturing_fn fn = nullptr;
  gpu::driver_entry_point("cuStreamIsCapturing", fn, 10000);
  return fn;
}

}  // namespace

cudaGraph_t capturing_graph(cudaStream_t stream) noexcept
{
  static is_capturing_fn const is_capturing = load_is_capturing();
  if (is_capturing != nullptr) {
    // The common answer, cheaply: not capturing. Anything else (a capture,
    // an invalidated one, an error) goes to the runtime, which says which.
    CUstreamCaptureStatus s{CU_STREAM_CAPTURE_STATUS_NONE};
    if (is_capturing(reinterpret_cast<CUstream>(stream), &s) == CUDA_SUCCESS &&
        s == CU_STREAM_CAPTURE_STATUS_NONE) {
      return nullptr;
    }
  }
  cudaStreamCaptureStatus status{cudaStreamCaptureStatusNone};
  cudaGraph_t graph{};
  if (auto err = cudaStreamGetCaptureInfo(stream, &status, nullptr, &graph); err != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  // An invalidated capture has no graph to hold anything: the capture fails
  // at its end, and a free on it is as good as one outside it.
  return status == cudaStreamCaptureStatusActive ? graph : nullptr;
}

relaxed_capture_scope::relaxed_capture_scope() noexcept
{
  previous_ = cudaStreamCaptureModeRelaxed;
  restore_  = cudaThreadExchangeStreamCaptureMode(&previous_) == cudaSuccess;
  if (!restore_) { cudaGetLastError(); }
}

relaxed_capture_scope::~relaxed_capture_scope()
{
  if (restore_ && cudaThreadExchangeStreamCaptureMode(&previous_) != cudaSuccess) {
    cudaGetLastError();
  }
}

std::vector<graph_held_frees::entry> graph_held_frees::take() noexcept
{
  if (!any_released.load(std::memory_order_acquire)) { return {}; }
  std::lock_guard lock(mutex);
  any_released.store(false, std::memory_order_relaxed);
  return std::exchange(released, {});
}

namespace {

/// A CUDA user object's payload: its destructor runs on a CUDA thread, where
/// no CUDA call is allowed, so it only hands the entry to the resource.
struct graph_hold {
  std::shared_ptr<graph_held_frees> frees;
  graph_held_frees::entry e;
  bool held{false};  // false: CUDA refused the graph's reference; the free stays with us

  static void CUDART_CB destroyed(void* self) noexcept
  {
    std::unique_ptr<graph_hold> hold(static_cast<graph_hold*>(self));
    if (!hold->held) { return; }
    try {
      std::lock_guard lock(hold->frees->mutex);
      hold->frees->released.push_back(hold->e);
      hold->frees->any_released.store(true, std::memory_order_release);
    } catch (std::bad_alloc const&) {
      // The daemon reclaims the lease with the session.
    }
  }
};

}  // namespace

bool hold_until_graph_destroyed(cudaGraph_t graph,
                                std::shared_ptr<graph_held_frees> const& frees,
                                graph_held_frees::entry e) noexcept
{
  graph_hold* hold = nullptr;
  try {
    hold = new graph_hold{.frees = frees, .e = e};
  } catch (std::bad_alloc const&) {
    return false;
  }
  relaxed_capture_scope relaxed;
  cudaUserObject_t object{};
  if (cudaUserObjectCreate(
          &object, hold, &graph_hold::destroyed, 1, cudaUserObjectNoDestructorSync) !=
      cudaSuccess) {
    cudaGetLastError();
    delete hold;
    return false;
  }
  // `held` is set before the graph may drop its reference (it cannot before
  // the capture ends, which this thread's free is part of).
  hold->held = true;
  if (cudaGraphRetainUserObject(graph, object, 1, cudaGraphUserObjectMove) != cudaSuccess) {
    cudaGetLastError();
    hold->held = false;
    cudaUserObjectRelease(object, 1);  // its destructor deletes `hold`
    return false;
  }
  return true;
}

}  // namespace rmmd::detail
