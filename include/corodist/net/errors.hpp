#pragma once
/// \file
/// net/'s error codes (std::error_code, Asio style). Higher layers turn them
/// into corodist exceptions with `throw_net_error`.

#include <corodist/core/config.hpp>

#include <string>
#include <system_error>

namespace corodist::net {

/// Errors of the framed-connection layer.
enum class errc {
  bad_magic = 1,        ///< the peer's hello did not start with corodist's magic
  unsupported_version,  ///< the peer speaks another protocol version
  frame_too_large,      ///< a frame's length exceeds max_frame_size
  truncated_frame,      ///< the peer closed the connection in the middle of a frame
  hello_timeout,        ///< connect + hello did not finish in time
  request_timeout,      ///< no response before the request's deadline
  connection_closed,    ///< the connection is (or was, with the request pending) closed
  too_many_pending,     ///< max_pending_requests reached on this connection
  output_overflow,      ///< the peer does not read: buffered output exceeded its cap
  remote_failure,       ///< the peer answered with an error frame (payload holds the text)
  bad_hello,            ///< malformed hello (e.g. oversized extension)
  auth_required,        ///< the server requires a token and none is configured
  auth_failed,          ///< the token was refused (or the peer's answer was wrong)
  frame_stalled,        ///< no byte of an incomplete frame arrived within frame_timeout
  auth_not_offered,     ///< this side holds a token but the server does not authenticate
  peer_timed_out,       ///< nothing at all was received from the peer for peer_timeout
  closed_before_hello,  ///< the peer closed the connection before sending any byte of its hello
  tls_required,         ///< this side speaks plain TCP, and the server's port accepts TLS only
};

/// The category of `errc` ("corodist.net").
const std::error_category& net_category() noexcept;

/// Makes an error_code of net_category().
inline std::error_code make_error_code(errc e) noexcept { return {static_cast<int>(e), net_category()}; }

/// Throws the corodist exception matching `ec` (timeout_error, connection_error
/// -- also for peer_timed_out and closed_before_hello: the connection is lost --,
/// protocol_error or error), prefixed with `context`; `operation_aborted` (a
/// cancelled operation) as `std::system_error` with that code, as Asio throws
/// it. No-op for a zero `ec`.
void throw_net_error(std::error_code ec, const std::string& context);

} // namespace corodist::net

template <>
struct std::is_error_code_enum<corodist::net::errc> : std::true_type {};
