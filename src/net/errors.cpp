#include <corodist/core/error.hpp>
#include <corodist/net/errors.hpp>
#include <corodist/net/tls.hpp>

#include <asio/error.hpp>

#include <system_error>

namespace corodist::net {

namespace {
class category final : public std::error_category {
public:
  const char* name() const noexcept override { return "corodist.net"; }
  std::string message(int ev) const override {
    switch (static_cast<errc>(ev)) {
    case errc::bad_magic: return "bad magic in hello (not a corodist peer)";
    case errc::unsupported_version: return "unsupported protocol version";
    case errc::frame_too_large: return "frame larger than max_frame_size";
    case errc::truncated_frame: return "connection closed in the middle of a frame";
    case errc::hello_timeout: return "connect/hello timed out";
    case errc::request_timeout: return "request timed out";
    case errc::connection_closed: return "connection closed";
    case errc::too_many_pending: return "too many pending requests on this connection";
    case errc::output_overflow: return "peer does not read: buffered output over its cap";
    case errc::remote_failure: return "peer answered with an error";
    case errc::bad_hello: return "malformed hello";
    case errc::auth_required: return "the server requires authentication: set an auth token (CORODIST_AUTH_TOKEN)";
    case errc::auth_failed: return "authentication failed: wrong or missing token";
    case errc::frame_stalled: return "the peer stopped sending in the middle of a frame (frame_timeout)";
    case errc::auth_not_offered:
      return "the server does not authenticate, but an auth token is configured here: refusing to talk to it";
    case errc::closed_before_hello:
      return "the peer closed the connection before its hello (as a server at its connection limit, or swamped "
             "by connects, does)";
    case errc::tls_required:
      return "the server accepts TLS connections only, and this side has no TLS configured (tls options or "
             "CORODIST_TLS_CERT, CORODIST_TLS_KEY, CORODIST_TLS_CA)";
    case errc::peer_timed_out:
      return "the peer sent nothing within peer_timeout (it hangs, died without a reset, or the network between is down)";
    }
    return "unknown corodist.net error";
  }
};
} // namespace

const std::error_category& net_category() noexcept {
  static const category c;
  return c;
}

void throw_net_error(std::error_code ec, const std::string& context) {
  if (!ec)
    return;
  std::string what = context + ": " + ec.message();
  // A cancelled operation ends as every cancelled Asio operation does.
  if (ec == asio::error::operation_aborted)
    throw std::system_error(ec, what);
  if (ec == errc::request_timeout || ec == errc::hello_timeout || ec == errc::frame_stalled ||
      ec == asio::error::timed_out)
    throw timeout_error(what);
  if (ec == errc::bad_magic || ec == errc::unsupported_version || ec == errc::frame_too_large ||
      ec == errc::truncated_frame || ec == errc::bad_hello || ec == errc::auth_required ||
      ec == errc::auth_failed || ec == errc::auth_not_offered)
    throw protocol_error(what);
  if (ec == errc::tls_required)
    throw connection_error(what);
  if (ec == errc::remote_failure || ec == errc::too_many_pending)
    throw error(what);
  if (is_tls_error(ec))
    throw connection_error(what);
  // connection_closed, peer_timed_out, closed_before_hello, output_overflow, and every OS/Asio socket error.
  throw connection_error(what);
}

} // namespace corodist::net
