#pragma once
/// \file
/// corodist::ft::quorum: the replicas that train one step together.

#include <corodist/core/config.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace corodist::ft {

/// One replica of a quorum.
struct member {
  /// The replica's stable name (manager_options::replica_id).
  std::string replica_id;
  /// The steps it had committed when it joined the quorum.
  std::uint64_t step = 0;
  /// A number drawn by each start of the replica's manager: a restarted
  /// replica has the same name and another incarnation.
  std::uint64_t incarnation = 0;
};

/// The outcome of one `manager::start_step`: who trains this step.
struct quorum {
  /// The quorum's number (1 for the job's first; one more each step).
  std::uint64_t id = 0;
  /// The live replicas, sorted by name: a member's index is its rank in the group.
  std::vector<member> members;
  /// This replica's index in `members`.
  int rank = -1;
  /// The highest step among the members: the step the quorum trains.
  std::uint64_t max_step = 0;
  /// Members that were not in the previous quorum (new or restarted replicas).
  std::vector<std::string> joined;
  /// Members of the previous quorum that are not in this one.
  std::vector<std::string> left;
  /// True when the manager formed a new process group for this quorum.
  bool reconfigured = false;
  /// True when the state was sent from `members[source]` to the others this step.
  bool recovered = false;
  /// The member whose state was sent (when `recovered`), else -1.
  int source = -1;

  /// The number of members.
  int size() const noexcept { return static_cast<int>(members.size()); }
};

} // namespace corodist::ft
