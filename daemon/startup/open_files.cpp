#include "daemon/startup/open_files.hpp"

#include "daemon/log.hpp"

#include <sys/resource.h>

namespace rmmd::startup {

unsigned long raise_open_file_limit() noexcept
{
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) { return 0; }
  if (limit.rlim_cur < limit.rlim_max) {
    auto const was = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      rmmd::log::write(rmmd::log::level::debug,
                       "open-file limit raised from %lu to %lu (the hard limit)",
                       static_cast<unsigned long>(was),
                       static_cast<unsigned long>(limit.rlim_cur));
    } else {
      limit.rlim_cur = was;
    }
  }
  return static_cast<unsigned long>(limit.rlim_cur);
}

}  // namespace rmmd::startup
