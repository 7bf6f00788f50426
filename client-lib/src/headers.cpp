// rdmabroker::Headers: the fields of a message's header block (SPEC.md §3.6)
// as the application sees them. The wire form is proto/headers.hpp's.
#include <algorithm>

#include "rdmabroker/client.hpp"

namespace rdmabroker {

namespace {
bool same_name(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [&](char x, char y) { return lower(x) == lower(y); });
}
}  // namespace

Headers::Headers(std::initializer_list<std::pair<std::string_view, std::string_view>> fields) {
  for (const auto& [name, value] : fields) add(name, value);
}

void Headers::add(std::string_view name, std::string_view value) { fields_.emplace_back(name, value); }

void Headers::set(std::string_view name, std::string_view value) {
  erase(name);
  add(name, value);
}

std::optional<std::string_view> Headers::get(std::string_view name) const {
  for (const auto& [n, v] : fields_) {
    if (same_name(n, name)) return v;
  }
  return std::nullopt;
}

std::vector<std::string_view> Headers::values(std::string_view name) const {
  std::vector<std::string_view> out;
  for (const auto& [n, v] : fields_) {
    if (same_name(n, name)) out.emplace_back(v);
  }
  return out;
}

std::size_t Headers::erase(std::string_view name) {
  return std::erase_if(fields_, [&](const Field& f) { return same_name(f.first, name); });
}

}  // namespace rdmabroker
