#include "daemon/version.hpp"

namespace rmmd {

std::string_view daemon_version() noexcept
{
  return RMMD_VERSION;
}

}  // namespace rmmd
