#pragma once
// The entries of a live flight recorder, read from this process's dump (what
// a debugger or the timeline sees), for tests of the layers that record.

#include <corodist/core/flight_recorder.hpp>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace corodist::test {

/// The entries (oldest first) of the live recorder of `layer` named `name`;
/// empty when there is none.
inline std::vector<nlohmann::json> recorded(const std::string& layer, const std::string& name) {
  const auto doc = nlohmann::json::parse(dump_flight_recorders());
  for (const auto& r : doc.at("recorders"))
    if (r.at("layer") == layer && r.at("name") == name)
      return r.at("entries").get<std::vector<nlohmann::json>>();
  return {};
}

/// The entries among `entries` whose op is `op`.
inline std::vector<nlohmann::json> with_op(const std::vector<nlohmann::json>& entries, const std::string& op) {
  std::vector<nlohmann::json> out;
  for (const auto& e : entries)
    if (e.at("op") == op)
      out.push_back(e);
  return out;
}

} // namespace corodist::test
