#pragma once
/// \file
/// RPC-specific errors. unknown_function_error and bad_arguments_error derive from `corodist::remote_error` (they are
/// reported by the callee), so `catch (const remote_error&)` sees every
/// failure the remote side reported.

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>

#include <asio/error.hpp>

#include <string>
#include <system_error>

namespace corodist::rpc {

/// The callee has no function registered under the called name.
/// `type()` is "unknown_function".
class unknown_function_error : public remote_error {
public:
  /// `worker`: the callee; `message` names the function.
  unknown_function_error(std::string worker, std::string message)
      : remote_error(std::move(worker), "unknown_function", std::move(message)) {}
};

/// The call's arguments do not decode to the function's parameter types (or
/// their number differs). `type()` is "bad_arguments".
class bad_arguments_error : public remote_error {
public:
  /// `worker`: the callee; `message` says which argument and why.
  bad_arguments_error(std::string worker, std::string message)
      : remote_error(std::move(worker), "bad_arguments", std::move(message)) {}
};

/// A reply does not decode to the type the caller asked for (an RPC's
/// result, an RRef's value in to_here). Raised on the caller; names the
/// operation, the worker and what arrived instead.
class bad_result_error : public error {
public:
  /// "<operation> on worker '<worker>': <why>", e.g. "rpc 'add' on worker 'w1': ...".
  bad_result_error(const std::string& operation, const std::string& worker, const std::string& why)
      : error(operation + " on worker '" + worker + "': " + why) {}
};

/// A call or stream was cancelled. For a call, by its caller:
/// `future::cancel()` on the future of `rpc_async`, or the cancellation of the
/// coroutine awaiting `call` (through its Asio cancellation slot); raised on
/// the caller at once, and a cancel frame tells the callee, whose coroutine
/// function is cancelled and whose plain function sees
/// `call_context::cancelled()`. For a stream, by either end (its reader or
/// writer called cancel(), or its reader was dropped before the end): raised
/// by the next read or write. A `std::system_error` with
/// `asio::error::operation_aborted`, as every cancelled operation in corodist
/// (and Asio) ends, so `catch (const std::system_error&)` checking the code
/// keeps working; catch `cancelled_error` to tell an RPC's cancel apart. (Not
/// a `corodist::error`: a cancellation is not a failure.)
class cancelled_error : public std::system_error {
public:
  /// "<what>: cancelled by its caller", e.g. "rpc 'f' on worker 'w1': cancelled by its caller".
  explicit cancelled_error(const std::string& what) : cancelled_error(what, "its caller") {}
  /// "<what>: cancelled by <by>", e.g. "stream 'tokens' from worker 'w1': cancelled by worker 'w1'".
  cancelled_error(const std::string& what, const std::string& by)
      : std::system_error(asio::error::operation_aborted, what + ": cancelled by " + by) {}
};

} // namespace corodist::rpc
