#pragma once
/// \file
/// corodist::collective::work: one collective in flight — awaitable from a
/// coroutine, waitable from a plain thread.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

namespace corodist::collective {

namespace detail {
class work_state;
}

/// The handle of an issued collective.
///
/// * In a coroutine: `co_await pg.allreduce(t)` or `co_await std::move(w)`
///   (a `work` is an `asio::awaitable<void>`, awaitable once): suspends
///   without blocking a thread, resumes on the awaiting coroutine's executor,
///   and rethrows the collective's error.
///   Cancellation: terminal, partial and total through the awaiting
///   coroutine's slot (as far as its coroutine lets them through, see
///   docs/core.md): the await ends with `operation_aborted`; the collective
///   is not stopped (the other ranks still need it): it runs to its end, its
///   buffers stay in use until `is_completed()`, and `get()`/`wait()` still
///   report its outcome. To stop a collective, abort the group.
/// * From a plain thread: `get()` or `wait(timeout)`; both throw `usage_error`
///   on an event-loop thread while the collective is still running.
///
/// Errors: `collective_timeout_error` (the deadline passed; the group is then
/// aborted), `collective_error` (a peer failed, the ranks' calls differ, or
/// the group was aborted earlier). The buffers stay in use until
/// `is_completed()`. Moving is cheap; a `work` may outlive its group.
class work : public asio::awaitable<void> {
public:
  /// An invalid handle (`valid() == false`).
  work() = default;
  /// Wraps a backend's state (backends only).
  explicit work(std::shared_ptr<detail::work_state> state);
  work(work&&) noexcept = default;
  work& operator=(work&&) noexcept = default;
  ~work();

  /// True if the handle refers to a collective.
  bool valid() const noexcept { return state_ != nullptr; }

  /// True once the collective has finished, successfully or not. Never blocks.
  bool is_completed() const;

  /// Blocks until the collective has finished, then rethrows its error if it
  /// failed. May be called repeatedly. Throws `usage_error` on an event-loop
  /// thread while it is still running.
  void get() const;

  /// As `get()`, but gives up after `limit` (`inherit()` or `never()`: as
  /// `get()`, bounded by the collective's own deadline) with `timeout_error` (the
  /// collective itself keeps running, bound by its own deadline).
  void wait(corodist::timeout limit) const;

  /// The collective's error once it failed; null while running or after success.
  std::exception_ptr exception() const;

  /// Time from the collective's start on its communication thread (or
  /// stream) to its completion; zero until completed.
  std::chrono::nanoseconds duration() const;

  /// The collective's sequence number in its group.
  std::uint64_t seq() const;

  /// The collective's name ("allreduce", ...).
  const std::string& op() const;

  /// A completed receive: the rank its data came from (for a `recv` from
  /// `any_source`, the rank that sent it); -1 for other works and until completed.
  int source_rank() const;

private:
  void check_valid() const;

  std::shared_ptr<detail::work_state> state_;
};

} // namespace corodist::collective
