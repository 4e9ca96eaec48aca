#pragma once
// The RPC protocol's frame kinds (net::frame_header::kind) and error-reply codes (private).

#include <cstdint>

namespace corodist::rpc::detail {

inline constexpr std::uint16_t kind_call = 0x0500;        ///< request: [name, [args...]] + attachments
inline constexpr std::uint16_t kind_reply = 0x0501;       ///< response: result + attachments
inline constexpr std::uint16_t kind_error_reply = 0x0502; ///< response: [code, type, message]

/// Codes of an error reply.
enum class failure : int { exception = 0, unknown_function = 1, bad_arguments = 2, malformed = 3 };

} // namespace corodist::rpc::detail
