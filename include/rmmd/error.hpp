#pragma once

// The exceptions rmmd's client raises (DESIGN.md's error table):
//
//  INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION  -> rmmd::logic_error
//  RESOURCE_EXHAUSTED                                -> rmm::out_of_memory
//  PERMISSION_DENIED                                 -> rmmd::permission_error
//  UNAUTHENTICATED, UNAVAILABLE (daemon gone)        -> rmmd::session_error
//  anything else                                     -> rmm::bad_alloc
//
// permission_error and session_error derive from rmm::bad_alloc, so code that
// already handles RMM allocation failures handles a refused or lost session.

#include <rmm/error.hpp>

namespace rmmd {

/// The request was wrong: bad size or alignment, unknown pool or allocation.
struct logic_error : public rmm::logic_error {
  using rmm::logic_error::logic_error;
};

/// The daemon refused the caller: uid not allowed, or not the holder.
class permission_error : public rmm::bad_alloc {
 public:
  using rmm::bad_alloc::bad_alloc;
};

/// No usable session: the daemon is not running, has gone away, is draining,
/// or does not know the session.
class session_error : public rmm::bad_alloc {
 public:
  using rmm::bad_alloc::bad_alloc;
};

}  // namespace rmmd
