#pragma once
/// \file
/// corodist::store::hang_verdict: who is behind and where, from every rank's
/// flight recorders — the verdict `corodist-run` prints when a job hangs.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>
#include <corodist/store/debug_responder.hpp>
#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace corodist::store {

/// Settings of a verdict.
struct verdict_options {
  /// How long the ranks have to answer.
  corodist::timeout gather = default_gather;
  static constexpr std::chrono::milliseconds default_gather{std::chrono::seconds(5)};
};

/// The verdict on a job's ranks.
struct hang_verdict {
  /// Lines naming who waits where and since when, and who is elsewhere,
  /// e.g. "ranks 0,1 wait in allreduce #3 (float32 x 1000, sum) on group
  /// 'g' since 31.0 s" and "rank 2 completed #2 of group 'g' and is in no
  /// collective (last: call 'load' to 'w1', 29.0 s ago)".
  std::vector<std::string> lines;
  /// True when some rank has an operation waiting (started or queued).
  bool waiting = false;
  /// Every rank's answer as gathered.
  std::vector<rank_dump> dumps;

  /// The lines, one per line.
  std::string text() const;
  /// `{"verdict": [lines], "ranks": [{"rank", "problem", "dump"}]}`.
  std::string dumps_json() const;
};

/// The verdict on `dumps` (pure: no I/O).
hang_verdict analyze_dumps(std::vector<rank_dump> dumps);

/// The ranks among `dumps` that have not started operation `seq` of the
/// recorder (`layer`, `name`) (a group's collective number: they are
/// behind), lowest first; ranks without an answer, and ranks without that
/// recorder (not in the group), are not listed.
std::vector<int> ranks_behind(const std::vector<rank_dump>& dumps, std::string_view layer, std::string_view name,
                              std::uint64_t seq);

/// Gathers every rank's recorders (`gather_dumps`) and returns the verdict.
/// Throws as `gather_dumps`. Cancellation: as `gather_dumps`.
[[nodiscard]] asio::awaitable<hang_verdict> collect_hang_verdict(std::shared_ptr<store> job_store, int world_size,
                                                                 verdict_options opts = {});

} // namespace corodist::store
