#pragma once
// The stall probe of a gloo_group: a collective still running after
// gloo_options::mismatch_probe_delay publishes its call in the store, where
// the other stalled ranks compare theirs with it; a rank that finds a
// different call for the same collective reports both (and leaves the text
// in the store for the ranks that did not find it themselves).

#include <corodist/store/store.hpp>

#include "collective/gloo/call_header.hpp"

#include <asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace corodist::collective::detail {

class stall_probe : public std::enable_shared_from_this<stall_probe> {
public:
  /// What a probe that found a difference calls (on the store's executor):
  /// collective `seq`, "the ranks' calls differ: rank 0 called ..., rank 1 called ...".
  using report_fn = std::function<void(std::uint64_t seq, const std::string& text)>;

  /// Keys go to `group_keys` (the group's prefix): "stalled/<seq % 256>"
  /// holds the first stalled rank's record of a collective, "waiting/<rank>"
  /// the collective a rank last waited in ("collective #7: allreduce(...)"),
  /// "mismatch" the difference found. `label` names the group in log lines.
  /// With `options_only` (the call check finds calls that differ) only the
  /// same call sent as other messages (gloo_options that differ) counts.
  stall_probe(std::shared_ptr<store::store> group_keys, std::string label, bool options_only, report_fn report);

  /// True while a probe runs (one at a time per group).
  bool busy() const noexcept { return busy_.load(std::memory_order_acquire); }

  /// Starts a probe of `mine` (a stalled collective's record) on the store's
  /// executor and returns at once. A probe gives up after probe_limit; a
  /// store failure is logged and ignored.
  void start(const call_record& mine);

  /// The difference another rank found for collective `seq` and left in the
  /// store, if any. Blocks the calling thread (a communication thread, never
  /// an event loop's) for at most `limit`.
  std::optional<std::string> found_by_peer(std::uint64_t seq, std::chrono::milliseconds limit);

  /// The collective each rank last published as waiting in ("waiting/<rank>",
  /// for ranks below `size`): entry r is rank r's collective number, or
  /// nullopt when it never published one. Blocks the calling thread (a
  /// communication thread, never an event loop's) for at most `limit`;
  /// nullopt when the store did not answer in time, or failed (logged).
  std::optional<std::vector<std::optional<std::uint64_t>>> waiting_in(int size, std::chrono::milliseconds limit);

  /// No report after this returns (one in progress is waited for).
  void detach();

  /// How long one probe may take before it gives up.
  static constexpr std::chrono::milliseconds probe_limit{5000};

private:
  asio::awaitable<void> probe(call_record mine);
  /// Sets `key` within probe_limit; a failure is logged (for `rank`) and ignored.
  asio::awaitable<void> set_or_log(std::string key, std::string value, int rank);
  asio::awaitable<std::optional<call_record>> compare(call_record mine);

  const std::shared_ptr<store::store> keys_;
  const std::string label_;
  const bool options_only_;
  std::atomic<bool> busy_{false};
  std::mutex report_mutex_;
  report_fn report_;
};

} // namespace corodist::collective::detail
