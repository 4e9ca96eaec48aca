#pragma once
/// \file
/// corodist::net::listener: accepts TCP connections and performs the hello.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/core/io_registration.hpp>
#include <corodist/net/connection.hpp>

#include <asio/ip/tcp.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <chrono>
#include <system_error>

namespace corodist::net {

/// A second protocol served on a listener's port, told apart from the native
/// hello by a connection's first byte (the hello's first byte is
/// `protocol_magic & 0xff`, 'C').
struct foreign_protocol {
  /// Whether this protocol takes a connection whose first byte is `first`.
  std::function<bool(std::uint8_t first)> accepts;
  /// Takes over a claimed socket; nothing has been read from it yet. `silent`:
  /// it sent nothing within the handshake timeout (see take_silent); if its
  /// first byte later is the native hello's, hand it back with
  /// listener::accept_late_hello.
  std::function<void(asio::ip::tcp::socket, bool silent)> take;
  /// Also take connections that send nothing within the handshake timeout
  /// (they are kept open with TCP keep-alive on); if false they are closed.
  bool take_silent = false;
};

/// `requested`, or when it is 0, the process's open-file limit (RLIMIT_NOFILE,
/// soft) less 64 descriptors of headroom: the default connection limit of the
/// servers built on listener. With `io` = transport::uring (where the ring
/// service can run), connections hold no descriptor once started, and the
/// default is what the rings hold: 16 tables of that open-file limit (each at
/// most 65,536).
std::size_t connection_limit(std::size_t requested, transport io = configured_transport()) noexcept;

/// The accept backlog of every listener: the system's limit,
/// net.core.somaxconn, read once from /proc/sys/net/core/somaxconn (the
/// compile-time SOMAXCONN when it cannot be read), so that a raised sysctl
/// serves connect storms of many thousand clients. Any thread.
int listen_backlog() noexcept;

/// Accepts connections on an endpoint (port 0: the kernel picks; read it back
/// with `local_endpoint()`), runs the server side of the hello on each, and
/// hands every good connection, unstarted, to the accept handler. A bad or
/// slow hello closes that socket only, with a log line. Loop-affine.
/// Cancellation: it has no awaitable operation; `close()` stops accepting
/// (the handshakes under way end at their timeout).
class listener : public std::enable_shared_from_this<listener> {
public:
  /// Receives each connection after a successful hello; it must call start().
  using accept_handler = std::function<void(std::shared_ptr<connection>)>;

  /// Binds and listens (backlog listen_backlog(): net.core.somaxconn;
  /// SO_REUSEADDR) on `ep`. On failure
  /// returns the error and a null pointer.
  static std::pair<std::error_code, std::shared_ptr<listener>>
  listen(asio::any_io_executor ex, const asio::ip::tcp::endpoint& ep, connection_options opts,
         accept_handler on_accept);

  listener(asio::ip::tcp::acceptor acceptor, connection_options opts, accept_handler on_accept);
  ~listener();
  listener(const listener&) = delete;
  listener& operator=(const listener&) = delete;

  /// Serves `p` beside the native protocol: each connection's first byte picks
  /// one; a byte neither accepts is logged and the socket closed. Call before start().
  void set_foreign_protocol(foreign_protocol p) { foreign_ = std::move(p); }

  /// Admits at most `max` connections: `established()` (the owner's count of
  /// connections it holds) plus those still in their handshake here. A
  /// connection over the limit is closed at once, with one warning per episode
  /// of refusals. Call before start().
  void set_connection_limit(std::size_t max, std::function<std::size_t()> established) {
    max_connections_ = max;
    established_ = std::move(established);
  }

  /// Starts the accept loop. Call once, on the loop.
  void start();

  /// Runs the native hello on `socket`, a connection the foreign protocol took
  /// as silent whose first byte then turned out to be the native hello's (a
  /// client that was merely slow, e.g. one of many connecting at once): the
  /// hello gets a fresh handshake timeout, and a good connection goes to the
  /// accept handler. Loop only.
  void accept_late_hello(asio::ip::tcp::socket socket);

  /// Stops accepting; connections already handed out are not affected. Idempotent.
  void close();

  /// The bound address (with the real port when bound to port 0).
  asio::ip::tcp::endpoint local_endpoint() const { return local_; }

private:
  asio::awaitable<void> accept_loop();
  asio::awaitable<void> greet(asio::ip::tcp::socket socket, bool late_hello);
  asio::awaitable<void> handshake(asio::ip::tcp::socket socket, corodist::deadline by);
  corodist::deadline handshake_deadline() const;
  asio::awaitable<void> sniff(asio::ip::tcp::socket socket);
  asio::awaitable<void> tell_tls_required(asio::ip::tcp::socket& socket, corodist::deadline by);
  /// Whether a connection just accepted may proceed (the connection limit).
  bool admit(const asio::ip::tcp::socket& socket);

  asio::ip::tcp::acceptor acceptor_;
  connection_options opts_;
  accept_handler on_accept_;
  std::optional<foreign_protocol> foreign_;
  asio::ip::tcp::endpoint local_;
  std::size_t max_connections_ = 0; // 0: no limit
  std::function<std::size_t()> established_;
  std::size_t handshaking_ = 0;     // accepted, hello not yet done
  bool refusing_ = false;           // in an episode of refusals (one warning each)
  corodist::io_registration registration_; // closes the acceptor at context shutdown; last: goes first
};

} // namespace corodist::net
