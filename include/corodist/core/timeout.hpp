#pragma once
/// \file
/// corodist::timeout and corodist::deadline: the one way every public API says
/// how long an operation may take.
///
/// A `timeout` is what a caller passes: `timeout::after(d)` (or just a
/// `std::chrono` duration, which converts to it), `timeout::never()` or
/// `timeout::inherit()` (the default of the object or options the call goes
/// through). The API turns it once, at its edge, into a `deadline` (a point
/// on `std::chrono::steady_clock`, or none), which is what travels down the
/// layers; on the wire a deadline becomes the time remaining. A zero (or
/// negative) duration is a deadline that has already passed: the operation
/// fails with `timeout_error` unless it completes without waiting.

#include <corodist/core/config.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ostream>
#include <string>

namespace corodist {

class deadline;

/// How long an operation may take: a length, no limit, or "inherit" (use the
/// default of the object or options the call goes through). Cheap to copy;
/// every member is constexpr and noexcept.
class timeout {
public:
  /// The unit timeouts are kept and printed in.
  using duration = std::chrono::milliseconds;

  /// `inherit()`: the default of whatever the call goes through.
  constexpr timeout() noexcept = default;

  /// `after(d)`: lets a `std::chrono` duration be passed where a timeout is
  /// expected (`store.get("k", 5s)`). Rounds up to whole milliseconds; a
  /// negative duration is zero (already expired).
  template <typename Rep, typename Period>
  constexpr timeout(std::chrono::duration<Rep, Period> d) noexcept // NOLINT: implicit by design
      : kind_(kind::after), length_(clamp(std::chrono::ceil<duration>(d))) {}

  /// A limit of `d` from when the operation starts (zero or less: already expired).
  [[nodiscard]] static constexpr timeout after(duration d) noexcept { return timeout(d); }
  /// No limit: the operation may wait forever.
  [[nodiscard]] static constexpr timeout never() noexcept { return timeout(kind::never); }
  /// The default of the object or options the call goes through.
  [[nodiscard]] static constexpr timeout inherit() noexcept { return timeout(); }

  /// True for `never()`.
  [[nodiscard]] constexpr bool is_never() const noexcept { return kind_ == kind::never; }
  /// True for `inherit()`.
  [[nodiscard]] constexpr bool is_inherit() const noexcept { return kind_ == kind::inherit; }
  /// True for `after(d)`.
  [[nodiscard]] constexpr bool is_finite() const noexcept { return kind_ == kind::after; }

  /// The length of `after(d)`; `duration::max()` for `never()` and `inherit()`.
  [[nodiscard]] constexpr duration length() const noexcept { return is_finite() ? length_ : duration::max(); }

  /// This timeout, or `fallback` where this one is `inherit()`.
  [[nodiscard]] constexpr timeout or_else(timeout fallback) const noexcept { return is_inherit() ? fallback : *this; }

  /// The deadline this timeout sets for an operation starting at `now`:
  /// `deadline::never()` for `never()` and for `inherit()` (resolve it with
  /// `or_else` first: an API never starts an operation on an inherited timeout).
  [[nodiscard]] deadline from(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) const noexcept;

  /// "250 ms", "no time limit" or "the default time limit", for messages.
  [[nodiscard]] std::string str() const;

  friend constexpr bool operator==(const timeout&, const timeout&) noexcept = default;

  /// Writes `str()`.
  friend std::ostream& operator<<(std::ostream& os, const timeout& t) { return os << t.str(); }

private:
  enum class kind : std::uint8_t { inherit, after, never };
  constexpr explicit timeout(kind k) noexcept : kind_(k) {}
  static constexpr duration clamp(duration d) noexcept { return d < duration::zero() ? duration::zero() : d; }

  kind kind_ = kind::inherit;
  duration length_{0};
};

/// A point in time by which an operation must finish, on
/// `std::chrono::steady_clock`, or none (`never()`). What an API makes of a
/// `timeout` at its edge and passes down.
class deadline {
public:
  using clock = std::chrono::steady_clock;

  /// No deadline.
  constexpr deadline() noexcept = default;
  /// The deadline `at` (`time_point::max()` is none).
  constexpr explicit deadline(clock::time_point at) noexcept : at_(at) {}

  /// No deadline.
  [[nodiscard]] static constexpr deadline never() noexcept { return deadline(); }
  /// `d` from now (zero or less: already passed); saturates instead of overflowing.
  [[nodiscard]] static deadline after(clock::duration d, clock::time_point now = clock::now()) noexcept {
    if (d <= clock::duration::zero())
      return deadline(now);
    return d >= clock::time_point::max() - now ? never() : deadline(now + d);
  }

  /// True when there is no deadline.
  [[nodiscard]] constexpr bool is_never() const noexcept { return at_ == clock::time_point::max(); }
  /// The point in time (`time_point::max()` for none).
  [[nodiscard]] constexpr clock::time_point at() const noexcept { return at_; }
  /// True once the deadline has passed.
  [[nodiscard]] bool expired(clock::time_point now = clock::now()) const noexcept { return !is_never() && now >= at_; }
  /// The time left: zero once passed, `clock::duration::max()` with no deadline.
  [[nodiscard]] clock::duration remaining(clock::time_point now = clock::now()) const noexcept {
    if (is_never())
      return clock::duration::max();
    return at_ > now ? at_ - now : clock::duration::zero();
  }
  /// The time left as a timeout (`never()` with no deadline), for passing
  /// the rest of this deadline to an API that takes a timeout.
  [[nodiscard]] timeout left(clock::time_point now = clock::now()) const noexcept {
    return is_never() ? timeout::never() : timeout(remaining(now));
  }
  /// The wire form of this deadline (a frame's "time remaining" field): the
  /// whole milliseconds left, rounded up and at least 1 (so that a deadline
  /// that has not passed is never sent as none); 0 for none. An encoding for
  /// protocols only: APIs take a `timeout`.
  [[nodiscard]] std::uint64_t to_wire(clock::time_point now = clock::now()) const noexcept {
    if (is_never())
      return 0;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(remaining(now)).count();
    return ms < 1 ? 1 : static_cast<std::uint64_t>(ms);
  }
  /// The deadline a wire form `ms` (0: none) sets from `now`; more than a
  /// year is taken as none (it would overflow the clock's arithmetic).
  [[nodiscard]] static deadline from_wire(std::uint64_t ms, clock::time_point now = clock::now()) noexcept {
    constexpr std::uint64_t year_ms = 365ULL * 24 * 3600 * 1000;
    return ms == 0 || ms > year_ms ? never()
                                   : after(std::chrono::milliseconds(static_cast<std::int64_t>(ms)), now);
  }

  /// The earlier of two deadlines.
  [[nodiscard]] friend constexpr deadline earliest(deadline a, deadline b) noexcept {
    return a.at_ <= b.at_ ? a : b;
  }

  friend constexpr bool operator==(const deadline&, const deadline&) noexcept = default;

private:
  clock::time_point at_ = clock::time_point::max();
};

inline deadline timeout::from(std::chrono::steady_clock::time_point now) const noexcept {
  return is_finite() ? deadline::after(length_, now) : deadline::never();
}

inline std::string timeout::str() const {
  if (is_never())
    return "no time limit";
  if (is_inherit())
    return "the default time limit";
  return std::to_string(length_.count()) + " ms";
}

} // namespace corodist
