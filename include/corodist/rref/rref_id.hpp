#pragma once
/// \file
/// corodist::rref::global_id: the ids of the RRef protocol (RRefId, ForkId).

#include <corodist/core/config.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace corodist::rref {

/// A globally unique id: the worker that made it and a counter of that worker.
/// RRefIds are made by the creator of a remote() (or by the owner for
/// make_rref); ForkIds by the worker that forks an RRef to another.
struct global_id {
  std::int32_t worker = -1;
  std::uint64_t local = 0;

  /// False for the empty id.
  explicit operator bool() const noexcept { return worker >= 0; }
  friend bool operator==(const global_id&, const global_id&) = default;
  friend auto operator<=>(const global_id&, const global_id&) = default;
  /// "{worker, local}".
  std::string str() const {
    // Appended piece by piece: GCC 12's -Wrestrict misfires on "{" + std::string.
    std::string s = "{";
    s += std::to_string(worker);
    s += ", ";
    s += std::to_string(local);
    s += '}';
    return s;
  }
};

/// Identifies an RRef (its OwnerRRef and every UserRRef of it).
using rref_id = global_id;
/// Identifies one UserRRef of an RRef.
using fork_id = global_id;

/// Hash for unordered containers.
struct global_id_hash {
  std::size_t operator()(const global_id& g) const noexcept {
    return std::hash<std::uint64_t>{}(g.local * 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(g.worker));
  }
};

} // namespace corodist::rref
