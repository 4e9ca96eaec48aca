#pragma once
// The shared state behind a collective::work: completion, error, timing.
// Backends create one per collective and complete it from any thread.

#include <corodist/core/future.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

namespace corodist::collective::detail {

class work_state {
public:
  using clock = std::chrono::steady_clock;

  work_state(std::string op, std::uint64_t seq) : op_(std::move(op)), seq_(seq) {}

  /// Records the start of the collective on its communication side.
  void mark_started() noexcept {
    std::lock_guard lk(mutex_);
    start_ = clock::now();
  }

  /// Completes the work (once; later calls return false and change nothing).
  /// Wakes plain-thread waiters and resumes an awaiting coroutine on its executor.
  bool complete(std::exception_ptr error = nullptr);

  bool completed() const {
    std::lock_guard lk(mutex_);
    return done_;
  }

  /// Blocks up to `timeout` (nullopt: forever); true once completed.
  bool wait(std::optional<std::chrono::milliseconds> timeout) const;

  std::exception_ptr error() const {
    std::lock_guard lk(mutex_);
    return error_;
  }

  std::chrono::nanoseconds duration() const {
    std::lock_guard lk(mutex_);
    if (!done_ || start_ == clock::time_point{})
      return std::chrono::nanoseconds{0};
    return end_ - start_;
  }

  /// A receive: records the rank its data came from (before `complete`).
  void set_source(int rank) noexcept {
    std::lock_guard lk(mutex_);
    source_ = rank;
  }
  int source() const noexcept {
    std::lock_guard lk(mutex_);
    return done_ ? source_ : -1;
  }

  const std::string& op() const noexcept { return op_; }
  std::uint64_t seq() const noexcept { return seq_; }

  /// Suspends the calling coroutine until completion; rethrows the error.
  asio::awaitable<void> await();

private:
  const std::string op_;
  const std::uint64_t seq_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::optional<promise<void>> waiter_;
  clock::time_point start_{};
  clock::time_point end_{};
  int source_ = -1;
};

} // namespace corodist::collective::detail
