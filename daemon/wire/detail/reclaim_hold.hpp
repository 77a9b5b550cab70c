#pragma once

// What Allocate and CreateBuffer share: how a call reads the core's reclaim
// hold (see transport_rules::may_hold).

#include "daemon/core/daemon_core.hpp"
#include "daemon/wire/calls.hpp"
#include "daemon/wire/proto_convert.hpp"

#include <absl/status/status.h>

#include <variant>

namespace rmmd::wire::detail {

/// The one place that reads the core's reclaim hold: with rules.may_hold the
/// request is made so that the core holds it rather than wait for idle slabs
/// (`*held` set: the caller makes it again from a thread that may block);
/// otherwise so that it waits. Puts a grant into `reply` on success.
template <typename Hold, typename Wait, typename Reply>
absl::Status wait_or_hold(
    transport_rules rules, bool* held, Hold&& make_or_hold, Wait&& make_waiting, Reply* reply)
{
  auto answer = [&]() -> std::variant<decltype(make_waiting()), core::reclaim_hold> {
    if (rules.may_hold) { return make_or_hold(); }
    return make_waiting();
  }();
  if (std::holds_alternative<core::reclaim_hold>(answer)) {
    *held = true;
    return absl::OkStatus();
  }
  auto& grant = std::get<0>(answer);
  if (!grant.ok()) { return grant.status(); }
  to_proto(*grant, reply);
  return absl::OkStatus();
}

}  // namespace rmmd::wire::detail
