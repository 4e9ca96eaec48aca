#pragma once
// The warning of a collective that waits long: which ranks have not arrived,
// from every rank's flight recorders gathered through this process's debug
// responder (store/debug_responder.hpp), when it has one.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace corodist::collective::detail {

/// A collective that has waited long, as its warning names it.
struct waiting_collective {
  std::string call;     ///< "allreduce #3 (float32 x 1000, sum)"
  std::string group;    ///< the group's recorder name (its prefix), as the ranks record it
  int rank = 0;         ///< this rank in the group
  std::uint64_t seq = 0;
  std::chrono::steady_clock::duration waited{};
};

/// Logs a warning "rank 0: allreduce #3 (float32 x 1000, sum) on group 'g'
/// has waited 30.0 s; not arrived: ranks 2" (rank: this rank in the group;
/// the ranks not arrived: job ranks, as the responders number them). With a debug responder in this
/// process (`store::debug_responder::current()`), the ranks come from
/// `gather_dumps` (at most gather_limit, on the responder's store's
/// executor; returns at once) and `ranks_behind`; ranks that did not answer
/// are listed as such. Without one the warning is logged at once and says
/// that corodist-run's verdict names the ranks. `asking` (shared with the
/// group) keeps one gather at a time: a warning due while one runs is
/// logged without names. Any thread; never blocks.
void warn_waiting(waiting_collective w, const std::shared_ptr<std::atomic<bool>>& asking);

/// How long the ranks have to answer a warning's gather.
inline constexpr std::chrono::seconds gather_limit{3};

} // namespace corodist::collective::detail
