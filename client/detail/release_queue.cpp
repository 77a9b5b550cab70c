#include "client/detail/release_queue.hpp"

#include <new>

namespace rmmd::detail {

char const* queued_what(queued_call::kind what) noexcept
{
  using kind = queued_call::kind;
  switch (what) {
    case kind::free:
      return "freeing allocation";
    case kind::publish_buffer:
      return "publishing buffer";
    case kind::close_buffer:
      return "closing buffer";
    case kind::drop_block:
      return "dropping packed block";
  }
  return "sending";
}

void release_queue::send_when_reached(queued_call call) noexcept
{
  std::lock_guard lock(mutex);
  if (sender == nullptr) { return; }
  try {
    calls.push_back(call);
  } catch (std::bad_alloc const&) {
    return;  // the daemon reclaims it with the session
  }
  static_cast<void>(sender->try_send_now(calls));
}

std::vector<queued_call> release_queue::take()
{
  std::vector<queued_call> out;
  std::lock_guard lock(mutex);
  out.swap(calls);
  return out;
}

}  // namespace rmmd::detail
