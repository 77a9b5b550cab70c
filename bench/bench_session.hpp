#pragma once

// What the bench asks the daemon outside the calls it times, through the
// client library's admin calls (rmmd/admin.hpp), read back into the wire's
// messages.

#include "bench/bench_support.hpp"
#include "rmmd/v1/rmmd.pb.h"

#include <rmmd/admin.hpp>
#include <rmmd/session.hpp>

#include <google/protobuf/util/json_util.h>

#include <string>

namespace rmmd::bench {

/// `json`, protobuf's JSON mapping of a `Message` (what rmmd::admin returns),
/// as that message. Throws bench_error when it does not parse.
template <typename Message>
Message parse_json(std::string const& json)
{
  Message out;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (auto status = google::protobuf::util::JsonStringToMessage(json, &out, options);
      !status.ok()) {
    throw bench_error("the daemon's " + out.GetTypeName() +
                      " does not parse: " + std::string(status.message()));
  }
  return out;
}

/// GetStats through `s`, every session listed (or the `which` ones).
v1::Stats get_stats(rmmd::session const& s, rmmd::session_listing which = {});

}  // namespace rmmd::bench
