#pragma once
// The store keys of the fault-tolerance protocol, and the text of a member's
// line in them. Under the job's prefix P:
//   P/alive/<id>/<incarnation>   owned by the replica's store connection
//   P/latest                     the last decided round
//   P/r/<r>/in/<id>              a member of round r-1 arrived: its line
//   P/r/<r>/count                members of round r-1 arrived (add)
//   P/r/<r>/joiners              lines of replicas asking to join (append)
//   P/r/<r>/decision             the members of round r (compare_set once)
//   P/r/<r>/vote/<id>, votes     the step's outcome per member, and their count
//   P/r/<r>/commit               "1" or "0" (compare_set once)
//   P/g/<r>/...                  the Gloo group formed in round r

#include <corodist/ft/quorum.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace corodist::ft::detail {

/// A member as it travels in the protocol: the public fields and whether its
/// group is unusable (it asks for a new one).
struct member_line {
  member m;
  bool needs_group = false;
};

/// Key names of one job (prefix P) and one round.
class round_keys {
public:
  explicit round_keys(std::string prefix) : prefix_(std::move(prefix)) {}

  std::string alive_dir() const { return prefix_ + "/alive/"; }
  std::string alive(const member& m) const;
  std::string latest() const { return prefix_ + "/latest"; }
  std::string round(std::uint64_t r) const { return prefix_ + "/r/" + std::to_string(r) + "/"; }
  std::string in(std::uint64_t r, const std::string& id) const { return round(r) + "in/" + id; }
  std::string count(std::uint64_t r) const { return round(r) + "count"; }
  std::string joiners(std::uint64_t r) const { return round(r) + "joiners"; }
  std::string decision(std::uint64_t r) const { return round(r) + "decision"; }
  std::string vote(std::uint64_t r, const std::string& id) const { return round(r) + "vote/" + id; }
  std::string votes(std::uint64_t r) const { return round(r) + "votes"; }
  std::string commit(std::uint64_t r) const { return round(r) + "commit"; }
  std::string group(std::uint64_t r) const { return prefix_ + "/g/" + std::to_string(r); }

private:
  std::string prefix_;
};

/// "<id> <step> <incarnation> <needs_group>\n".
std::string encode_line(const member_line& l);

/// Parses the lines of `text` (a decision, or the joiners' appended lines);
/// throws protocol_error naming `what` on a malformed line.
std::vector<member_line> decode_lines(std::string_view text, std::string_view what);

/// Whether `m` (name and incarnation) is among the alive keys `alive` (as list_keys returns them).
bool is_alive(const std::vector<std::string>& alive, const round_keys& keys, const member& m);

/// Same replica, same incarnation.
inline bool same(const member& a, const member& b) noexcept {
  return a.replica_id == b.replica_id && a.incarnation == b.incarnation;
}

} // namespace corodist::ft::detail
