#pragma once
/// \file
/// corodist::collective::round_robin_group: spreads consecutive collectives
/// over several groups (PyTorch's `_round_robin_process_groups`).

#include <corodist/core/config.hpp>

#include <corodist/collective/process_group.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

namespace corodist::collective {

/// A group that sends its i-th collective to `groups[i % groups.size()]`, so
/// that independent collectives progress in parallel on separate connections
/// and threads. Sends and receives (which only their two ranks issue) all go
/// to the first group and do not move the rotation. Every rank must build it from the same groups in the same
/// order (and issue in the same order, as always). Errors are those of the
/// underlying group (its sequence numbers). `abort` aborts every group.
class round_robin_group final : public process_group {
public:
  /// Wraps `groups` (at least one; all of the same rank and size; none null).
  /// Throws `usage_error` otherwise. The default timeout is the first group's.
  explicit round_robin_group(std::vector<std::shared_ptr<process_group>> groups);

  std::string_view backend() const noexcept override { return "round_robin"; }
  /// The first group's.
  device control_device() const noexcept override { return groups_.front()->control_device(); }
  /// Collectives issued through this group.
  std::uint64_t sequence_number() const noexcept override { return next_.load(std::memory_order_relaxed); }
  void abort(const std::string& reason) override;
  /// True if any underlying group was aborted.
  bool aborted() const noexcept override;

  /// The underlying groups.
  const std::vector<std::shared_ptr<process_group>>& groups() const noexcept { return groups_; }

protected:
  work submit(collective_call call) override;

private:
  std::vector<std::shared_ptr<process_group>> groups_;
  std::mutex mutex_;
  std::atomic<std::uint64_t> next_{0};
};

} // namespace corodist::collective
