#pragma once
/// \file
/// corodist::rpc::stream_options: how agent::open_stream / open_bidi open a stream.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>
#include <corodist/rpc/call_options.hpp>

#include <string>
#include <utility>
#include <vector>

namespace corodist::rpc {

/// Options of one stream.
struct stream_options {
  /// The stream's deadline, from the open: at it, both ends fail with
  /// timeout_error and the handler is cancelled. `inherit()`: the agent's
  /// rpc_timeout; `never()`: none.
  corodist::timeout timeout = corodist::timeout::inherit();
  /// Key/value headers the stream function sees in call_context::metadata().
  call_metadata metadata;
};

} // namespace corodist::rpc
