#pragma once
// Error replies: how a failure on the callee travels back and what the caller
// then throws (private).

#include <corodist/rpc/payload.hpp>

#include <exception>
#include <stdexcept>
#include <string>
#include <string_view>

namespace corodist::rpc::detail {

/// Codes of an error reply.
enum class failure : int {
  exception = 0,        ///< the function (or handler) threw: remote_error with its type
  unknown_function = 1, ///< unknown_function_error
  bad_arguments = 2,    ///< bad_arguments_error
  malformed = 3,        ///< the callee could not parse the message: protocol_error
  deadline = 4,         ///< the call's deadline passed on the callee: timeout_error
  cancelled = 5,        ///< the caller cancelled the call: cancelled_error (the caller has dropped it: not sent)
};

/// A failure the callee itself finds (a call or a stream open it cannot run),
/// with the code it travels as.
struct call_failure : std::runtime_error {
  call_failure(failure c, const std::string& what) : std::runtime_error(what), code(c) {}
  failure code;
};

/// Encodes an error reply `[code, type, message]`.
payload encode_failure(failure code, std::string_view type, std::string_view message);

/// Encodes the error reply for exception `e` (a handler's or function's): its
/// demangled dynamic type and what() as a `failure::exception`. A remote_error
/// (relayed from another worker) keeps its type and message, noting the worker
/// it was raised on unless that is `self`.
payload encode_exception(const std::exception_ptr& e, const std::string& self = {});

/// The exception an error reply from `worker` to the request `what` ("rpc
/// 'f' on worker 'w1'") stands for: a remote_error (or one of its kinds) as the
/// callee raised it, else an error reading `<what>: <reason>` (protocol_error
/// also if the reply itself is malformed).
std::exception_ptr decode_failure(const std::string& worker, const std::string& what, net::bytes&& payload);

} // namespace corodist::rpc::detail
