#pragma once
// Test helpers of the metrics suite: a sample's value in an exposition, the
// sum of a family's samples over label subsets, promtool's verdict on a text,
// and whether a layer of this build records (the metrics count what the
// flight recorders see).

#include <corodist/core/flight_recorder.hpp>

#include <nlohmann/json.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace corodist::test {

using label_set = std::map<std::string, std::string>;

/// One sample line: its name, labels and value.
struct sample_line {
  std::string name;
  label_set labels;
  double value = 0;
};

/// The sample lines of an exposition (comments skipped). Label values with
/// escapes (\", \\, \n) are unescaped.
inline std::vector<sample_line> parse_samples(const std::string& text) {
  std::vector<sample_line> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#')
      continue;
    sample_line s;
    std::size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ')
      ++i;
    s.name = line.substr(0, i);
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const auto eq = line.find('=', i);
        std::string key = line.substr(i, eq - i);
        std::string value;
        std::size_t j = eq + 2; // past ="
        while (j < line.size() && line[j] != '"') {
          if (line[j] == '\\' && j + 1 < line.size()) {
            ++j;
            value += line[j] == 'n' ? '\n' : line[j];
          } else {
            value += line[j];
          }
          ++j;
        }
        s.labels[key] = value;
        i = j + 1;
        if (i < line.size() && line[i] == ',')
          ++i;
      }
      ++i;
    }
    s.value = std::strtod(line.c_str() + i, nullptr);
    out.push_back(std::move(s));
  }
  return out;
}

/// The sum of the samples named `name` whose labels include all of `want`
/// (nullopt when none matches).
inline std::optional<double> sum_of(const std::string& text, const std::string& name, const label_set& want = {}) {
  std::optional<double> sum;
  for (const auto& s : parse_samples(text)) {
    if (s.name != name)
      continue;
    bool match = true;
    for (const auto& [k, v] : want)
      if (auto it = s.labels.find(k); it == s.labels.end() || it->second != v)
        match = false;
    if (match)
      sum = sum.value_or(0) + s.value;
  }
  return sum;
}

/// promtool's verdict on an exposition.
struct promtool_result {
  bool found = false; ///< promtool is installed
  int status = 0;
  std::string output;
};

/// Runs `promtool check metrics` on `text` (fed on stdin from a file).
inline promtool_result promtool_check(const std::string& text) {
  promtool_result r;
  if (std::system("command -v promtool >/dev/null 2>&1") != 0)
    return r;
  r.found = true;
  const auto dir = std::filesystem::temp_directory_path();
  const std::string in = (dir / ("corodist-metrics-" + std::to_string(::getpid()) + ".prom")).string();
  const std::string out = in + ".out";
  std::ofstream(in) << text;
  const int st = std::system(("promtool check metrics < '" + in + "' > '" + out + "' 2>&1").c_str());
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  std::ifstream o(out);
  r.output.assign(std::istreambuf_iterator<char>(o), {});
  std::filesystem::remove(in);
  std::filesystem::remove(out);
  return r;
}

/// Checks `text` with promtool: passes (status 0, nothing reported), or a
/// message when promtool is missing (Debian's prometheus package: scripts/setup.sh).
inline void require_valid_exposition(const std::string& text) {
  auto r = promtool_check(text);
  if (!r.found) {
    BOOST_TEST_MESSAGE("promtool not found (install Debian's 'prometheus': scripts/setup.sh): the exposition is "
                       "not validated");
    return;
  }
  BOOST_TEST(r.status == 0, "promtool check metrics: " << r.output << "\n--- text:\n" << text);
  BOOST_TEST(r.output == "", "promtool check metrics: " << r.output);
}

/// Whether a live recorder of `layer` exists in this process (the layer records).
inline bool layer_records(const std::string& layer) {
  auto doc = nlohmann::json::parse(corodist::dump_flight_recorders());
  for (const auto& r : doc["recorders"])
    if (r["layer"] == layer)
      return true;
  return false;
}

} // namespace corodist::test
