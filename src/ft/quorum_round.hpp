#pragma once
// One round of the quorum protocol over the store (keys: round_keys.hpp):
// the members of the last round arrive, the replicas waiting to join are
// taken in, one replica's proposal wins the round's decision key, and every
// replica reads that decision. Then, at the step's end, the members' votes
// and the single commit decision.

#include "ft/round_keys.hpp"

#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace corodist::ft::detail {

using clock = std::chrono::steady_clock;

/// What a replica needs to take part in rounds.
struct round_setup {
  std::shared_ptr<store::store> store;
  round_keys keys;
  std::chrono::milliseconds poll;
  int min_replicas = 1;
  int initial_replicas = 1; ///< the job's first round
  clock::time_point deadline;
};

/// A decided round.
struct decided_round {
  std::uint64_t id = 0;
  std::vector<member_line> members;
  /// The previous round's members (empty for the first round).
  std::vector<member_line> previous;
};

/// Round `prev.id + 1` for a member of the decided round `prev`: arrives,
/// decides when it is the last to arrive or a member was lost, and returns
/// the decision. Throws timeout_error at the deadline.
[[nodiscard]] asio::awaitable<decided_round> member_round(const round_setup& ctx, const decided_round& prev,
                                                          member_line self);

/// Joins the job's next round as a new replica (retrying later rounds until
/// a decision takes it in) and returns the round it is in.
[[nodiscard]] asio::awaitable<decided_round> join_round(const round_setup& ctx, member_line self);

/// Casts this member's vote in round `r` and returns the commit decision.
[[nodiscard]] asio::awaitable<bool> commit_round(const round_setup& ctx, const decided_round& r,
                                                 const member& self, bool ok);

/// Deletes the keys of round `r` (best effort; the decider of round r + 2 calls it).
[[nodiscard]] asio::awaitable<void> forget_round(std::shared_ptr<store::store> store, round_keys keys,
                                                 std::uint64_t r);

} // namespace corodist::ft::detail
