#include <corodist/net/listener.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "net/tls_stream.hpp"
#if CORODIST_IO_URING
#include "net/uring_service.hpp"
#endif

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <fstream>
#include <limits>

#include <sys/resource.h>
#include <sys/socket.h>

namespace corodist::net {

namespace {
using corodist::detail::use_tuple;
using clock = std::chrono::steady_clock;
// Pause after an accept error such as EMFILE, doubling while errors last, so a
// full descriptor table is not spun on.
constexpr auto first_accept_backoff = std::chrono::milliseconds(10);
constexpr auto max_accept_backoff = std::chrono::milliseconds(1000);

using detail::endpoint_text;
} // namespace

std::size_t connection_limit(std::size_t requested, transport io) noexcept {
  if (requested != 0)
    return requested;
  constexpr std::size_t headroom = 64;
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY)
    return 65536;
  const auto soft = static_cast<std::size_t>(r.rlim_cur);
#if CORODIST_IO_URING
  if (io == transport::uring && uring_unavailable_reason().empty()) // the rings' tables (uring_service.hpp)
    return detail::uring_service::max_rings *
           std::min<std::size_t>(soft, detail::uring_service::max_slots_per_ring);
#else
  (void)io;
#endif
  return soft > 2 * headroom ? soft - headroom : soft / 2;
}

// The value read once, not -1: Linux clamps -1 (as any larger backlog) to
// somaxconn as well, but a read value can be logged and tested, and it stays
// right on systems that do not clamp a negative backlog.
int listen_backlog() noexcept {
  static const int backlog = [] {
    long v = 0;
    std::ifstream in("/proc/sys/net/core/somaxconn");
    if (in >> v && v > 0)
      return static_cast<int>(std::min<long>(v, std::numeric_limits<int>::max()));
    return SOMAXCONN;
  }();
  return backlog;
}

std::pair<std::error_code, std::shared_ptr<listener>>
listener::listen(asio::any_io_executor ex, const asio::ip::tcp::endpoint& ep, connection_options opts,
                 accept_handler on_accept) {
  asio::ip::tcp::acceptor a(ex);
  std::error_code ec;
  if (a.open(ep.protocol(), ec); ec)
    return {ec, nullptr};
  if (a.set_option(asio::socket_base::reuse_address(true), ec); ec)
    return {ec, nullptr};
  if (a.bind(ep, ec); ec)
    return {ec, nullptr};
  // Not asio's max_listen_connections: that is the compile-time SOMAXCONN
  // (4096), which caps the queue below a raised net.core.somaxconn.
  if (a.listen(listen_backlog(), ec); ec)
    return {ec, nullptr};
  return {{}, std::make_shared<listener>(std::move(a), opts, std::move(on_accept))};
}

listener::listener(asio::ip::tcp::acceptor acceptor, connection_options opts, accept_handler on_accept)
    : acceptor_(std::move(acceptor)), opts_(opts), on_accept_(std::move(on_accept)),
      registration_(acceptor_.get_executor(), [this](bool) { close(); }) {
  std::error_code ec;
  local_ = acceptor_.local_endpoint(ec);
}

listener::~listener() = default;

void listener::start() { asio::co_spawn(acceptor_.get_executor(), accept_loop(), asio::detached); }

void listener::close() {
  std::error_code ignored;
  acceptor_.close(ignored);
}

asio::awaitable<void> listener::accept_loop() {
  auto self = shared_from_this();
  auto backoff = first_accept_backoff;
  std::size_t failures = 0;
  auto episode_start = clock::now();
  while (acceptor_.is_open()) {
    auto [ec, socket] = co_await acceptor_.async_accept(use_tuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open())
        co_return;
      // One warning per episode of failures (EMFILE, ENFILE, ENOBUFS, ...), then quiet retries.
      if (failures++ == 0) {
        episode_start = clock::now();
        CORODIST_LOG_WARN("accept on {} failed: {}{}; retrying with backoff until it succeeds", endpoint_text(local_),
                          ec.message(),
                          ec == asio::error::no_descriptors ? " (the process is out of file descriptors: raise "
                                                              "`ulimit -n` or lower max_connections)"
                                                            : "");
      } else {
        CORODIST_LOG_DEBUG("accept on {} failed again: {}", endpoint_text(local_), ec.message());
      }
      asio::steady_timer t(acceptor_.get_executor(), backoff);
      co_await t.async_wait(use_tuple);
      backoff = std::min(backoff * 2, max_accept_backoff);
      continue;
    }
    if (failures > 0) {
      CORODIST_LOG_INFO("accept on {} works again after {} failed attempts over {} ms", endpoint_text(local_), failures,
                        std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - episode_start).count());
      failures = 0;
      backoff = first_accept_backoff;
    }
    if (admit(socket))
      asio::co_spawn(acceptor_.get_executor(), greet(std::move(socket), false), asio::detached);
  }
}

// A connection counts against the limit from its accept until the hello is
// done (then its owner counts it). `late_hello`: its first byte, the native
// hello's, came after a foreign protocol took it as silent.
asio::awaitable<void> listener::greet(asio::ip::tcp::socket socket, bool late_hello) {
  ++handshaking_;
  struct uncount {
    std::shared_ptr<listener> self;
    ~uncount() { --self->handshaking_; }
  } guard{shared_from_this()};
  if ((opts_.tls || foreign_) && !late_hello)
    co_await sniff(std::move(socket));
  else
    co_await handshake(std::move(socket), handshake_deadline());
}

bool listener::admit(const asio::ip::tcp::socket& socket) {
  if (max_connections_ == 0)
    return true;
  const std::size_t open = (established_ ? established_() : 0) + handshaking_;
  if (open < max_connections_) {
    if (refusing_)
      CORODIST_LOG_INFO("{} admits connections again ({} open, limit {})", endpoint_text(local_), open, max_connections_);
    refusing_ = false;
    return true;
  }
  std::error_code ignored;
  const auto peer = socket.remote_endpoint(ignored);
  if (!refusing_)
    CORODIST_LOG_WARN("refusing connections on {} (first: {}): {} are open, the limit is {} (max_connections)",
                      endpoint_text(local_), endpoint_text(peer), open, max_connections_);
  else
    CORODIST_LOG_DEBUG("refused connection from {}: {} open, limit {}", endpoint_text(peer), open, max_connections_);
  refusing_ = true;
  return false; // the socket closes as it goes out of scope
}

// The first byte picks the protocol. One deadline covers it and the hello.
// A TLS listener serves TLS only: a connection whose first byte is not a TLS
// handshake record (a native plain hello, a PyTorch TCPStore client) is
// refused with one line, and the foreign protocol is not served.
asio::awaitable<void> listener::sniff(asio::ip::tcp::socket socket) {
  const auto deadline = handshake_deadline();
  const bool tls = static_cast<bool>(opts_.tls);
  std::error_code ignored;
  auto peer = socket.remote_endpoint(ignored);
  std::array<std::uint8_t, 1> first{};
  auto r = co_await corodist::detail::within(
      socket.async_receive(asio::buffer(first), asio::socket_base::message_peek, use_tuple), deadline);
  if (!r) { // silent: no byte within the handshake timeout
    if (!tls && foreign_ && foreign_->take_silent && socket.is_open()) {
      socket.set_option(asio::socket_base::keep_alive(true), ignored);
      foreign_->take(std::move(socket), true);
    } else {
      CORODIST_LOG_WARN("rejected connection from {}: it sent nothing within the handshake timeout{}",
                        endpoint_text(peer),
                        !socket.is_open() ? " (and its socket was closed meanwhile)"
                                          : " (silent connections are not served here)");
    }
    co_return;
  }
  auto [ec, n] = *r;
  if (ec || n == 0)
    co_return; // closed before saying anything
  const bool native = first[0] == static_cast<std::uint8_t>(protocol_magic & 0xff);
  if (tls) {
    if (first[0] == detail::tls_handshake_record)
      co_return co_await handshake(std::move(socket), deadline);
    CORODIST_LOG_WARN("refused a plain (non-TLS) connection from {}: this port requires TLS (first byte 0x{:02x})",
                      endpoint_text(peer), first[0]);
    if (native)
      co_await tell_tls_required(socket, deadline);
    co_return;
  }
  if (native)
    co_return co_await handshake(std::move(socket), deadline);
  if (first[0] == detail::tls_handshake_record) { // (no foreign protocol starts so: PyTorch's codes are below 20)
    CORODIST_LOG_WARN("refused a TLS connection from {}: this port does not use TLS", endpoint_text(peer));
    co_return;
  }
  if (foreign_ && foreign_->accepts(first[0])) {
    foreign_->take(std::move(socket), false);
    co_return;
  }
  CORODIST_LOG_WARN("rejected connection from {}: protocol not served here (first byte 0x{:02x})", endpoint_text(peer),
                    first[0]);
}

// A native plain client on a TLS port: tell it why, then read what it sent
// until it closes (closing on unread bytes would reset the connection, and
// the client could lose the alert).
asio::awaitable<void> listener::tell_tls_required(asio::ip::tcp::socket& socket, corodist::deadline by) {
  asio::error_code unsent; // 7 bytes into a new socket's empty send buffer: never blocks
  socket.send(asio::buffer(detail::tls_required_alert), 0, unsent);
  socket.shutdown(asio::ip::tcp::socket::shutdown_send, unsent);
  std::array<std::uint8_t, 512> sink{};
  for (int reads = 0; !unsent && reads < 64; ++reads) {
    auto got = co_await corodist::detail::within(socket.async_receive(asio::buffer(sink), use_tuple), by);
    if (!got || std::get<0>(*got))
      break;
  }
}

void listener::accept_late_hello(asio::ip::tcp::socket socket) {
  asio::co_spawn(acceptor_.get_executor(), greet(std::move(socket), true), asio::detached);
}

corodist::deadline listener::handshake_deadline() const {
  return opts_.handshake_timeout.or_else(connection_options::default_handshake_timeout).from();
}

asio::awaitable<void> listener::handshake(asio::ip::tcp::socket socket, corodist::deadline by) {
  std::error_code ignored;
  auto peer = socket.remote_endpoint(ignored);
  auto opts = opts_;
  opts.handshake_timeout = by.left();
  auto [ec, conn] = co_await connection::accept(std::move(socket), opts);
  if (ec) {
    CORODIST_LOG_WARN("rejected connection from {}: {}", endpoint_text(peer), ec.message());
    co_return;
  }
  if (on_accept_)
    on_accept_(std::move(conn));
}

} // namespace corodist::net
