#pragma once

// The check of a CUDA pool's handle_types, shared by the messages that carry
// them: Pool, CudaPoolPerGpu and GpuPoolOverride.

#include "daemon/config/detail/checked_file.hpp"
#include "daemon/config/settings.hpp"

#include <optional>
#include <string>

namespace rmmd::config::detail {

/// handle_types of `m` at `n`: POSIX_FD required, FABRIC makes fabric handles
/// required. nullopt when none are listed (fabric where a probe proves it
/// works, unless something else says).
template <typename Message>
std::optional<fabric_mode> checked_handle_types(checked_file& f,
                                                Message const& m,
                                                node const& n,
                                                std::string const& label)
{
  bool posix = false, fabric = false;
  for (int i = 0; i < m.handle_types_size(); ++i) {
    auto t     = m.handle_types(i);
    bool& seen = t == v1::Pool::POSIX_FD ? posix : fabric;
    if (t != v1::Pool::POSIX_FD && t != v1::Pool::FABRIC) {
      f.error(n, "handle_types", i, "%s: handle type %d is not POSIX_FD or FABRIC", label, t);
    } else if (seen) {
      f.error(n,
              "handle_types",
              i,
              "%s: handle type %s is listed twice",
              label,
              v1::Pool::HandleType_Name(t));
    }
    seen = true;
  }
  if (m.handle_types_size() == 0) { return std::nullopt; }
  if (!posix) {
    f.error(n,
            "handle_types",
            0,
            "%s: handle_types must include POSIX_FD (every CUDA pool exports its fd); write "
            "[POSIX_FD, FABRIC] to require fabric handles",
            label);
  }
  return fabric ? fabric_mode::required : fabric_mode::off;
}

}  // namespace rmmd::config::detail
