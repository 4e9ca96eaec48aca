#pragma once
// The shape of a call body, `[name, [args...], timeout_ms]` (private).

#include <corodist/rpc/detail/codec.hpp>

#include <cstdint>
#include <string_view>

namespace corodist::rpc::detail {

/// A call body, viewed in place (valid while the parsed payload lives).
struct call_view {
  std::string_view name;
  const msgpack::object* args = nullptr;
  std::uint64_t timeout_ms = 0; ///< 0: no deadline
};

/// Reads a call body; throws protocol_error if it is not `[str, array-or-any, uint]`.
/// Part of the fuzzing entry point of the RPC decoder (with parse_payload).
call_view view_call(const msgpack::object& body);

} // namespace corodist::rpc::detail
