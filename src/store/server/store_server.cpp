#include <corodist/core/error.hpp>
#include <corodist/net/listener.hpp>
#include <corodist/store/store_server.hpp>

#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "store/server/engine.hpp"
#include "store/server/heap_trim.hpp"
#include "store/server/native_session.hpp"
#include "store/server/torch_session.hpp"

#include <asio/ip/address.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <unordered_map>
#include <unordered_set>

namespace corodist::store {

namespace {
detail::engine_limits limits_of(const server_options& o) {
  detail::engine_limits l;
  l.max_key_size = o.max_key_size;
  l.max_value_size = o.max_value_size;
  l.max_keys_per_request = o.max_keys_per_request;
  l.max_waits_per_owner = o.max_pending_waits;
  l.max_wait_bytes_per_owner = o.max_wait_bytes_per_connection;
  l.max_wait_bytes = o.max_wait_bytes;
  return l;
}
} // namespace

struct store_server::impl : std::enable_shared_from_this<store_server::impl> {
  impl(asio::any_io_executor ex, server_options o)
      : executor(std::move(ex)), opts(std::move(o)),
        engine(std::make_shared<detail::engine>(executor, limits_of(opts))) {}

  void accept(std::shared_ptr<net::connection> conn);
  void accept_torch(asio::ip::tcp::socket socket, bool silent);
  void close_all();

  asio::any_io_executor executor;
  server_options opts;
  std::shared_ptr<detail::engine> engine;
  std::shared_ptr<net::listener> listener;
  std::unordered_map<std::uint64_t, detail::native_session> sessions; // native, by connection id
  std::unordered_map<std::uint64_t, std::weak_ptr<detail::torch::session>> torch_sessions;
  std::unordered_set<std::uint64_t> silent_sessions; // PyTorch sessions that arrived silent
  bool refusing_silent = false;                      // in an episode of refusals (one warning each)
  std::uint64_t next_session = 1;
  bool stopped = false; // after stop(): connections still in their handshake are closed on arrival
  std::vector<std::weak_ptr<asio::steady_timer>> watchers; // wait_until() waiting: woken at each change

  // A client came or went, or the pending waits changed: those in wait_until() look again.
  void changed() {
    for (auto& w : watchers)
      if (auto t = w.lock())
        t->cancel();
    std::erase_if(watchers, [](auto& w) { return w.expired(); });
  }
};

void store_server::impl::accept(std::shared_ptr<net::connection> conn) {
  if (stopped) {
    conn->close();
    return;
  }
  const auto sid = next_session++;
  sessions.try_emplace(sid, conn, *engine, sid);
  changed();
  // The callbacks find the session by id: nothing more per connection than the table's entry.
  conn->start(
      [w = weak_from_this(), sid](const std::shared_ptr<net::connection>& c, net::message&& m) {
        if (auto self = w.lock())
          if (auto it = self->sessions.find(sid); it != self->sessions.end())
            it->second.handle(c, std::move(m));
      },
      [w = weak_from_this(), sid](std::error_code ec) {
        auto self = w.lock();
        if (!self)
          return;
        CORODIST_LOG_DEBUG("store server: client connection {} closed: {}", sid, ec.message());
        std::size_t largest = 0;
        if (auto it = self->sessions.find(sid); it != self->sessions.end()) {
          it->second.closed();
          largest = it->second.largest_request();
        }
        // Erased in a later turn: the close may come from inside the session's own handle().
        // The heap is trimmed then too, once the connection's own buffers are gone.
        asio::post(self->executor, [w = std::weak_ptr<impl>(self), sid, largest] {
          if (auto self = w.lock()) {
            self->sessions.erase(sid);
            self->changed();
          }
          detail::trim_heap_after(largest);
        });
      });
}

void store_server::impl::accept_torch(asio::ip::tcp::socket socket, bool silent) {
  std::error_code ignored;
  if (stopped) {
    socket.close(ignored);
    return;
  }
  if (silent) {
    if (silent_sessions.size() >= opts.max_silent_connections) {
      if (!refusing_silent)
        CORODIST_LOG_WARN("store: closing silent connection from {}: {} silent connections are open, the limit is {} "
                          "(max_silent_connections)",
                          net::detail::peer_text(socket), silent_sessions.size(), opts.max_silent_connections);
      refusing_silent = true;
      socket.close(ignored);
      return;
    }
    refusing_silent = false;
  }
  const auto sid = next_session++;
  if (silent)
    silent_sessions.insert(sid);
  auto s = std::make_shared<detail::torch::session>(std::move(socket), engine, sid, opts.max_buffered_output,
                                                     [w = weak_from_this(), sid] {
                                                       if (auto self = w.lock()) {
                                                         self->engine->drop_owner(sid);
                                                         self->torch_sessions.erase(sid);
                                                         self->silent_sessions.erase(sid);
                                                         self->changed();
                                                       }
                                                     });
  torch_sessions[sid] = s;
  changed();
  if (!silent)
    return s->start();
  // A native client merely slow to say hello (one of many connecting at once)
  // looks silent too: its hello goes back to the listener.
  s->start([w = weak_from_this()](asio::ip::tcp::socket late) {
    if (auto self = w.lock(); self && !self->stopped && self->listener)
      self->listener->accept_late_hello(std::move(late));
  });
}

void store_server::impl::close_all() {
  stopped = true;
  if (listener)
    listener->close();
  for (auto& [sid, s] : sessions) // (closing erases nothing at once)
    s.close();
  std::vector<std::shared_ptr<detail::torch::session>> torch;
  for (auto& [sid, s] : torch_sessions)
    if (auto t = s.lock())
      torch.push_back(t);
  for (auto& t : torch)
    t->close();
}

std::shared_ptr<store_server> store_server::start(asio::any_io_executor ex, server_options opts) {
  auto srv = std::make_shared<store_server>(ex, std::move(opts));
  auto& im = *srv->impl_;
  std::error_code ec;
  auto addr = asio::ip::make_address(im.opts.host, ec);
  if (ec)
    throw connection_error("store_server: '" + im.opts.host + "' is not an IP address: " + ec.message());
  net::connection_options copts;
  copts.auth_token = resolve_auth_token(im.opts.auth_token);
  copts.max_frame_size = im.opts.max_value_size + im.opts.max_key_size + 1024;
  copts.max_buffered_output = im.opts.max_buffered_output;
  copts.handshake_timeout = im.opts.handshake_timeout;
  copts.peer_timeout = im.opts.peer_timeout;
  copts.request_timeout = corodist::timeout::never();
  copts.tls = net::tls_context::resolve(im.opts.tls); // (throws usage_error for files it cannot load)
  auto [lec, l] = net::listener::listen(ex, {addr, im.opts.port}, copts,
                                        [w = std::weak_ptr<store_server>(srv)](std::shared_ptr<net::connection> c) {
                                          if (auto s = w.lock())
                                            s->impl_->accept(std::move(c));
                                        });
  if (lec)
    throw connection_error("store_server: cannot listen on " + im.opts.host + ":" + std::to_string(im.opts.port) +
                           ": " + lec.message());
  if (im.opts.torch_protocol) {
    const bool auth = !copts.auth_token.empty();
    net::foreign_protocol torch;
    // PyTorch queries start with a code below 32 (1.13: 0-8; 2.x: VALIDATE = 0).
    torch.accepts = [auth](std::uint8_t first) {
      if (first >= 32)
        return false;
      if (auth)
        CORODIST_LOG_WARN("store: refused a PyTorch TCPStore client: this server requires authentication");
      return !auth;
    };
    torch.take = [w = std::weak_ptr<store_server>(srv)](asio::ip::tcp::socket sock, bool silent) {
      if (auto s = w.lock())
        s->impl_->accept_torch(std::move(sock), silent);
    };
    torch.take_silent = !auth; // PyTorch 1.13 opens a second connection that stays silent
    l->set_foreign_protocol(std::move(torch));
  }
  l->set_connection_limit(net::connection_limit(im.opts.max_connections), [w = std::weak_ptr<store_server>(srv)] {
    auto s = w.lock();
    return s ? s->impl_->sessions.size() + s->impl_->torch_sessions.size() : std::size_t{0};
  });
  im.listener = l;
  srv->endpoint_ = l->local_endpoint();
  l->start();
  CORODIST_LOG_INFO("store server listening on {}{}{}", net::detail::endpoint_text(srv->endpoint_),
                    copts.auth_token.empty() ? "" : " (authentication required)",
                    copts.tls ? " (TLS only; PyTorch TCPStore clients are refused)" : "");
  return srv;
}

store_server::store_server(asio::any_io_executor ex, server_options opts)
    : impl_(std::make_shared<impl>(std::move(ex), std::move(opts))) {
  impl_->engine->observe_waits([w = std::weak_ptr<impl>(impl_)] {
    if (auto im = w.lock())
      im->changed();
  });
}

store_server::~store_server() {
  // Close on the executor; the connections' callbacks hold only weak references.
  asio::post(impl_->executor, [im = impl_] { im->close_all(); });
}

void store_server::stop() {
  asio::post(impl_->executor, [w = weak_from_this()] {
    if (auto self = w.lock())
      self->impl_->close_all();
  });
}

std::size_t store_server::connection_count() const noexcept {
  return impl_->sessions.size() + impl_->torch_sessions.size();
}

asio::awaitable<bool> store_server::wait_until(std::function<bool()> condition, corodist::timeout limit) {
  auto im = impl_;
  const auto by = limit.or_else(corodist::timeout::never()).from();
  auto timer = std::make_shared<asio::steady_timer>(im->executor);
  im->watchers.push_back(timer);
  while (!condition()) {
    if (by.expired())
      co_return false;
    timer->expires_at(by.at());
    co_await timer->async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
  co_return true;
}

asio::awaitable<bool> store_server::clients_left(std::size_t at_most, corodist::timeout limit) {
  co_return co_await wait_until([this, at_most] { return connection_count() <= at_most; }, limit);
}

std::size_t store_server::key_count() const noexcept { return impl_->engine->size(); }

std::size_t store_server::pending_waits() const noexcept { return impl_->engine->pending_waits(); }

std::size_t store_server::pending_wait_bytes() const noexcept { return impl_->engine->wait_bytes(); }

} // namespace corodist::store
