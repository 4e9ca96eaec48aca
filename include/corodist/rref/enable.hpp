#pragma once
/// \file
/// corodist::rref::enable: turning RRefs on for an RPC agent, and the
/// settings of its RRef protocol (enable_options).

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/rpc/agent.hpp>

#include <chrono>

namespace corodist::rref {

using namespace std::chrono_literals;

/// Settings of a worker's RRef protocol. Defaults are the named constants.
struct enable_options {
  static constexpr std::chrono::milliseconds default_timeout = 60s;
  static constexpr std::chrono::milliseconds default_first_retry = 50ms;
  static constexpr std::chrono::milliseconds default_max_retry_interval = 2s;
  static constexpr std::chrono::milliseconds default_give_up_after = 60s;

  /// Time limit of to_here() and of remote()'s call when none is given
  /// (`inherit()`: default_timeout; `never()`: none).
  corodist::timeout timeout = default_timeout;
  /// A control message not yet acknowledged is sent again after this, then
  /// after twice as long, ... up to max_retry_interval.
  std::chrono::milliseconds first_retry = default_first_retry;
  std::chrono::milliseconds max_retry_interval = default_max_retry_interval;
  /// Retries to a worker stop after this long without an acknowledgement from
  /// it (a dead worker is not a transient failure): logged once, then dropped
  /// (`never()`: retried for ever; `inherit()`: default_give_up_after).
  corodist::timeout give_up_after = default_give_up_after;
};

/// Turns RRefs on for `a` (before `a.start()`; throws usage_error after, or if
/// already enabled): message handlers, the retry timer, and a step in graceful
/// shutdown that deletes every UserRRef here and waits until no OwnerRRef here
/// is referenced from another worker (within the time the agent's shutdown
/// gives it; what is still held is logged by RRefId, nothing is thrown).
/// OwnerRRefs that only this worker's own handles hold are the application's:
/// not waited for, they keep their value until their last handle goes.
void enable(rpc::agent& a, enable_options opts = {});

} // namespace corodist::rref
