#pragma once
/// \file
/// corodist::collective::cuda_event: a point in a CUDA stream's work that the
/// host can poll or await, and that other streams can wait for.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <asio/awaitable.hpp>

#include <chrono>
#include <memory>

namespace corodist::collective {

namespace detail {
struct cuda_event_handle;
} // namespace detail

/// A CUDA event (`cudaEvent_t`, timing disabled) of one device. Made by
/// `cuda_event::create` or `cuda_stream::record()`; re-recorded in place by
/// `cuda_stream::record(event)`. Copies share the event; the last copy
/// destroys it. Thread-safe as CUDA's own calls are.
class cuda_event {
public:
  /// Defaults of `wait`.
  static constexpr std::chrono::microseconds default_first_poll{20};
  static constexpr std::chrono::microseconds default_max_poll{1000};

  /// An empty event (`valid() == false`): ready at once, waited for by nothing.
  cuda_event() = default;

  /// A new, never recorded event on CUDA device `device` (ready until
  /// recorded). Throws `cuda_error` (no CUDA here, a CUDA failure).
  static cuda_event create(int device);

  /// True if this refers to an event.
  bool valid() const noexcept { return handle_ != nullptr; }

  /// The device the event belongs to (-1 when empty).
  int device() const noexcept;

  /// True once all the work recorded before it has completed (also when empty
  /// or never recorded). Never blocks. Throws `cuda_error` when that work failed.
  bool ready() const;

  /// Awaits `ready()` without blocking the thread: polls on a timer of the
  /// awaiting coroutine's executor, first after `first_poll`, doubling up to
  /// `max_poll`. Throws `timeout_error` past `limit` (`inherit()` and
  /// `never()`: no limit; the work goes on), `cuda_error` when the work failed.
  /// Cancellation: terminal, partial and total (`operation_aborted`); it stops
  /// the wait only, the work goes on.
  [[nodiscard]] asio::awaitable<void> wait(corodist::timeout limit,
                                           std::chrono::microseconds first_poll = default_first_poll,
                                           std::chrono::microseconds max_poll = default_max_poll) const;

  /// Blocks the calling thread until `ready()` (`cudaEventSynchronize`).
  /// Throws `cuda_error` when the work failed.
  void synchronize() const;

  /// The `cudaEvent_t` (null when empty).
  void* native() const noexcept;

private:
  friend class cuda_stream;
  explicit cuda_event(std::shared_ptr<detail::cuda_event_handle> h) noexcept : handle_(std::move(h)) {}

  std::shared_ptr<detail::cuda_event_handle> handle_;
};

} // namespace corodist::collective
