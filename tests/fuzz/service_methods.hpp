#pragma once

// The service fuzzer's methods: the call table's gRPC entries, in table
// order. An input's method byte picks one of them (modulo their number);
// make_corpus.cpp writes its seeds by name through method_byte().

#include "daemon/wire/calls.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

namespace rmmd::fuzz {

inline std::vector<wire::call const*> const& service_methods()
{
  static std::vector<wire::call const*> const methods = [] {
    std::vector<wire::call const*> out;
    for (auto const& c : wire::calls()) {
      if (wire::carries(c, wire::transport::grpc)) { out.push_back(&c); }
    }
    return out;
  }();
  return methods;
}

/// The method byte that picks the method `name`. REQUIRES: a gRPC entry.
inline std::uint8_t method_byte(std::string_view name)
{
  auto const& methods = service_methods();
  for (std::size_t i = 0; i < methods.size(); ++i) {
    if (methods[i]->name == name) { return static_cast<std::uint8_t>(i); }
  }
  std::abort();
}

}  // namespace rmmd::fuzz
