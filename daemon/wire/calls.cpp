#include "daemon/wire/calls.hpp"

#include "rmmd/v1/rmmd.pb.h"

#include <absl/strings/str_format.h>
#include <google/protobuf/descriptor.h>

#include <set>
#include <stdexcept>
#include <utility>

namespace rmmd::wire {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::ServiceDescriptor;

[[noreturn]] void wrong(call const& c, std::string const& what)
{
  throw std::logic_error(
      absl::StrFormat("the call table's entry '%s' (daemon/wire/*_calls.cpp) %s", c.name, what));
}

ServiceDescriptor const& rmmd_service()
{
  auto const* service = v1::AllocateRequest::descriptor()->file()->FindServiceByName("Rmmd");
  if (service == nullptr) { throw std::logic_error("rmmd.proto defines no service Rmmd"); }
  return *service;
}

void check_grpc(call const& c)
{
  auto const* method = rmmd_service().FindMethodByName(std::string(c.name));
  if (method == nullptr) { wrong(c, "is not a method of rmmd.v1.Rmmd"); }
  if (method->input_type() != c.request->GetDescriptor() ||
      method->output_type() != c.reply->GetDescriptor()) {
    wrong(c,
          absl::StrFormat("has messages %s -> %s; rmmd.proto says %s -> %s",
                          c.request->GetDescriptor()->full_name(),
                          c.reply->GetDescriptor()->full_name(),
                          method->input_type()->full_name(),
                          method->output_type()->full_name()));
  }
}

/// The field named `name` of `message`'s oneof `oneof`, of type `type`.
FieldDescriptor const* oneof_field(call const& c,
                                   google::protobuf::Descriptor const& message,
                                   std::string_view oneof,
                                   google::protobuf::Descriptor const* type)
{
  auto const* field = message.FindFieldByName(std::string(c.routes.session.field));
  if (field == nullptr || field->containing_oneof() == nullptr ||
      field->containing_oneof()->name() != oneof) {
    wrong(c,
          absl::StrFormat("names session field '%s', which is no field of %s's oneof %s",
                          c.routes.session.field,
                          message.full_name(),
                          oneof));
  }
  if (field->message_type() != type) {
    wrong(c,
          absl::StrFormat("has message %s; %s.%s is a %s",
                          type->full_name(),
                          message.full_name(),
                          field->name(),
                          field->message_type() ? field->message_type()->full_name() : "scalar"));
  }
  return field;
}

/// The entry's session accessors reach the fields it names (on_session's
/// template arguments and its name agree).
void check_session_accessors(call const& c)
{
  auto const& route = c.routes.session;
  if (route.request == nullptr || route.reply == nullptr) {
    wrong(c, "names session field '" + std::string(route.field) + "' without its accessors");
  }
  v1::SessionCall call;
  auto const* set = call.GetReflection()->MutableMessage(&call, c.session_call_field);
  v1::SessionReply reply;
  auto const* made = route.reply(reply);
  if (&route.request(call) != set ||
      made != &reply.GetReflection()->GetMessage(reply, c.session_reply_field)) {
    wrong(c,
          absl::StrFormat("names session field '%s' but its accessors reach another field",
                          route.field));
  }
}

std::vector<call> build()
{
  std::vector<call> all;
  for (auto&& domain : {lease_calls(), buffer_calls(), stable_calls(), daemon_calls()}) {
    all.insert(all.end(), domain.begin(), domain.end());
  }
  std::set<std::string_view> names;
  std::set<std::string> methods;
  for (auto& c : all) {
    if (!names.insert(c.name).second) { wrong(c, "is declared twice"); }
    if (c.routes.grpc) {
      check_grpc(c);
      methods.insert(std::string(c.name));
    }
    if (!c.routes.session.field.empty()) {
      c.session_call_field =
          oneof_field(c, *v1::SessionCall::descriptor(), "call", c.request->GetDescriptor());
      c.session_reply_field =
          oneof_field(c, *v1::SessionReply::descriptor(), "reply", c.reply->GetDescriptor());
      check_session_accessors(c);
    }
  }
  auto const& service = rmmd_service();
  for (int i = 0; i < service.method_count(); ++i) {
    if (!methods.contains(service.method(i)->name())) {
      throw std::logic_error(absl::StrFormat(
          "rmmd.v1.Rmmd.%s has no entry in the call table (daemon/wire/*_calls.cpp)",
          service.method(i)->name()));
    }
  }
  return all;
}

}  // namespace

std::span<call const> calls()
{
  static std::vector<call> const table = build();
  return table;
}

call const* find_call(std::string_view name)
{
  for (auto const& c : calls()) {
    if (c.name == name) { return &c; }
  }
  return nullptr;
}

bool carries(call const& c, transport t) noexcept
{
  return t == transport::grpc ? c.routes.grpc : c.session_call_field != nullptr;
}

std::vector<std::string> call_names(transport t)
{
  std::vector<std::string> names;
  for (auto const& c : calls()) {
    if (carries(c, t)) { names.emplace_back(c.name); }
  }
  return names;
}

}  // namespace rmmd::wire
