#pragma once

#include <thread>

namespace rmmd::test {

template <typename Condition>
bool eventually(Condition&& condition, std::chrono::milliseconds timeout)
{
  auto const deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) { return false; }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a poll interval, not a wait
  }
  return true;
}

}  // namespace rmmd::test
