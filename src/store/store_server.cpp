#include <corodist/core/error.hpp>
#include <corodist/net/listener.hpp>
#include <corodist/store/store_server.hpp>

#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "store/codec.hpp"
#include "store/kv_state.hpp"
#include "store/torch_session.hpp"

#include <asio/ip/address.hpp>
#include <asio/post.hpp>

#include <cstdlib>
#include <unordered_map>
#include <unordered_set>

namespace corodist::store {

using detail::op;
using detail::reader;
using detail::status;
using detail::writer;

std::string resolve_auth_token(const std::optional<std::string>& token) {
  if (token)
    return *token;
  const char* env = std::getenv("CORODIST_AUTH_TOKEN");
  return env ? env : "";
}

struct store_server::impl : std::enable_shared_from_this<store_server::impl> {
  struct session {
    std::weak_ptr<net::connection> conn;
    std::unordered_map<std::uint64_t, std::uint64_t> watches; // client watch id -> state watch id
  };

  impl(asio::any_io_executor ex, server_options o)
      : executor(std::move(ex)), opts(std::move(o)),
        state(std::make_shared<detail::kv_state>(
            executor, detail::wait_limits{opts.max_pending_waits, opts.max_wait_bytes_per_connection,
                                          opts.max_wait_bytes})) {}

  void accept(std::shared_ptr<net::connection> conn);
  void accept_torch(asio::ip::tcp::socket socket, bool silent);
  void close_all();
  void handle(std::uint64_t sid, const std::shared_ptr<net::connection>& conn, net::message&& m);
  void serve(std::uint64_t sid, const std::shared_ptr<net::connection>& conn, const net::message& m);
  void check_key(const std::string& k) const;
  void check_value(const std::string& v) const;
  void respond_wait(std::uint64_t sid, std::vector<std::string> keys, std::chrono::milliseconds timeout,
                    std::weak_ptr<net::connection> conn, std::uint64_t rid, std::uint16_t kind, bool with_values);

  asio::any_io_executor executor;
  server_options opts;
  std::shared_ptr<detail::kv_state> state;
  std::shared_ptr<net::listener> listener;
  std::unordered_map<std::uint64_t, session> sessions;
  std::unordered_map<std::uint64_t, std::weak_ptr<detail::torch_session>> torch_sessions;
  std::unordered_set<std::uint64_t> silent_sessions; // PyTorch sessions that arrived silent
  bool refusing_silent = false;                      // in an episode of refusals (one warning each)
  std::uint64_t next_session = 1;
  bool stopped = false; // after stop(): connections still in their handshake are closed on arrival
};

namespace {
void reply(const std::shared_ptr<net::connection>& c, std::uint64_t rid, std::uint16_t kind, writer&& w) {
  c->respond(rid, kind, w.take());
}
} // namespace

void store_server::impl::accept(std::shared_ptr<net::connection> conn) {
  if (stopped) {
    conn->close();
    return;
  }
  const auto sid = next_session++;
  sessions[sid].conn = conn;
  conn->start(
      [w = weak_from_this(), sid](const std::shared_ptr<net::connection>& c, net::message&& m) {
        if (auto self = w.lock())
          self->handle(sid, c, std::move(m));
      },
      [w = weak_from_this(), sid](std::error_code) {
        if (auto self = w.lock()) {
          self->state->drop_owner(sid); // its waits and watches go with it
          self->sessions.erase(sid);
        }
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
  auto s = std::make_shared<detail::torch_session>(std::move(socket), state, sid, opts, [w = weak_from_this(), sid] {
    if (auto self = w.lock()) {
      self->state->drop_owner(sid);
      self->torch_sessions.erase(sid);
      self->silent_sessions.erase(sid);
    }
  });
  torch_sessions[sid] = s;
  s->start();
}

void store_server::impl::close_all() {
  stopped = true;
  if (listener)
    listener->close();
  std::vector<std::shared_ptr<net::connection>> conns;
  for (auto& [sid, s] : sessions)
    if (auto c = s.conn.lock())
      conns.push_back(c);
  std::vector<std::shared_ptr<detail::torch_session>> torch;
  for (auto& [sid, s] : torch_sessions)
    if (auto t = s.lock())
      torch.push_back(t);
  for (auto& c : conns)
    c->close();
  for (auto& t : torch)
    t->close();
}

void store_server::impl::check_key(const std::string& k) const {
  if (k.size() > opts.max_key_size)
    throw store_error("key of " + std::to_string(k.size()) + " bytes exceeds max_key_size " +
                      std::to_string(opts.max_key_size));
}

void store_server::impl::check_value(const std::string& v) const {
  if (v.size() > opts.max_value_size)
    throw store_error("value of " + std::to_string(v.size()) + " bytes exceeds max_value_size " +
                      std::to_string(opts.max_value_size));
}

void store_server::impl::handle(std::uint64_t sid, const std::shared_ptr<net::connection>& conn, net::message&& m) {
  const auto kind = m.header.kind;
  const auto rid = m.header.request_id;
  if (m.header.flags & net::frame_flags::one_way)
    return; // clients send none
  try {
    serve(sid, conn, m);
  } catch (const protocol_error& e) {
    CORODIST_LOG_WARN("store: malformed request (op {}) from {}: {}", kind, conn->remote_endpoint().address().to_string(),
                      e.what());
    reply(conn, rid, kind, std::move(writer(status::error).str(std::string("malformed request: ") + e.what())));
  } catch (const std::exception& e) {
    reply(conn, rid, kind, std::move(writer(status::error).str(e.what())));
  }
}

void store_server::impl::respond_wait(std::uint64_t sid, std::vector<std::string> keys, std::chrono::milliseconds timeout,
                                      std::weak_ptr<net::connection> conn, std::uint64_t rid, std::uint16_t kind,
                                      bool with_values) {
  state->wait(std::move(keys), timeout, sid,
              [st = std::weak_ptr<detail::kv_state>(state), conn, rid, kind, timeout,
               with_values](std::vector<std::string>&& keys, std::vector<std::string>&& missing) {
                auto c = conn.lock();
                auto state = st.lock();
                if (!c || !state)
                  return;
                if (!missing.empty()) {
                  reply(c, rid, kind, std::move(writer(status::timeout).str(detail::timeout_message(missing, timeout))));
                  return;
                }
                writer w(status::ok);
                if (with_values) {
                  w.u32(static_cast<std::uint32_t>(keys.size()));
                  for (auto& k : keys) {
                    auto* v = state->find(k);
                    w.str(v ? *v : std::string());
                  }
                }
                reply(c, rid, kind, std::move(w));
              });
}

void store_server::impl::serve(std::uint64_t sid, const std::shared_ptr<net::connection>& conn, const net::message& m) {
  const auto kind = m.header.kind;
  const auto rid = m.header.request_id;
  reader in(m.payload);
  const auto max_keys = opts.max_keys_per_request;
  switch (static_cast<op>(kind)) {
  case op::set: {
    auto k = in.str();
    auto v = in.str();
    check_key(k);
    check_value(v);
    state->set(k, std::move(v));
    return reply(conn, rid, kind, writer(status::ok));
  }
  case op::get: {
    auto k = in.str();
    auto timeout = std::chrono::milliseconds(in.u64());
    check_key(k);
    if (auto* v = state->find(k)) // present: answer without registering a wait
      return reply(conn, rid, kind, std::move(writer(status::ok).u32(1).str(*v)));
    std::vector<std::string> keys{std::move(k)};
    return respond_wait(sid, std::move(keys), timeout, conn, rid, kind, true);
  }
  case op::add: {
    auto k = in.str();
    auto delta = in.i64();
    check_key(k);
    return reply(conn, rid, kind, std::move(writer(status::ok).i64(state->add(k, delta))));
  }
  case op::compare_set: {
    auto k = in.str();
    auto expected = in.str();
    auto desired = in.str();
    check_key(k);
    check_value(desired);
    return reply(conn, rid, kind, std::move(writer(status::ok).str(state->compare_set(k, expected, std::move(desired)))));
  }
  case op::delete_key: {
    auto k = in.str();
    return reply(conn, rid, kind, std::move(writer(status::ok).u8(state->erase(k) ? 1 : 0)));
  }
  case op::check: {
    auto keys = in.strs(max_keys);
    return reply(conn, rid, kind, std::move(writer(status::ok).u8(state->contains_all(keys) ? 1 : 0)));
  }
  case op::wait:
  case op::multi_get: {
    auto keys = in.strs(max_keys);
    auto timeout = std::chrono::milliseconds(in.u64());
    for (auto& k : keys)
      check_key(k);
    return respond_wait(sid, std::move(keys), timeout, conn, rid, kind, static_cast<op>(kind) == op::multi_get);
  }
  case op::num_keys:
    return reply(conn, rid, kind, std::move(writer(status::ok).i64(static_cast<std::int64_t>(state->size()))));
  case op::append: {
    auto k = in.str();
    auto v = in.str();
    check_key(k);
    auto* cur = state->find(k);
    if ((cur ? cur->size() : 0) + v.size() > opts.max_value_size)
      throw store_error("append would make the value of '" + k + "' exceed max_value_size " +
                        std::to_string(opts.max_value_size));
    state->append(k, v);
    return reply(conn, rid, kind, writer(status::ok));
  }
  case op::multi_set: {
    auto keys = in.strs(max_keys);
    auto values = in.strs(max_keys);
    detail::check_multi_set(keys, values);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      check_key(keys[i]);
      check_value(values[i]);
    }
    for (std::size_t i = 0; i < keys.size(); ++i)
      state->set(keys[i], std::move(values[i]));
    return reply(conn, rid, kind, writer(status::ok));
  }
  case op::list_keys: {
    auto prefix = in.str();
    return reply(conn, rid, kind, std::move(writer(status::ok).strs(state->list(prefix))));
  }
  case op::watch: {
    auto k = in.str();
    auto client_id = in.u64();
    check_key(k);
    auto& s = sessions[sid];
    if (s.watches.size() >= opts.max_pending_waits)
      throw store_error("too many watches on this connection (limit " + std::to_string(opts.max_pending_waits) + ")");
    auto id = state->watch(k, sid, [w = std::weak_ptr<net::connection>(conn), client_id](const watch_event& e) {
      if (auto c = w.lock())
        c->send(static_cast<std::uint16_t>(op::watch_event),
                writer().u64(client_id).u8(static_cast<std::uint8_t>(e.type)).str(e.key).str(e.value).take());
    });
    s.watches[client_id] = id;
    return reply(conn, rid, kind, writer(status::ok));
  }
  case op::unwatch: {
    auto client_id = in.u64();
    auto& s = sessions[sid];
    if (auto it = s.watches.find(client_id); it != s.watches.end()) {
      state->unwatch(it->second);
      s.watches.erase(it);
    }
    return reply(conn, rid, kind, writer(status::ok));
  }
  default:
    CORODIST_LOG_WARN("store: unknown operation {} from {}", kind, conn->remote_endpoint().address().to_string());
    conn->respond_error(rid, kind, "unknown store operation " + std::to_string(kind));
  }
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
  copts.request_timeout = std::chrono::milliseconds(0);
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
  CORODIST_LOG_INFO("store server listening on {}{}", net::detail::endpoint_text(srv->endpoint_),
                    copts.auth_token.empty() ? "" : " (authentication required)");
  return srv;
}

store_server::store_server(asio::any_io_executor ex, server_options opts)
    : impl_(std::make_shared<impl>(std::move(ex), std::move(opts))) {}

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

std::size_t store_server::key_count() const noexcept { return impl_->state->size(); }

std::size_t store_server::pending_wait_bytes() const noexcept { return impl_->state->wait_bytes(); }

} // namespace corodist::store
