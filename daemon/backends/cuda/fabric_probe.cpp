#include "daemon/backends/cuda/fabric_probe.hpp"

#include <rmm/mr/cuda_async_memory_resource.hpp>

#include <absl/strings/str_format.h>

#include <cuda_runtime_api.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>

extern char** environ;

namespace rmmd::backends::cuda {
namespace {

constexpr char const* channel_dir = "/dev/nvidia-caps-imex-channels";

std::string imex_advice()
{
  return std::string("fabric handles need an IMEX channel device (") + channel_dir +
         "/channelN) that rmmd's user and its clients can read and write: run the nvidia-imex "
         "service, or create one as root with `mknod -m 0666 " +
         channel_dir +
         "/channel0 c <major of nvidia-caps-imex-channels in /proc/devices> 0` (or -m 0660 and "
         "chgrp to a group of rmmd and its clients)";
}

/// "channel0 (mode 0644, owner 0:0)": a channel this process may not use.
std::string unusable(std::filesystem::path const& path)
{
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) { return path.filename().string(); }
  return absl::StrFormat("%s (mode %04o, owner %u:%u)",
                         path.filename().string(),
                         st.st_mode & 07777,
                         st.st_uid,
                         st.st_gid);
}

}  // namespace

fabric_support probe_fabric(int device, std::filesystem::path const& rmmd_exe)
{
  int types = 0;
  if (cudaDeviceGetAttribute(&types, cudaDevAttrMemoryPoolSupportedHandleTypes, device) !=
          cudaSuccess ||
      (types & cudaMemHandleTypeFabric) == 0) {
    cudaGetLastError();
    return {false,
            "the driver does not offer fabric handles for device " + std::to_string(device) +
                " (cudaDevAttrMemoryPoolSupportedHandleTypes lacks cudaMemHandleTypeFabric): it "
                "needs a driver >= 530 and a GPU that supports them"};
  }
  bool any_channel = false;
  std::string others;  // those this uid cannot read and write
  std::error_code ec;
  for (auto const& entry : std::filesystem::directory_iterator(channel_dir, ec)) {
    if (::access(entry.path().c_str(), R_OK | W_OK) == 0) {
      any_channel = true;
    } else {
      others += (others.empty() ? "" : ", ") + unusable(entry.path());
    }
  }
  if (!any_channel && !others.empty()) {
    return {false,
            "no usable IMEX channel: uid " + std::to_string(::geteuid()) +
                " cannot read and write " + others + " in " + channel_dir + "; " + imex_advice()};
  }
  if (!any_channel) { return {false, "no usable IMEX channel: " + imex_advice()}; }

  // One real export, in a child that may crash.
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) { return {false, "pipe2 failed for the fabric probe"}; }
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  std::string exe = rmmd_exe.string(), flag = "--probe-fabric", dev = std::to_string(device);
  char* argv[] = {exe.data(), flag.data(), dev.data(), nullptr};
  // The daemon blocks SIGTERM/SIGINT/SIGHUP (it takes them by sigwaitinfo);
  // the probe must not inherit that, or a hung probe could not be stopped.
  posix_spawnattr_t attrs;
  ::posix_spawnattr_init(&attrs);
  sigset_t none;
  sigemptyset(&none);
  ::posix_spawnattr_setsigmask(&attrs, &none);
  ::posix_spawnattr_setflags(&attrs, POSIX_SPAWN_SETSIGMASK);
  pid_t pid{};
  int rc = ::posix_spawn(&pid, exe.c_str(), &actions, &attrs, argv, environ);
  ::posix_spawnattr_destroy(&attrs);
  ::posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    return {false, "could not start the fabric probe " + exe + ": " + std::strerror(rc)};
  }
  std::string said;
  char buf[256];
  pollfd p{out[0], POLLIN, 0};
  while (::poll(&p, 1, 30000) > 0) {
    auto n = ::read(out[0], buf, sizeof(buf));
    if (n <= 0) { break; }
    said.append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  while (!said.empty() && said.back() == '\n') { said.pop_back(); }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && said == "ok") { return {true, {}}; }
  if (WIFSIGNALED(status)) {
    return {false,
            "the fabric probe died with signal " + std::to_string(WTERMSIG(status)) +
                (said.empty() ? "" : " (" + said + ")") + "; " + imex_advice()};
  }
  return {false, "a test export of a fabric handle failed: " + said + "; " + imex_advice()};
}

void run_fabric_probe(int device)
{
  using handle = rmm::mr::cuda_async_memory_resource::allocation_handle_type;
  if (cudaSetDevice(device) != cudaSuccess) {
    std::printf("cudaSetDevice(%d) failed\n", device);
    std::fflush(stdout);
    ::_exit(1);
  }
  // Leaked on purpose: destroying a pool whose fabric export failed crashes.
  auto* mr = new rmm::mr::cuda_async_memory_resource(std::nullopt, std::nullopt, handle::fabric);
  cudaMemFabricHandle_t fabric{};
  auto err =
      cudaMemPoolExportToShareableHandle(&fabric, mr->pool_handle(), cudaMemHandleTypeFabric, 0);
  if (err == cudaSuccess) {
    std::printf("ok\n");
  } else {
    std::printf("cudaMemPoolExportToShareableHandle(fabric): %s\n", cudaGetErrorName(err));
  }
  std::fflush(stdout);
  ::_exit(err == cudaSuccess ? 0 : 1);
}

}  // namespace rmmd::backends::cuda
