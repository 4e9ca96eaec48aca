#include <corodist/net/listener.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

namespace corodist::net {

namespace {
using corodist::detail::use_tuple;
// Pause after an accept error such as EMFILE, so a full fd table is not spun on.
constexpr auto accept_error_backoff = std::chrono::milliseconds(20);
} // namespace

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
  if (a.listen(asio::socket_base::max_listen_connections, ec); ec)
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
  while (acceptor_.is_open()) {
    auto [ec, socket] = co_await acceptor_.async_accept(use_tuple);
    if (ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open())
        co_return;
      CORODIST_LOG_WARN("accept on {}:{} failed: {}; retrying", local_.address().to_string(), local_.port(),
                        ec.message());
      asio::steady_timer t(acceptor_.get_executor(), accept_error_backoff);
      co_await t.async_wait(use_tuple);
      continue;
    }
    if (foreign_)
      asio::co_spawn(acceptor_.get_executor(), sniff(std::move(socket)), asio::detached);
    else
      asio::co_spawn(acceptor_.get_executor(), handshake(std::move(socket)), asio::detached);
  }
}

asio::awaitable<void> listener::sniff(asio::ip::tcp::socket socket) {
  auto self = shared_from_this();
  std::error_code ignored;
  auto peer = socket.remote_endpoint(ignored);
  std::array<std::uint8_t, 1> first{};
  auto r = co_await corodist::detail::within(
      socket.async_receive(asio::buffer(first), asio::socket_base::message_peek, use_tuple),
      opts_.handshake_timeout);
  if (!r) { // silent: no byte within the handshake timeout
    if (foreign_->take_silent && socket.is_open()) {
      socket.set_option(asio::socket_base::keep_alive(true), ignored);
      foreign_->take(std::move(socket));
    } else {
      CORODIST_LOG_WARN("rejected connection from {}:{}: {}", peer.address().to_string(), peer.port(),
                        make_error_code(errc::hello_timeout).message());
    }
    co_return;
  }
  auto [ec, n] = *r;
  if (ec || n == 0)
    co_return; // closed before saying anything
  if (first[0] == static_cast<std::uint8_t>(protocol_magic & 0xff))
    co_return co_await handshake(std::move(socket));
  if (foreign_->accepts(first[0])) {
    foreign_->take(std::move(socket));
    co_return;
  }
  CORODIST_LOG_WARN("rejected connection from {}:{}: protocol not served here (first byte 0x{:02x})",
                    peer.address().to_string(), peer.port(), first[0]);
}

asio::awaitable<void> listener::handshake(asio::ip::tcp::socket socket) {
  auto self = shared_from_this();
  std::error_code ignored;
  auto peer = socket.remote_endpoint(ignored);
  auto [ec, conn] = co_await connection::accept(std::move(socket), opts_);
  if (ec) {
    CORODIST_LOG_WARN("rejected connection from {}:{}: {}", peer.address().to_string(), peer.port(), ec.message());
    co_return;
  }
  if (on_accept_)
    on_accept_(std::move(conn));
}

} // namespace corodist::net
