#pragma once

// Proving that a GPU can export fabric handles before any fabric pool exists.
//
// Why a child process: on a host without an IMEX channel a fabric pool
// creates and allocates fine, its export fails with cudaErrorNotPermitted, and
// destroying that pool then kills the process with SIGSEGV (DESIGN.md, seen on
// driver 580). So the one real export attempt happens in a short-lived child
// (fork+exec of rmmd itself), whose crash costs nothing.

#include <filesystem>
#include <string>

namespace rmmd::backends::cuda {

struct fabric_support {
  bool usable{false};
  std::string reason{};  ///< why not, in words an operator can act on
};

/// Checks the device attribute and the IMEX channel device, then tries one
/// export in a child (`rmmd_exe --probe-fabric DEVICE`).
fabric_support probe_fabric(int device, std::filesystem::path const& rmmd_exe);

/// The child's side: makes a small fabric pool on `device`, exports it, prints
/// one line ("ok" or the CUDA error) and leaves with _exit() without
/// destroying the pool. Returns only on argument errors.
[[noreturn]] void run_fabric_probe(int device);

}  // namespace rmmd::backends::cuda
