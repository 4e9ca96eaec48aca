#include "ft/round_keys.hpp"

#include <corodist/core/error.hpp>

#include <algorithm>
#include <charconv>

namespace corodist::ft::detail {

std::string round_keys::alive(const member& m) const {
  return alive_dir() + m.replica_id + "/" + std::to_string(m.incarnation);
}

std::string encode_line(const member_line& l) {
  return l.m.replica_id + " " + std::to_string(l.m.step) + " " + std::to_string(l.m.incarnation) + " " +
         (l.needs_group ? "1" : "0") + "\n";
}

namespace {

std::uint64_t number(std::string_view s, std::string_view what, std::string_view line) {
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size())
    throw protocol_error("ft: a malformed line in " + std::string(what) + ": '" + std::string(line) + "'");
  return v;
}

} // namespace

std::vector<member_line> decode_lines(std::string_view text, std::string_view what) {
  std::vector<member_line> out;
  while (!text.empty()) {
    auto end = text.find('\n');
    auto line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    if (line.empty()) continue;
    std::string_view f[4];
    std::size_t n = 0;
    std::string_view rest = line;
    while (n < 4 && !rest.empty()) {
      auto sp = rest.find(' ');
      f[n++] = rest.substr(0, sp);
      rest = sp == std::string_view::npos ? std::string_view{} : rest.substr(sp + 1);
    }
    if (n != 4 || !rest.empty() || f[0].empty() || (f[3] != "0" && f[3] != "1"))
      throw protocol_error("ft: a malformed line in " + std::string(what) + ": '" + std::string(line) + "'");
    member_line l;
    l.m.replica_id = std::string(f[0]);
    l.m.step = number(f[1], what, line);
    l.m.incarnation = number(f[2], what, line);
    l.needs_group = f[3] == "1";
    out.push_back(std::move(l));
  }
  return out;
}

bool is_alive(const std::vector<std::string>& alive, const round_keys& keys, const member& m) {
  return std::find(alive.begin(), alive.end(), keys.alive(m)) != alive.end();
}

} // namespace corodist::ft::detail
