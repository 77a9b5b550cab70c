// cuda_pool_per_gpu: the settings every GPU's pool shares and the overrides
// of particular GPUs. What can only be known at start (which GPUs exist, and
// which one a UUID names) is left to config/gpu_pools.cpp.

#include "daemon/config/detail/checks.hpp"
#include "daemon/config/detail/handle_type_checks.hpp"
#include "daemon/config/detail/value_formats.hpp"

#include <absl/strings/ascii.h>
#include <absl/strings/str_format.h>

#include <map>
#include <optional>
#include <string>

namespace rmmd::config::detail {
namespace {

/// Whether `name` is `prefix` followed by digits: a name the per-GPU pools take.
bool is_per_gpu_name(std::string const& name, std::string const& prefix)
{
  return name.size() > prefix.size() && name.starts_with(prefix) &&
         name.find_first_not_of("0123456789", prefix.size()) == std::string::npos;
}

/// The shared settings, into `out`.
void check_shared(checked_file& f,
                  v1::CudaPoolPerGpu const& g,
                  node const& n,
                  std::string const& label,
                  per_gpu_pools& out)
{
  if (g.has_name_prefix()) {
    out.name_prefix = g.name_prefix();
    // The longest name it makes must be a pool name too.
    if (out.name_prefix.empty() || !valid_pool_name(out.name_prefix + "999")) {
      f.error(n,
              "name_prefix",
              -1,
              "%s: name_prefix \"%s\" must be 1 to 61 letters, digits, '.', '_' or '-' (the "
              "pools are named it and their GPU's ordinal)",
              label,
              out.name_prefix);
    }
  }
  out.fabric             = checked_handle_types(f, g, n, label).value_or(fabric_mode::automatic);
  out.initial_size_bytes = g.initial_size_bytes();
  out.release_threshold_bytes = g.release_threshold_bytes();
  if (!g.has_limit_bytes()) { return; }
  out.limit_bytes = g.limit_bytes();
  if (out.limit_bytes == 0) {
    f.error(n,
            "limit_bytes",
            -1,
            "%s: limit_bytes is 0; give the most bytes each pool may lend, or leave it out for "
            "80%% of each GPU's free memory",
            label);
    return;
  }
  for (auto [field, bytes] : {std::pair{"release_threshold_bytes", out.release_threshold_bytes},
                              std::pair{"initial_size_bytes", out.initial_size_bytes}}) {
    if (bytes > out.limit_bytes) {
      f.error(n,
              field,
              -1,
              "%s: %s (%d) is larger than limit_bytes (%d); lower it or raise the limit",
              label,
              field,
              bytes,
              out.limit_bytes);
    }
  }
}

/// Which GPU an override names: its ordinal, or its selector in lower case.
std::string gpu_key(gpu_pool_override const& o)
{
  return o.device >= 0 ? absl::StrFormat("device %d", o.device) : absl::AsciiStrToLower(o.gpu);
}

/// The sizes of one GPU's pool once the override is applied: the initial
/// size and release threshold within the limit, reported at the override's
/// field that breaks it (the shared settings were checked alone already).
void check_override_sizes(checked_file& f,
                          node const& n,
                          std::string const& label,
                          per_gpu_pools const& shared,
                          gpu_pool_override const& out)
{
  if (out.limit_bytes && *out.limit_bytes == 0) {
    f.error(n,
            "limit_bytes",
            -1,
            "%s: limit_bytes is 0; give the most bytes the pool may lend, or leave it out",
            label);
    return;
  }
  auto const limit = out.limit_bytes.value_or(shared.limit_bytes);
  if (limit == 0) { return; }  // 80% of the GPU's free memory: known at start
  auto check = [&](char const* field, std::optional<std::size_t> own, std::size_t inherited) {
    auto const bytes = own.value_or(inherited);
    if (bytes <= limit || (!own && !out.limit_bytes)) { return; }
    f.error(n,
            own ? field : "limit_bytes",
            -1,
            "%s: %s (%d%s) is larger than limit_bytes (%d%s); lower it or raise the limit",
            label,
            field,
            bytes,
            own ? "" : ", from cuda_pool_per_gpu",
            limit,
            out.limit_bytes ? "" : ", from cuda_pool_per_gpu");
  };
  check("release_threshold_bytes", out.release_threshold_bytes, shared.release_threshold_bytes);
  check("initial_size_bytes", out.initial_size_bytes, shared.initial_size_bytes);
}

gpu_pool_override check_override(checked_file& f,
                                 v1::GpuPoolOverride const& o,
                                 node const& n,
                                 std::string const& label,
                                 per_gpu_pools const& shared)
{
  gpu_pool_override out;
  out.line = n.line;
  switch (o.which_case()) {
    case v1::GpuPoolOverride::kDevice:
      out.device = o.device();
      if (out.device < 0) {
        f.error(n,
                "device",
                -1,
                "%s: device %d is negative; give a CUDA device ordinal",
                label,
                out.device);
      }
      break;
    case v1::GpuPoolOverride::kGpu:
      out.gpu = o.gpu();
      if (!is_gpu_selector(out.gpu)) {
        f.error(n,
                "gpu",
                -1,
                "%s: gpu \"%s\" is neither a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, "
                "as nvidia-smi -L prints it) nor a PCI bus id (0000:3b:00.0)",
                label,
                out.gpu);
      }
      break;
    default:
      f.error(n,
              "device",
              -1,
              "%s names no GPU; add `device: N` (its CUDA ordinal) or `gpu: \"GPU-...\"` (its "
              "UUID or PCI bus id)",
              label);
  }
  out.skip = o.skip();
  if (out.skip) {
    bool const more = o.has_name() || o.handle_types_size() > 0 || o.has_limit_bytes() ||
                      o.has_initial_size_bytes() || o.has_release_threshold_bytes();
    if (more) {
      f.error(n,
              "skip",
              -1,
              "%s: skip: true serves no pool on this GPU, so it takes no other setting; drop "
              "skip or the others",
              label);
    }
    return out;
  }
  if (o.has_name()) {
    out.name = o.name();
    if (!valid_pool_name(out.name)) {
      f.error(n,
              "name",
              -1,
              "%s: pool name \"%s\" may hold only letters, digits, '.', '_' and '-' (at most 64)",
              label,
              out.name);
    } else if (is_per_gpu_name(out.name, shared.name_prefix)) {
      f.error(n,
              "name",
              -1,
              "%s: pool name \"%s\" is how cuda_pool_per_gpu names another GPU's pool (name_prefix "
              "\"%s\" and an ordinal); choose a name that is not",
              label,
              out.name,
              shared.name_prefix);
    }
  }
  out.fabric = checked_handle_types(f, o, n, label);
  if (o.has_initial_size_bytes()) { out.initial_size_bytes = o.initial_size_bytes(); }
  if (o.has_release_threshold_bytes()) {
    out.release_threshold_bytes = o.release_threshold_bytes();
  }
  if (o.has_limit_bytes()) { out.limit_bytes = o.limit_bytes(); }
  check_override_sizes(f, n, label, shared, out);
  return out;
}

}  // namespace

void check_per_gpu_pools(checked_file& f, daemon_settings& s)
{
  if (!f.config().has_cuda_pool_per_gpu()) { return; }  // check_pools decided
  auto const& g           = f.config().cuda_pool_per_gpu();
  auto const n            = f.nested(f.root(), "cuda_pool_per_gpu");
  std::string const label = "cuda_pool_per_gpu";
  per_gpu_pools out;
  check_shared(f, g, n, label, out);

  // Names: those of `pools` (line of each), then the overrides'.
  std::map<std::string, int> names;
  for (int i = 0; i < f.config().pools_size(); ++i) {
    auto const& p = f.config().pools(i);
    names.emplace(p.name(), f.nested(f.root(), "pools", i).line);
    if (is_per_gpu_name(p.name(), out.name_prefix)) {
      f.error(f.nested(f.root(), "pools", i),
              "name",
              -1,
              "pool name \"%s\" is also the name cuda_pool_per_gpu gives a GPU's pool (name_prefix "
              "\"%s\" and an ordinal); rename the pool or set cuda_pool_per_gpu.name_prefix",
              p.name(),
              out.name_prefix);
    }
  }
  std::map<std::string, int> gpus;  // gpu_key -> line of the override naming it
  for (int i = 0; i < g.gpu_overrides_size(); ++i) {
    auto const on    = f.nested(n, "gpu_overrides", i);
    auto const where = absl::StrFormat("%s.gpu_overrides[%d]", label, i);
    auto o           = check_override(f, g.gpu_overrides(i), on, where, out);
    if (o.device >= 0 || !o.gpu.empty()) {
      if (auto [it, fresh] = gpus.emplace(gpu_key(o), on.line); !fresh) {
        f.error(on,
                o.device >= 0 ? "device" : "gpu",
                -1,
                "%s names the same GPU as the override at line %d; keep one",
                where,
                it->second);
      }
    }
    if (!o.name.empty()) {
      if (auto [it, fresh] = names.emplace(o.name, on.line); !fresh) {
        f.error(on,
                "name",
                -1,
                "%s: pool name \"%s\" is already used by the pool at line %d; pool names must be "
                "unique",
                where,
                o.name,
                it->second);
      }
    }
    out.overrides.push_back(std::move(o));
  }
  s.cuda_pool_per_gpu = std::move(out);
}

}  // namespace rmmd::config::detail
