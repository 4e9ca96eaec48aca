#pragma once
/// \file
/// corodist::rpc::decode_result: the one way a reply from a worker becomes a
/// value of the type its caller asked for (an RPC's result, an RRef's value).

#include <corodist/core/config.hpp>

#include <corodist/net/buffer.hpp>
#include <corodist/rpc/codec.hpp>
#include <corodist/rpc/errors.hpp>
#include <corodist/rpc/message_port.hpp>

#include <string>
#include <type_traits>
#include <utility>

namespace corodist::rpc {

/// Decodes `reply`, a frame payload that worker `from` sent over `port`, as a
/// value of type R (nothing for void), with the codec context of that worker
/// (attachments, RRefs inside the value). Throws `bad_result_error`
/// "<operation> on worker '<name>': <why>" when it does not decode to R, and
/// `protocol_error` for a malformed payload. Any thread.
template <typename R>
R decode_result(message_port& port, int from, net::bytes reply, const std::string& operation) {
  if constexpr (std::is_void_v<R>)
    if (is_nil_payload(reply)) // (the common void reply: nothing to parse)
      return;
  codec_context ctx;
  port.decode_context(from, ctx);
  try {
    auto parsed = parse_payload(std::move(reply), ctx);
    if constexpr (!std::is_void_v<R>) {
      codec_scope scope(ctx);
      return decode_value<R>(parsed.body.get());
    }
  } catch (const value_type_error& e) {
    throw bad_result_error(operation, port.worker(from).name, e.what());
  }
}

} // namespace corodist::rpc
