#pragma once
/// \file
/// corodist::store::watch_event: one change of a watched key.

#include <corodist/core/config.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace corodist::store {

/// One change of a watched key.
struct watch_event {
  enum class kind : std::uint8_t { created = 0, updated = 1, deleted = 2 };
  kind type = kind::created;
  std::string key;
  std::string value; ///< the new value; empty for `deleted`
};

/// "created", "updated" or "deleted".
inline std::string_view to_string(watch_event::kind k) noexcept {
  switch (k) {
  case watch_event::kind::created: return "created";
  case watch_event::kind::updated: return "updated";
  case watch_event::kind::deleted: return "deleted";
  }
  return "?";
}

} // namespace corodist::store
