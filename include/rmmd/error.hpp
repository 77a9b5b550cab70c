#pragma once

// The exceptions rmmd's client raises (DESIGN.md's error table):
//
//  INVALID_ARGUMENT                                  -> rmmd::logic_error
//  FAILED_PRECONDITION                               -> rmmd::precondition_error
//  NOT_FOUND                                         -> rmmd::not_found_error
//  ALREADY_EXISTS (a shared buffer's name is taken)  -> rmmd::already_exists_error
//  RESOURCE_EXHAUSTED                                -> rmm::out_of_memory
//  PERMISSION_DENIED                                 -> rmmd::permission_error
//  UNAUTHENTICATED, UNAVAILABLE (daemon gone)        -> rmmd::session_error
//  DEADLINE_EXCEEDED from the daemon (a wait it ended) -> rmmd::deadline_error
//  DEADLINE_EXCEEDED of the call itself (no answer)  -> rmmd::session_error
//  anything else                                     -> rmm::bad_alloc
//
// permission_error, session_error and deadline_error derive from
// rmm::bad_alloc, so code that already handles RMM allocation failures
// handles a refused or lost session.

#include <rmm/error.hpp>

namespace rmmd {

/// The request was wrong: bad size or alignment, unknown pool or allocation.
struct logic_error : public rmm::logic_error {
  using rmm::logic_error::logic_error;
};

/// No such allocation or shared buffer (a logic_error: the caller named
/// something that is not there).
struct not_found_error : public logic_error {
  using logic_error::logic_error;
};

/// The request cannot be served in the state things are in: a shared buffer
/// not published yet, a publish by another than its creator or a second one,
/// a pool without the handle type asked for.
struct precondition_error : public logic_error {
  using logic_error::logic_error;
};

/// A shared buffer of that name exists already.
struct already_exists_error : public logic_error {
  using logic_error::logic_error;
};

/// The daemon refused the caller: uid not allowed, or not the holder.
class permission_error : public rmm::bad_alloc {
 public:
  using rmm::bad_alloc::bad_alloc;
};

/// A wait the caller bounded ended before what it waited for came, and the
/// daemon said so: a shared buffer's write lease still held by another
/// session (docs/failover.md). Nothing changed; the session is fine.
class deadline_error : public rmm::bad_alloc {
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
