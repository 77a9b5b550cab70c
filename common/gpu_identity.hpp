#pragma once

// A GPU's identity that is the same in every process of the node, whatever
// CUDA_VISIBLE_DEVICES renumbered: its UUID as nvidia-smi prints it
// ("GPU-5f3c...") and its PCI bus id ("0000:3b:00.0"). A CUDA ordinal names a
// GPU only inside one process. Used by the daemon (to describe its pools)
// and the client (to find the pool of its own device). Header-only: both
// sides include it, neither links the other.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace rmmd::gpu {

struct identity {
  std::string uuid;        ///< "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  std::string pci_bus_id;  ///< "0000:3b:00.0", lower case
};

/// `uuid` in nvidia-smi's form.
inline std::string uuid_text(cudaUUID_t const& uuid)
{
  char out[64];
  auto const* b = reinterpret_cast<unsigned char const*>(uuid.bytes);
  std::snprintf(out,
                sizeof(out),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                b[0],
                b[1],
                b[2],
                b[3],
                b[4],
                b[5],
                b[6],
                b[7],
                b[8],
                b[9],
                b[10],
                b[11],
                b[12],
                b[13],
                b[14],
                b[15]);
  return out;
}

/// Lower case, with the PCI domain ("3B:00.0" -> "0000:3b:00.0").
inline std::string normal_pci_bus_id(std::string_view id)
{
  std::string out;
  for (char c : id) {
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  if (std::count(out.begin(), out.end(), ':') == 1) { out = "0000:" + out; }
  // CUDA prints an 8-digit domain ("00000000:3b:00.0"); nvidia-smi too; lspci 4.
  if (auto colon = out.find(':'); colon > 4 && out.find_first_not_of('0') >= colon - 4) {
    out.erase(0, colon - 4);
  }
  return out;
}

/// The identity of CUDA device `device` of this process; nullopt (the CUDA
/// error cleared) if CUDA cannot say. Creates no context.
inline std::optional<identity> identify(int device)
{
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  if (device < 0 || device >= count) { return std::nullopt; }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess) {
    cudaGetLastError();
    bus[0] = '\0';
  }
  return identity{uuid_text(prop.uuid), normal_pci_bus_id(bus)};
}

/// Whether `selector` names the GPU `id`: its UUID (case-insensitive; the
/// "GPU-" prefix may be left out) or its PCI bus id (with or without domain).
inline bool names(identity const& id, std::string_view selector)
{
  std::string s;
  for (char c : selector) {
    s.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  if (s.starts_with("gpu-")) { return "gpu-" + id.uuid.substr(4) == s; }
  if (s.find(':') != std::string::npos) { return normal_pci_bus_id(s) == id.pci_bus_id; }
  return id.uuid.size() > 4 && id.uuid.substr(4) == s;
}

}  // namespace rmmd::gpu
