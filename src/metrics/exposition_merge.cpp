// Merging several processes' expositions into one with a rank label
// (node_metrics.hpp): families in order of first appearance, HELP and TYPE
// once each, then every rank's samples of the family.
#include <corodist/metrics/node_metrics.hpp>

#include <corodist/core/error.hpp>

#include <map>
#include <string_view>
#include <unordered_map>

namespace corodist::metrics {

namespace {

struct family {
  std::string help; // the whole "# HELP ..." line
  std::string type; // the whole "# TYPE ..." line
  std::string samples;
};

/// The metric name a sample line starts with.
std::string_view sample_name(std::string_view line) {
  std::size_t n = 0;
  while (n < line.size() && line[n] != '{' && line[n] != ' ')
    ++n;
  return line.substr(0, n);
}

/// The family a sample belongs to: its name, less a histogram's or summary's
/// suffix when the family under the shorter name is known.
std::string_view family_of(std::string_view name, const std::unordered_map<std::string, family>& known) {
  for (std::string_view suffix : {"_bucket", "_sum", "_count"})
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      auto base = name.substr(0, name.size() - suffix.size());
      if (known.count(std::string(base)))
        return base;
    }
  return name;
}

/// `line` with rank="R" as its first label.
std::string with_rank(std::string_view line, std::string_view name, int rank) {
  std::string out(name);
  const std::string label = "rank=\"" + std::to_string(rank) + "\"";
  auto rest = line.substr(name.size());
  if (!rest.empty() && rest.front() == '{') {
    out += '{' + label;
    if (rest.size() > 1 && rest[1] != '}')
      out += ',';
    out.append(rest.substr(1));
  } else {
    out += '{' + label + '}';
    out.append(rest);
  }
  return out;
}

} // namespace

std::string merge_expositions(const std::vector<rank_exposition>& parts) {
  std::unordered_map<std::string, family> families;
  std::vector<std::string> order;
  auto get = [&](std::string_view name) -> family& {
    auto [it, made] = families.try_emplace(std::string(name));
    if (made)
      order.push_back(it->first);
    return it->second;
  };
  for (const auto& part : parts) {
    std::string_view text = part.text;
    while (!text.empty()) {
      const auto eol = text.find('\n');
      std::string_view line = text.substr(0, eol);
      text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
      if (line.empty())
        continue;
      if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
        auto rest = line.substr(7);
        auto name = rest.substr(0, rest.find(' '));
        auto& f = get(name);
        auto& slot = line[2] == 'H' ? f.help : f.type;
        if (slot.empty())
          slot.assign(line);
        continue;
      }
      if (line.front() == '#')
        continue; // another comment
      auto name = sample_name(line);
      if (name.empty() || name.size() == line.size())
        throw corodist::error("metrics: rank " + std::to_string(part.rank) + " sent a line that is not a sample: '" +
                              std::string(line) + "'");
      auto& f = get(family_of(name, families));
      f.samples += with_rank(line, name, part.rank);
      f.samples += '\n';
    }
  }
  std::string out;
  for (const auto& name : order) {
    const auto& f = families.at(name);
    if (!f.help.empty())
      out += f.help + '\n';
    if (!f.type.empty())
      out += f.type + '\n';
    out += f.samples;
  }
  return out;
}

} // namespace corodist::metrics
