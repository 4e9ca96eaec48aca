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


// Streams (stream_core.cpp, stream_table.cpp). Every stream frame's payload
// starts with the stream's id (u64 LE), which its client picked; the server
// knows a stream by its connection and id.

/// request, client to server: `[id, name, [args...], timeout_ms, mode, window_items,
/// window_bytes, {metadata}]` + attachments; answered by a reply `[window_items,
/// window_bytes]` (the server's receive window) or an error reply
inline constexpr message_kind kind_stream_open = 0x0510;
/// one-way, either way: `id, u32 count, u32 attachment_count`, then per item
/// `u32 length` (top bit: a u64 of its attachments' bytes follows the item),
/// the item's msgpack, then `u64 length` per attachment; the attachments follow
inline constexpr message_kind kind_stream_items = 0x0511;
/// one-way, either way: `id`: the writer closed; no item follows
inline constexpr message_kind kind_stream_end = 0x0512;
/// one-way, server to client: `id` + an error reply payload: the handler failed
inline constexpr message_kind kind_stream_error = 0x0513;
/// one-way, either way: `id, u32 items, u64 bytes`: the reader took these; the writer may send as much more
inline constexpr message_kind kind_stream_credit = 0x0514;
/// one-way, either way: `id`: the stream is cancelled
inline constexpr message_kind kind_stream_cancel = 0x0515;
/// The range of stream kinds, [first, last].
inline constexpr message_kind kind_stream_first = 0x0510;
inline constexpr message_kind kind_stream_last = 0x051f;

/// Whether `k` is a stream frame's kind.
constexpr bool is_stream_kind(message_kind k) noexcept { return k >= kind_stream_first && k <= kind_stream_last; }

} // namespace corodist::rpc::detail
