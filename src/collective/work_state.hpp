#pragma once
// The shared state behind a collective::work: completion, error, timing,
// and the collective's entry in its group's flight recorder (queued at
// issue, started, completed or failed with the error and its kind).
// Backends create one per collective and complete it from any thread.

#include <corodist/core/flight_recorder.hpp>
#include <corodist/core/future.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace corodist::collective::detail {

class work_state {
public:
  using clock = std::chrono::steady_clock;

  work_state(std::string op, std::uint64_t seq) : op_(std::move(op)), seq_(seq) {}

  /// Records the collective as `f` in `recorder` (null: recording is off);
  /// `mark_started` and `complete` then update the entry. Called once, before
  /// the work is shared with another thread.
  void record(std::shared_ptr<flight_recorder> recorder, const record_fields& f) {
    if (!recorder)
      return;
    handle_ = recorder->record(f);
    recorder_ = std::move(recorder);
  }

  /// Records the start of the collective on its communication side.
  void mark_started() noexcept {
    {
      std::lock_guard lk(mutex_);
      start_ = clock::now();
    }
    if (recorder_)
      recorder_->start(handle_);
  }

  /// Completes the work (once; later calls return false and change nothing),
  /// and its recorder entry (failed: with the error's text and kind,
  /// `error_kind`). Wakes plain-thread waiters and resumes an awaiting
  /// coroutine on its executor.
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

  /// The recorder's kind of a collective's error: "timeout"
  /// (collective_timeout_error), "rank_lost" (rank_lost_error), "mismatch"
  /// (the ranks' calls differ), "aborted" (the group was aborted before), or
  /// "error"; sets `text` to its message.
  static std::string_view error_kind(const std::exception_ptr& e, std::string& text);

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
  std::shared_ptr<flight_recorder> recorder_; // null: not recorded
  flight_recorder::handle handle_ = 0;
};

} // namespace corodist::collective::detail
