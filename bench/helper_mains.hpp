#pragma once

// The helper processes of rmmd_bench: the bench starts itself with a helper
// name as its first argument (posix_spawn, never a plain fork after CUDA
// started), and main() hands such a command line to the helper's main here.

#include <string_view>

namespace rmmd::bench {

/// One helper: its name (argv[1]), the arguments that follow it, and its
/// main, given the whole command line; it returns the exit status (2, with
/// a usage line on stderr, when the arguments are wrong).
struct helper_entry {
  std::string_view name;
  std::string_view usage;
  int (*main)(int argc, char** argv);
};

/// The helper `name` names, or null: the command line is the bench's own.
helper_entry const* find_helper(std::string_view name);

/// Runs the helper argv[1] names; -1 when it names none.
int run_helper(int argc, char** argv);

}  // namespace rmmd::bench
