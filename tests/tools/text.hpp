#pragma once

// Reading what a program printed: its lines, and protobuf's JSON mapping of
// a message (rmmctl --json).

#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace rmmd::test {

/// `text` split at newlines (no empty last line for a trailing newline).
inline std::vector<std::string> lines_of(std::string const& text)
{
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) { out.push_back(line); }
  return out;
}

/// `text` as a `Message` in protobuf's JSON mapping; a failure is the test's.
template <typename Message>
Message parse_json(std::string const& text)
{
  Message m;
  auto status = google::protobuf::util::JsonStringToMessage(text, &m);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << text;
  return m;
}

}  // namespace rmmd::test
