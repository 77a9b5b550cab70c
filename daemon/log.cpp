#include "daemon/log.hpp"

#include <algorithm>
#include <utility>
#include <vector>

namespace rmmd::log {
namespace {

/// Every rate_limit alive, for report_suppressed(). Never destroyed: a
/// rate_limit of static storage may unregister after main() returns.
struct registry {
  std::mutex mutex;
  std::vector<rate_limit*> limits;
};

registry& limits()
{
  static auto* r = new registry;
  return *r;
}

}  // namespace

void write_line(level l, std::string_view text)
{
  std::string line = absl::StrFormat("<%d>rmmd: ", static_cast<int>(l));
  line.reserve(line.size() + text.size() + 1);
  for (char c : text) {
    auto const u = static_cast<unsigned char>(c);
    if (c == '\n') {
      line += "\\n";
    } else if (u < 0x20 || u == 0x7f) {
      line += absl::StrFormat("\\x%02x", u);
    } else {
      line += c;
    }
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

rate_limit::rate_limit(std::string what, double per_second, double burst)
    : what_(std::move(what)), per_second_(per_second), burst_(burst), tokens_(burst)
{
  auto& r = limits();
  std::lock_guard lock(r.mutex);
  r.limits.push_back(this);
}

rate_limit::~rate_limit()
{
  auto& r = limits();
  std::lock_guard lock(r.mutex);
  std::erase(r.limits, this);
}

bool rate_limit::take(level l, std::uint64_t& suppressed) noexcept
{
  std::lock_guard lock(mutex_);
  auto const now = clock::now();
  tokens_ =
      std::min(burst_, tokens_ + per_second_ * std::chrono::duration<double>(now - last_).count());
  last_ = now;
  if (tokens_ < 1.0) {
    ++suppressed_;
    if (static_cast<int>(l) < static_cast<int>(suppressed_level_)) { suppressed_level_ = l; }
    return false;
  }
  tokens_ -= 1.0;
  suppressed        = std::exchange(suppressed_, 0);
  suppressed_level_ = level::debug;
  return true;
}

void rate_limit::report() noexcept
{
  std::uint64_t n = 0;
  level l         = level::debug;
  {
    std::lock_guard lock(mutex_);
    n = std::exchange(suppressed_, 0);
    l = std::exchange(suppressed_level_, level::debug);
  }
  if (n == 0) { return; }
  try {
    write_line(l, absl::StrFormat("%d similar line(s) suppressed: %s", n, what_));
  } catch (...) {
    // Out of memory for one log line: the count is lost, nothing else.
  }
}

void report_suppressed() noexcept
{
  auto& r = limits();
  std::lock_guard lock(r.mutex);
  for (auto* limit : r.limits) { limit->report(); }
}

}  // namespace rmmd::log
