#include "options.hpp"

#include <charconv>
#include <cmath>
#include <system_error>

namespace corodist::tools::launch {

std::chrono::milliseconds to_ms(double s) {
  return std::chrono::milliseconds(static_cast<long long>(std::llround(s * 1000.0)));
}

// "N" or "MIN:MAX" into `s`; an error text, empty when it parsed.
std::string parse_nnodes(const std::string& text, settings& s) {
  auto colon = text.find(':');
  auto number = [](const std::string& t, int& v) {
    auto [p, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    return ec == std::errc{} && p == t.data() + t.size() && v >= 1 && v <= (1 << 20);
  };
  if (colon == std::string::npos) {
    if (!number(text, s.min_nodes))
      return "--nnodes '" + text + "' is not N or MIN:MAX with 1 <= MIN <= MAX";
    s.max_nodes = s.min_nodes;
    return {};
  }
  if (!number(text.substr(0, colon), s.min_nodes) || !number(text.substr(colon + 1), s.max_nodes) ||
      s.min_nodes > s.max_nodes)
    return "--nnodes '" + text + "' is not N or MIN:MAX with 1 <= MIN <= MAX";
  s.elastic = true;
  return {};
}

} // namespace corodist::tools::launch
