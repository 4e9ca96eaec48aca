#pragma once
// The shape of a call body, `[name, [args...], timeout_ms]`, with a 4th
// element `{key: value, ...}` (strings) when the call has metadata (private).

#include <corodist/rpc/call_options.hpp>
#include <corodist/rpc/detail/codec.hpp>

#include <cstdint>
#include <string_view>

namespace corodist::rpc::detail {

/// A call body, viewed in place (valid while the parsed payload lives).
struct call_view {
  std::string_view name;
  const msgpack::object* args = nullptr;
  std::uint64_t timeout_ms = 0; ///< 0: no deadline
  const msgpack::object* metadata = nullptr; ///< a map of str to str; null: none
  std::size_t metadata_bytes = 0;            ///< its keys' and values' lengths summed
};

/// Reads a call body; throws protocol_error if it is not `[str, array-or-any,
/// uint]` or `[str, array-or-any, uint, map of str to str]`.
/// Part of the fuzzing entry point of the RPC decoder (with parse_payload).
call_view view_call(const msgpack::object& body);

/// The metadata of a call viewed by view_call, copied out (empty: none).
call_metadata read_metadata(const call_view& v);

} // namespace corodist::rpc::detail
