#pragma once
/// \file
/// corodist's exception types shared by every layer. Layers above net/ throw
/// these (and their own, in each layer's errors.hpp, all derived from
/// corodist::error); net/ itself reports std::error_code (see
/// corodist/net/errors.hpp).

#include <corodist/core/config.hpp>

#include <stdexcept>
#include <string>

namespace corodist {

/// Base of every exception corodist throws: `catch (const corodist::error& e)`
/// sees them all, and `e.what()` says what happened.
class error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// An operation did not finish before its deadline.
class timeout_error : public error {
public:
  using error::error;
};

/// A connection could not be made, or was lost with the operation pending.
class connection_error : public error {
public:
  using error::error;
};

/// The connection to a peer worker was lost (reset, closed, or silent for the
/// connection's peer_timeout) with an operation depending on it: names the
/// worker and its rank; what() gives the reason, e.g. "worker 'w1' (rank 1)
/// lost: no frame received for 1000 ms".
class peer_lost_error : public connection_error {
public:
  /// Builds "<context>: worker '<worker>' (rank <rank>) lost: <reason>" (without
  /// "<context>: " when `context` is empty).
  peer_lost_error(std::string worker, int rank, std::string reason, const std::string& context = {})
      : connection_error((context.empty() ? std::string() : context + ": ") + "worker '" + worker + "' (rank " +
                         std::to_string(rank) + ") lost: " + reason),
        worker_(std::move(worker)), reason_(std::move(reason)), rank_(rank) {}

  /// The lost worker's name.
  const std::string& worker() const noexcept { return worker_; }
  /// The lost worker's rank.
  int rank() const noexcept { return rank_; }
  /// Why it counts as lost (e.g. "no frame received for 1000 ms").
  const std::string& reason() const noexcept { return reason_; }

private:
  std::string worker_;
  std::string reason_;
  int rank_;
};

/// The peer broke the wire protocol (bad magic, version, frame, or payload).
class protocol_error : public error {
public:
  using error::error;
};

/// An API was used in a way that cannot work, e.g. a blocking call made on
/// the event-loop thread (which would deadlock) or start() on an embedded loop.
class usage_error : public error {
public:
  using error::error;
};

/// A remote function threw: carries the worker, the exception's type and message.
class remote_error : public error {
public:
  /// Builds "remote_error on <worker>: <type>: <message>".
  remote_error(std::string worker, std::string type, std::string message)
      : error("on worker '" + worker + "': " + type + ": " + message),
        worker_(std::move(worker)), type_(std::move(type)), message_(std::move(message)) {}

  /// The name of the worker the exception was raised on.
  const std::string& worker() const noexcept { return worker_; }
  /// The remote exception's type name (demangled where possible).
  const std::string& type() const noexcept { return type_; }
  /// The remote exception's what() text.
  const std::string& message() const noexcept { return message_; }

private:
  std::string worker_;
  std::string type_;
  std::string message_;
};

} // namespace corodist
