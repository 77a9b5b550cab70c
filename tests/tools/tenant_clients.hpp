#pragma once

// Test support for the tenant-isolation tests (tests/integration and
// tests/gpu tenant_isolation_test.cpp): the hostile rmmd_test_client
// (snoop-host, snoop-device) asked to look for a secret, and what it said.

#include "tests/tools/child_process.hpp"

#include <string>
#include <vector>

namespace rmmd::test {

/// What a snooping client printed for one "scan HEX": every line up to and
/// including "scanned BYTES" (or up to its exit or a 60 s silence, then the
/// last line says so).
struct scan_report {
  std::vector<std::string> lines;

  /// The lines that say it found the secret ("found WHERE at OFFSET").
  [[nodiscard]] std::vector<std::string> finds() const
  {
    std::vector<std::string> out;
    for (auto const& l : lines) {
      if (l.rfind("found ", 0) == 0) { out.push_back(l); }
    }
    return out;
  }
  /// True when the scan ran to its end ("scanned BYTES" came).
  [[nodiscard]] bool complete() const
  {
    return !lines.empty() && lines.back().rfind("scanned ", 0) == 0;
  }
  /// Every line, one per row, for a failure message.
  [[nodiscard]] std::string text() const
  {
    std::string out;
    for (auto const& l : lines) { out += "  " + l + "\n"; }
    return out;
  }
};

/// Asks `snoop` to look for `secret_hex` everywhere it can read.
inline scan_report scan_for(child_process& snoop, std::string const& secret_hex)
{
  scan_report report;
  snoop.write_line("scan " + secret_hex);
  while (true) {
    auto line = snoop.read_line(60s);
    if (!line) {
      report.lines.emplace_back("(the snooping client said nothing more)");
      return report;
    }
    report.lines.push_back(*line);
    if (line->rfind("scanned ", 0) == 0) { return report; }
  }
}

}  // namespace rmmd::test
