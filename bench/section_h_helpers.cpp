// The helper processes of section h: sessions and leases made by hand on
// the session socket (harness/raw_session.hpp), held until the bench
// closes the helper's stdin or kills it.

#include "bench/section_h.hpp"

#include "harness/raw_session.hpp"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace rmmd::bench {
namespace {

void die_with_parent()
{
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (char const* p = std::getenv("RMMD_BENCH_PARENT"); p != nullptr) {
    if (std::to_string(::getppid()) != p) { std::_Exit(4); }
  }
}

void say(std::string const& line)
{
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

std::string samples_line(std::vector<double> const& ns)
{
  std::string line = "samples";
  for (auto v : ns) { line += " " + std::to_string(static_cast<long long>(v)); }
  return line;
}

}  // namespace

int raw_leases_main(std::string const& dir, std::string const& kind, std::size_t count)
{
  die_with_parent();
  try {
    harness::raw_session s(dir, "rmmd-bench-leases");
    auto const pool =
        s.pool_of(kind == "cuda" ? harness::raw_backend::cuda : harness::raw_backend::host);
    auto const t0 = steady::now();
    // CUDA: packed, as the client library's direct resource asks for them.
    (void)s.allocate(pool, scale_lease_bytes, count, 64, kind == "cuda");
    auto const t1 = steady::now();
    say("ready " + std::to_string(count) + " " +
        std::to_string(std::chrono::duration<double>(t1 - t0).count()));
    for (std::string line; std::getline(std::cin, line);) {}
    return 0;  // the session closes with the process
  } catch (std::exception const& e) {
    say(std::string("error ") + e.what());
    return 1;
  }
}

int raw_sessions_main(std::string const& dir, std::size_t count)
{
  die_with_parent();
  try {
    std::vector<harness::raw_session> sessions;
    sessions.reserve(count);
    std::vector<double> ns;
    ns.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      auto const t0 = steady::now();
      auto& s       = sessions.emplace_back(dir, "rmmd-bench-sessions");
      ns.push_back(std::chrono::duration<double, std::nano>(steady::now() - t0).count());
      (void)s.allocate(s.pool_of(harness::raw_backend::host), scale_lease_bytes, 1);
    }
    say("ready " + std::to_string(count));
    say(samples_line(ns));
    for (std::string line; std::getline(std::cin, line);) {
      std::size_t probes = 0;
      if (std::sscanf(line.c_str(), "probe %zu", &probes) != 1) { continue; }
      ns.clear();
      for (std::size_t i = 0; i < probes; ++i) {
        auto const t0 = steady::now();
        harness::raw_session probe(dir, "rmmd-bench-probe");
        ns.push_back(std::chrono::duration<double, std::nano>(steady::now() - t0).count());
      }
      say(samples_line(ns));
    }
    return 0;
  } catch (std::exception const& e) {
    say(std::string("error ") + e.what());
    return 1;
  }
}

}  // namespace rmmd::bench
