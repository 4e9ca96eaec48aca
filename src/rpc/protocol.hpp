#pragma once
// The RPC protocol's frame kinds and error-reply codes (private).

#include <corodist/rpc/message_port.hpp>

namespace corodist::rpc::detail {

/// request: a call body `[name, [args...], timeout_ms]` (or with a 4th
/// element, the call's metadata `{str: str}`) + attachments
inline constexpr message_kind kind_call = 0x0500;
/// response to a call or any request: the result + attachments
inline constexpr message_kind kind_reply = 0x0501;
/// response: `[code, type, message]` (error_reply.hpp)
inline constexpr message_kind kind_error_reply = 0x0502;
/// one-way, first frame on a connection a worker dialled: its rank (i32 LE)
inline constexpr message_kind kind_identify = 0x0503;
/// one-way, caller to callee on the caller's connection: cancel the call sent
/// there with request id (u64 LE, the whole payload); unknown or finished: ignored
inline constexpr message_kind kind_cancel = 0x0504;

} // namespace corodist::rpc::detail
