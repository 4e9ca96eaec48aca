#pragma once
/// \file
/// corodist::rpc::call_context: what a registered function may know of the call it serves.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>
#include <corodist/rpc/worker_info.hpp>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace corodist::rpc {

/// Given to a registered function whose first parameter is `const
/// rpc::call_context&` (or `rpc::call_context`); it is not an argument on the
/// wire. Says who called and until when the caller waits: a plain function
/// that runs long can check `expired()` and give up; a coroutine function is
/// cancelled at the deadline anyway (its pending operation ends with
/// `operation_aborted`).
class call_context {
public:
  using clock = std::chrono::steady_clock;

  call_context() = default;
  call_context(int caller_rank, std::string caller_name, corodist::deadline by)
      : caller_rank_(caller_rank), caller_name_(std::move(caller_name)), deadline_(by) {}

  /// The caller's rank (-1 when the connection did not say: a foreign client).
  int caller_rank() const noexcept { return caller_rank_; }
  /// The caller's worker name ("" when unknown).
  const std::string& caller() const noexcept { return caller_name_; }
  /// When the caller stops waiting (`is_never()`: it waits without a
  /// deadline). Pass `deadline().left()` as the timeout of calls made on the
  /// caller's behalf to keep within it.
  corodist::deadline deadline() const noexcept { return deadline_; }
  /// True once the deadline has passed: the result would be dropped.
  bool expired() const noexcept { return deadline_.expired(); }
  /// The key/value headers the caller sent with the call or stream (in the
  /// order sent; empty when none).
  const std::vector<std::pair<std::string, std::string>>& metadata() const noexcept { return metadata_; }
  /// Sets them (the receiving side, as they arrive).
  void set_metadata(std::vector<std::pair<std::string, std::string>> m) { metadata_ = std::move(m); }

private:
  int caller_rank_ = -1;
  std::string caller_name_;
  corodist::deadline deadline_;
  std::vector<std::pair<std::string, std::string>> metadata_;
};

} // namespace corodist::rpc
