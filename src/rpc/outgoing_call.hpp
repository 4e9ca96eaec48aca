#pragma once
// The handle through which a caller cancels one call it sent (private):
// future::cancel() and the cancellation of a coroutine awaiting agent::call
// reach the call's request on the loop, which ends it at once
// (connection::cancel_request: operation_aborted, the caller's
// cancelled_error) and tells the callee (kind_cancel, naming the request id).

#include <corodist/net/connection.hpp>

#include <atomic>
#include <cstdint>
#include <memory>

namespace corodist::rpc::detail {

class agent_core;

struct outgoing_call {
  explicit outgoing_call(std::weak_ptr<agent_core> c) : core(std::move(c)) {}

  std::weak_ptr<agent_core> core;
  std::atomic<bool> cancelled{false}; // any thread: cancel() was called

  // (loop only)
  bool sent = false;     // the request is on `conn` as `id`
  bool finished = false; // its response (or error) arrived: nothing to cancel
  std::weak_ptr<net::connection> conn;
  std::uint64_t id = 0;
};

} // namespace corodist::rpc::detail
