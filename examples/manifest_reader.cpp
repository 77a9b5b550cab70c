// Reading manifests from C++ (docs/sharing.md): list the shared buffers a
// prefix and labels select, then open one for reading, with the fingerprint
// guard, and print its tensor table: where each tensor lies in the buffer,
// its dtype and shape. The same tables rmmd.torch.publish writes and
// rmmd.torch.attach reads in Python.
//
//   rmmd_manifest_reader [--prefix P] [--label K=V]... [--open NAME [--expect K=V]...]
//
//   --prefix P     list buffers whose names start with P
//   --label K=V    ... that carry label K with value V (repeatable)
//   --open NAME    open NAME read-only and print its manifest
//   --expect K=V   refuse to open unless NAME carries these labels
//
// Exit status 0; 1 when the open is refused (the daemon's reason printed).

#include <rmmd/session.hpp>
#include <rmmd/shared_buffer.hpp>

#include <cstdio>
#include <exception>
#include <map>
#include <string>

namespace {

bool split(std::string const& kv, std::map<std::string, std::string, std::less<>>* into)
{
  auto eq = kv.find('=');
  if (eq == std::string::npos) { return false; }
  (*into)[kv.substr(0, eq)] = kv.substr(eq + 1);
  return true;
}

std::string shape_of(rmmd::tensor_entry const& t)
{
  std::string out = "(";
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    out += (i > 0 ? ", " : "") + std::to_string(t.shape[i]);
  }
  return out + (t.shape.size() == 1 ? ",)" : ")");
}

}  // namespace

int main(int argc, char** argv)
{
  rmmd::buffer_filter filter;
  rmmd::open_options open;  // read-only, no wait
  std::string name;
  for (int i = 1; i < argc; ++i) {
    std::string const arg = argv[i];
    bool ok               = i + 1 < argc;
    if (ok && arg == "--prefix") {
      filter.name_prefix = argv[++i];
    } else if (ok && arg == "--label") {
      ok = split(argv[++i], &filter.labels);
    } else if (ok && arg == "--open") {
      name = argv[++i];
    } else if (ok && arg == "--expect") {
      ok = split(argv[++i], &open.expect_labels);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: %s [--prefix P] [--label K=V]... [--open NAME [--expect K=V]...]\n",
                   argv[0]);
      return 2;
    }
  }
  try {
    rmmd::session session(rmmd::session::options{.client_name = "manifest-reader"});

    // 1. What is there: name, size, tensors, labels, without opening any.
    for (auto const& b : rmmd::shared_buffer::list(session, filter)) {
      std::printf("%-32s %12zu bytes  %5zu tensors  %s%s\n",
                  b.name.c_str(),
                  b.size,
                  b.tensor_count,
                  b.published ? "published" : "writing",
                  b.allow_writers ? ", allows writers" : "");
      for (auto const& [key, value] : b.labels) {
        std::printf("    %s = %s\n", key.c_str(), value.c_str());
      }
    }
    if (name.empty()) { return 0; }

    // 2. Open one for reading: its mapping is read-only (docs/sharing.md), and
    //    the guard refuses a buffer of another revision or rank.
    auto buffer = rmmd::shared_buffer::open(session, name, open);
    std::printf("\n%s: %zu bytes, opened %s\n",
                name.c_str(),
                buffer.size(),
                buffer.access() == rmmd::buffer_access::read ? "read-only" : "read-write");
    for (auto const& t : buffer.manifest().tensors) {
      // The tensor's first element is at data() + byte_offset: device memory
      // for a CUDA pool's buffer (hand it to a kernel), host memory otherwise.
      std::printf("  %-40s %-14s %-20s at %12llu, %12llu bytes%s",
                  t.name.c_str(),
                  std::string(rmmd::to_string(t.type)).c_str(),
                  shape_of(t).c_str(),
                  static_cast<unsigned long long>(t.byte_offset),
                  static_cast<unsigned long long>(t.byte_extent()),
                  t.contiguous() ? "" : ", strided");
      for (auto const& a : t.aliases) { std::printf(", also %s", a.c_str()); }
      std::printf("\n");
    }
    for (auto const& [key, value] : buffer.manifest().labels) {
      std::printf("  label %s = %s\n", key.c_str(), value.c_str());
    }
    return 0;
  } catch (rmmd::precondition_error const& e) {
    std::fprintf(stderr, "%s\n", e.what());  // the guard: which label differs
    return 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
