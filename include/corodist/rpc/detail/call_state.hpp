#pragma once
/// \file
/// The state of one call being served, shared by the dispatcher and the
/// call's `call_context` (private to rpc/; in a public header because the
/// agent's call templates read the current one).

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>
#include <corodist/rpc/call_options.hpp>

#include <atomic>

namespace corodist::rpc::detail {

/// What a served call's function may learn while it runs; the dispatcher
/// sets `cancelled` when the caller's cancel arrives (any thread reads it).
struct call_state {
  corodist::deadline deadline;
  std::atomic<bool> cancelled{false};
  call_metadata metadata;
};

/// The served call whose function runs on this thread now (a plain function
/// on the pool, or a coroutine function between two suspensions); null when
/// none. Read by the agent's calls for deadline propagation.
const call_state* current_call() noexcept;

/// Makes `s` the current call for its lifetime (restoring the one before).
class current_call_scope {
public:
  explicit current_call_scope(const call_state* s) noexcept;
  ~current_call_scope();
  current_call_scope(const current_call_scope&) = delete;
  current_call_scope& operator=(const current_call_scope&) = delete;

private:
  const call_state* previous_;
};

} // namespace corodist::rpc::detail
