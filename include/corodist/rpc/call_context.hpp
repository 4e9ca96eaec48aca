#pragma once
/// \file
/// corodist::rpc::call_context: what a registered function may know of the call it serves.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>
#include <corodist/rpc/call_options.hpp>
#include <corodist/rpc/detail/call_state.hpp>
#include <corodist/rpc/worker_info.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace corodist::rpc {

/// Given to a registered function whose first parameter is `const
/// rpc::call_context&` (or `rpc::call_context`); it is not an argument on the
/// wire. Says who called, until when the caller waits, whether the caller
/// has cancelled the call, and the call's metadata headers. A plain function
/// that runs long can check `expired()` and `cancelled()` and give up; a
/// coroutine function is cancelled at the deadline and at the caller's
/// cancel anyway (its pending operation ends with `operation_aborted`).
/// Cheap to copy (the cancel flag and the metadata are shared); a copy stays
/// valid after the call ends.
class call_context {
public:
  using clock = std::chrono::steady_clock;

  call_context() = default;
  call_context(int caller_rank, std::string caller_name, corodist::deadline by)
      : caller_rank_(caller_rank), caller_name_(std::move(caller_name)), deadline_(by) {}
  /// As above, sharing the served call's state (cancel flag, metadata) with the dispatcher.
  call_context(int caller_rank, std::string caller_name, corodist::deadline by,
               std::shared_ptr<const detail::call_state> state)
      : caller_rank_(caller_rank), caller_name_(std::move(caller_name)), deadline_(by), state_(std::move(state)) {}

  /// The caller's rank (-1 when the connection did not say: a foreign client).
  int caller_rank() const noexcept { return caller_rank_; }
  /// The caller's worker name ("" when unknown).
  const std::string& caller() const noexcept { return caller_name_; }
  /// When the caller stops waiting (`is_never()`: it waits without a
  /// deadline). Calls this function makes (`agent::call`, `rpc_sync`,
  /// `rpc_async`, on its thread or in its coroutine) keep within it anyway:
  /// their deadline is the earlier of theirs and this one.
  corodist::deadline deadline() const noexcept { return deadline_; }
  /// True once the deadline has passed: the result would be dropped.
  bool expired() const noexcept { return deadline_.expired(); }
  /// True once the caller has cancelled the call (`future::cancel()`, or the
  /// cancellation of its `co_await agent::call`): the result would be
  /// dropped, so a plain function that polls it may return early (whatever
  /// it returns). Any thread; never blocks.
  bool cancelled() const noexcept { return state_ && state_->cancelled.load(std::memory_order_relaxed); }
  /// The call's metadata headers, as the caller gave them (empty: none).
  const call_metadata& metadata() const noexcept { return state_ ? state_->metadata : empty_metadata(); }
  /// The value of the first header named `key`, or nullopt (a view into
  /// this context's state: valid while a copy of the context lives).
  std::optional<std::string_view> header(std::string_view key) const noexcept {
    for (const auto& [k, v] : metadata())
      if (k == key)
        return std::string_view(v);
    return std::nullopt;
  }

private:
  static const call_metadata& empty_metadata() noexcept {
    static const call_metadata none;
    return none;
  }

  int caller_rank_ = -1;
  std::string caller_name_;
  corodist::deadline deadline_;
  std::shared_ptr<const detail::call_state> state_;
};

} // namespace corodist::rpc
