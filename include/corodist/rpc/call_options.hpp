#pragma once
/// \file
/// corodist::rpc::call_options: per-call settings of `rpc::agent`'s calls
/// (time limit, deadline propagation, metadata headers).

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace corodist::rpc {

/// A call's metadata: small key/value string headers that travel with it
/// (e.g. `{"trace-id", "..."}`), in order; keys need not be unique.
using call_metadata = std::vector<std::pair<std::string, std::string>>;

/// The most bytes a call's metadata may hold: its keys' and values' lengths
/// summed. More is refused (`usage_error` on the caller; a foreign caller
/// that sends more gets an error reply).
inline constexpr std::size_t max_metadata_bytes = 8192;

/// Per-call settings of `agent::rpc_async` / `rpc_sync` / `call`:
/// `rpc.call<int>(rpc::call_options{.timeout = 500ms, .metadata = {{"trace-id", id}}}, "w1", "f", 1)`.
struct call_options {
  /// Time limit of the call, counted from the call (`inherit()`, the
  /// default: the agent's `rpc_timeout`; `never()`: none).
  corodist::timeout timeout = corodist::timeout::inherit();
  /// Made from inside a registered function (while it serves a call): the
  /// call's deadline is the earlier of its own (from `timeout`) and the
  /// served call's, as gRPC propagates deadlines. `false`: its own only.
  bool propagate_deadline = true;
  /// Headers for the callee (`call_context::metadata()`); at most
  /// `max_metadata_bytes`. Empty: nothing more travels.
  call_metadata metadata = {};
};

} // namespace corodist::rpc
