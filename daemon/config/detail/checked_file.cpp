#include "daemon/config/detail/checked_file.hpp"

#include <algorithm>
#include <string>

namespace rmmd::config::detail {

std::pair<int, int> checked_file::where(node const& n, std::string_view field, int index) const
{
  auto const* fd = n.message->GetDescriptor()->FindFieldByName(std::string(field));
  if (n.tree == nullptr || fd == nullptr) { return {n.line, n.column}; }
  int at = -1;
  if (fd->is_repeated()) {
    auto const values = n.message->GetReflection()->FieldSize(*n.message, fd);
    bool const exact  = n.tree->GetLocation(fd, std::max(values - 1, 0)).line >= 0;
    at                = exact ? std::max(index, 0) : 0;
  }
  auto const loc = n.tree->GetLocation(fd, at);
  if (loc.line >= 0) { return {loc.line + 1, loc.column + 1}; }
  return {n.line, n.column};
}

node checked_file::nested(node const& parent, std::string_view field, int index) const
{
  auto const* fd      = parent.message->GetDescriptor()->FindFieldByName(std::string(field));
  auto [line, column] = where(parent, field, index);
  info_tree const* t  = nullptr;
  if (parent.tree != nullptr) {
    t = parent.tree->GetTreeForNested(fd, fd->is_repeated() ? index : -1);
  }
  auto const* reflection = parent.message->GetReflection();
  auto const& child = fd->is_repeated() ? reflection->GetRepeatedMessage(*parent.message, fd, index)
                                        : reflection->GetMessage(*parent.message, fd);
  return node{t, &child, line, column};
}

}  // namespace rmmd::config::detail
