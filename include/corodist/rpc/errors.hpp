#pragma once
/// \file
/// RPC-specific errors. Both derive from `corodist::remote_error` (they are
/// reported by the callee), so `catch (const remote_error&)` sees every
/// failure the remote side reported.

#include <corodist/core/config.hpp>

#include <corodist/core/error.hpp>

#include <string>

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

/// A stream was cancelled: by its other end (its reader or writer called
/// cancel(), or its reader was dropped before the end), or by this end's own
/// cancel(). Raised by the next read or write of the stream.
class cancelled_error : public error {
public:
  using error::error;
};

} // namespace corodist::rpc
