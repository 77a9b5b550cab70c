#pragma once

// Private to librmmd_client, librmmd_c and rmmd's tests: the way from a
// public rmmd::session to the detail::session_impl its copies share. The
// public header only names this struct as a friend; nothing installed
// defines it, so a program outside the tree has no way in.

#include <rmmd/session.hpp>

#include "client/detail/session_impl.hpp"

namespace rmmd::detail {

struct session_access {
  [[nodiscard]] static session_impl& impl(session const& s) noexcept
  {
    return *s.impl_;
  }
};

/// The implementation behind `s` (shared by every copy of it).
[[nodiscard]] inline session_impl& impl_of(session const& s) noexcept
{
  return session_access::impl(s);
}

}  // namespace rmmd::detail
