#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/net/listener.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/store_server.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "rpc/protocol.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/ip/address.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <thread>
#include <unordered_map>

namespace corodist::rpc {

namespace detail {

namespace {

using clock = std::chrono::steady_clock;

enum class agent_state : int { created, starting, running, stopped };

encoded encode_failure(failure code, std::string_view type, std::string_view message) {
  encoder e;
  auto& pk = e.packer();
  pk.pack_array(3);
  pk.pack(static_cast<int>(code));
  pack_arg(pk, type);
  pack_arg(pk, message);
  return e.finish();
}

// The exception an error reply stands for.
std::exception_ptr decode_failure(const std::string& worker, net::bytes&& payload) {
  try {
    auto p = parse_payload(std::move(payload));
    auto [code, type, message] = p.body.get().as<std::tuple<int, std::string, std::string>>();
    switch (static_cast<failure>(code)) {
    case failure::unknown_function:
      return std::make_exception_ptr(unknown_function_error(worker, message));
    case failure::bad_arguments:
      return std::make_exception_ptr(bad_arguments_error(worker, message));
    case failure::malformed:
      return std::make_exception_ptr(protocol_error("rpc: worker '" + worker + "' rejected the call: " + message));
    default:
      return std::make_exception_ptr(remote_error(worker, type, message));
    }
  } catch (const std::exception& e) {
    return std::make_exception_ptr(protocol_error("rpc: malformed error reply from worker '" + worker + "': " + e.what()));
  }
}

std::string encode_info(const worker_info& w) { return w.name + "\n" + w.host + "\n" + std::to_string(w.port); }

worker_info decode_info(int rank, const std::string& s) {
  auto a = s.find('\n');
  auto b = a == std::string::npos ? a : s.find('\n', a + 1);
  if (b == std::string::npos)
    throw protocol_error("rpc: malformed worker record for rank " + std::to_string(rank) + ": '" + s + "'");
  worker_info w;
  w.rank = rank;
  w.name = s.substr(0, a);
  w.host = s.substr(a + 1, b - a - 1);
  unsigned port = 0;
  auto tail = std::string_view(s).substr(b + 1);
  auto [ptr, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), port);
  if (ec != std::errc{} || port > 65535)
    throw protocol_error("rpc: malformed port in the worker record for rank " + std::to_string(rank));
  w.port = static_cast<std::uint16_t>(port);
  return w;
}

} // namespace

/// The loop-affine state of an agent. Members marked (any thread) are atomics
/// or immutable once running; everything else is touched on the loop only.
class agent_impl : public std::enable_shared_from_this<agent_impl> {
public:
  // A call waiting for its peer's connection to be dialled.
  struct queued_call {
    std::string fn;
    encoded call;
    std::chrono::milliseconds timeout;
    reply_handler done;
    clock::time_point queued_at = clock::now();
  };
  struct peer {
    std::shared_ptr<net::connection> conn;
    bool dialing = false;
    std::vector<queued_call> waiting;
  };

  agent_impl(asio::any_io_executor ex, agent_options o) : ex_(std::move(ex)), opts_(std::move(o)) {}

  asio::awaitable<void> start();
  asio::awaitable<void> shutdown(bool graceful);
  void close_all();
  void issue(int rank, std::string fn, encoded call, std::chrono::milliseconds timeout, reply_handler done);

  // (any thread)
  asio::any_io_executor ex_;
  agent_options opts_;
  std::atomic<agent_state> state_{agent_state::created};
  std::unordered_map<std::string, handler> handlers_; // immutable once started
  std::vector<worker_info> workers_;                  // immutable once running
  std::unordered_map<std::string, int> by_name_;      // immutable once running
  worker_info self_;
  asio::ip::tcp::endpoint local_;
  std::atomic<std::uint64_t> outgoing_active_{0}; // calls issued, not yet completed
  std::atomic<std::uint64_t> calls_sent_{0};
  std::unique_ptr<asio::thread_pool> pool_;

  // (loop only)
  std::shared_ptr<store::store> store_;
  std::shared_ptr<net::listener> listener_;
  net::connection_options copts_;
  std::vector<peer> peers_;
  std::unordered_map<net::connection*, std::weak_ptr<net::connection>> incoming_;
  std::uint64_t incoming_active_ = 0; // calls received, reply not yet queued
  std::uint64_t calls_received_ = 0;
  asio::steady_timer* idle_waiter_ = nullptr; // wait_idle's timer while it waits

private:
  asio::awaitable<void> dial(int rank);
  /// Time left of a queued call's deadline (negative: passed).
  static std::chrono::milliseconds left_of(const queued_call& q);
  static std::exception_ptr timed_out(const queued_call& q, const std::string& worker);
  asio::awaitable<void> request(std::shared_ptr<net::connection> conn, int rank, std::string fn, encoded call,
                                std::chrono::milliseconds timeout, reply_handler done);
  void send(const std::shared_ptr<net::connection>& conn, int rank, queued_call&& q);
  void finish(int rank, const std::string& fn, net::response&& r, reply_handler& done);
  void fail(std::exception_ptr e, reply_handler& done);
  void accept(std::shared_ptr<net::connection> conn);
  void serve(const std::shared_ptr<net::connection>& conn, net::message&& m);
  void send_reply(const std::weak_ptr<net::connection>& wc, std::uint64_t id, encoded out, std::exception_ptr err);
  void send_failure(const std::shared_ptr<net::connection>& c, std::uint64_t id, failure code, std::string_view type,
                     std::string_view message);
  asio::awaitable<void> wait_idle(clock::time_point deadline);
  asio::awaitable<void> join();
  std::uint64_t active() const { return outgoing_active_.load() + incoming_active_; }
  /// After a call finished (loop only): wakes wait_idle once nothing is in flight.
  void call_ended() {
    if (idle_waiter_ && active() == 0)
      idle_waiter_->cancel();
  }
};

// ---- start --------------------------------------------------------------------

asio::awaitable<void> agent_impl::start() {
  auto self = shared_from_this(); // an agent destroyed while starting is freed after this
  auto expected = agent_state::created;
  if (!state_.compare_exchange_strong(expected, agent_state::starting))
    throw usage_error("rpc: agent '" + opts_.name + "' was already started");
  try {
    store_ = opts_.store;
    if (!store_) {
      store::rendezvous_options ro;
      ro.timeout = opts_.init_timeout;
      ro.auth_token = opts_.auth_token;
      auto res = co_await store::async_rendezvous(ex_, opts_.init_method, ro);
      store_ = res.store;
      opts_.rank = res.rank;
      opts_.world_size = res.world_size;
    }
    if (opts_.world_size <= 0 || opts_.rank < 0 || opts_.rank >= opts_.world_size)
      throw usage_error("rpc: agent '" + opts_.name + "': rank " + std::to_string(opts_.rank) + " is not in [0, " +
                        std::to_string(opts_.world_size) + ")");
    pool_ = std::make_unique<asio::thread_pool>(std::max<std::size_t>(opts_.worker_threads, 1));

    std::error_code aec;
    auto addr = asio::ip::make_address(opts_.host, aec);
    if (aec)
      throw usage_error("rpc: host '" + opts_.host + "' is not an IP address");
    copts_.max_frame_size = opts_.max_message_size;
    copts_.max_buffered_output = opts_.max_buffered_output_per_peer; // a lone larger message still goes
    copts_.shared_output = std::make_shared<net::output_budget>(opts_.max_buffered_output);
    copts_.request_timeout = std::chrono::milliseconds(0);
    copts_.auth_token = store::resolve_auth_token(opts_.auth_token);
    auto [lec, l] = net::listener::listen(ex_, {addr, opts_.port}, copts_,
                                          [w = weak_from_this()](std::shared_ptr<net::connection> c) {
                                            if (auto self = w.lock())
                                              self->accept(std::move(c));
                                            else
                                              c->close();
                                          });
    if (lec)
      throw connection_error("rpc: agent '" + opts_.name + "' cannot listen on " + opts_.host + ":" +
                             std::to_string(opts_.port) + ": " + lec.message());
    listener_ = l;
    listener_->set_connection_limit(net::connection_limit(opts_.max_connections), [w = weak_from_this()] {
      auto self = w.lock();
      return self ? self->incoming_.size() : std::size_t{0};
    });
    listener_->start();
    local_ = listener_->local_endpoint();
    self_ = worker_info{opts_.name, opts_.rank, opts_.host, local_.port()};

    // Claim the name, then the rank: compare_set lets exactly one worker win each.
    const auto& pre = opts_.key_prefix;
    const auto my_rank = std::to_string(opts_.rank);
    auto owner = co_await store_->compare_set(pre + "names/" + opts_.name, "", my_rank);
    if (owner != my_rank)
      throw usage_error("rpc: worker name '" + opts_.name + "' is already taken by rank " + owner + " (this is rank " +
                        my_rank + ")");
    auto holder = co_await store_->compare_set(pre + "ranks/" + my_rank, "", opts_.name);
    if (holder != opts_.name)
      throw usage_error("rpc: rank " + my_rank + " is already taken by worker '" + holder + "' (this is worker '" +
                        opts_.name + "')");
    co_await store_->set(pre + "workers/" + my_rank, encode_info(self_));

    std::vector<std::string> keys;
    for (int r = 0; r < opts_.world_size; ++r)
      keys.push_back(pre + "workers/" + std::to_string(r));
    std::vector<std::string> values;
    try {
      auto wait_keys = keys;
      values = co_await store_->multi_get(std::move(wait_keys), opts_.init_timeout);
    } catch (const timeout_error& e) {
      throw timeout_error("rpc: agent '" + opts_.name + "': not all " + std::to_string(opts_.world_size) +
                          " workers joined within " + std::to_string(opts_.init_timeout.count()) + " ms (" + e.what() +
                          ")");
    }
    std::vector<worker_info> ws;
    std::unordered_map<std::string, int> names;
    for (int r = 0; r < opts_.world_size; ++r) {
      ws.push_back(decode_info(r, values[static_cast<std::size_t>(r)]));
      if (!names.emplace(ws.back().name, r).second)
        throw usage_error("rpc: worker name '" + ws.back().name + "' is used by ranks " +
                          std::to_string(names[ws.back().name]) + " and " + std::to_string(r));
    }
    workers_ = std::move(ws);
    by_name_ = std::move(names);
    peers_.resize(workers_.size());
    state_ = agent_state::running;
    CORODIST_LOG_INFO("rpc: agent '{}' (rank {} of {}) running on {}:{}", opts_.name, opts_.rank, opts_.world_size,
                      opts_.host, local_.port());
  } catch (...) {
    state_ = agent_state::stopped;
    close_all();
    throw;
  }
}

// ---- outgoing calls -----------------------------------------------------------

void agent_impl::issue(int rank, std::string fn, encoded call, std::chrono::milliseconds timeout, reply_handler done) {
  auto& p = peers_[static_cast<std::size_t>(rank)];
  queued_call q{std::move(fn), std::move(call), timeout, std::move(done), clock::now()};
  if (state_ == agent_state::stopped) {
    fail(std::make_exception_ptr(usage_error("rpc: agent '" + opts_.name + "' is shut down")), q.done);
    return;
  }
  if (p.conn && p.conn->is_open()) {
    send(p.conn, rank, std::move(q));
    return;
  }
  p.waiting.push_back(std::move(q));
  if (!p.dialing) {
    p.dialing = true;
    asio::co_spawn(ex_, dial(rank), asio::detached);
  }
}

asio::awaitable<void> agent_impl::dial(int rank) {
  auto self = shared_from_this();
  const auto& w = workers_[static_cast<std::size_t>(rank)];
  std::error_code ec;
  auto addr = asio::ip::make_address(w.host, ec);
  std::shared_ptr<net::connection> conn;
  if (!ec) {
    auto opts = copts_;
    // The dial may take no longer than the nearest deadline of the calls waiting for it.
    for (auto& q : peers_[static_cast<std::size_t>(rank)].waiting)
      if (q.timeout.count() > 0)
        opts.handshake_timeout = std::min(opts.handshake_timeout, left_of(q));
    opts.handshake_timeout = std::max(opts.handshake_timeout, std::chrono::milliseconds(1));
    auto [cec, c] = co_await net::connection::connect(ex_, asio::ip::tcp::endpoint(addr, w.port), opts);
    ec = cec;
    conn = std::move(c);
  }
  auto& p = peers_[static_cast<std::size_t>(rank)];
  p.dialing = false;
  auto waiting = std::move(p.waiting);
  p.waiting.clear();
  if (!ec && state_ == agent_state::stopped) {
    conn->close();
    ec = net::errc::connection_closed;
  }
  if (ec) {
    auto e = std::make_exception_ptr(connection_error("rpc: cannot connect to worker '" + w.name + "' at " + w.host +
                                                      ":" + std::to_string(w.port) + ": " + ec.message()));
    for (auto& q : waiting)
      fail(q.timeout.count() > 0 && left_of(q).count() <= 0 ? timed_out(q, w.name) : e, q.done);
    co_return;
  }
  conn->start({}, [wk = weak_from_this(), rank, raw = conn.get()](std::error_code) {
    if (auto s = wk.lock()) {
      auto& pr = s->peers_[static_cast<std::size_t>(rank)];
      if (pr.conn.get() == raw)
        pr.conn.reset();
    }
  });
  p.conn = conn;
  for (auto& q : waiting) {
    if (q.timeout.count() > 0) { // the dial used part of the call's time
      auto left = left_of(q);
      if (left.count() <= 0) {
        fail(timed_out(q, w.name), q.done);
        continue;
      }
      q.timeout = left;
    }
    send(conn, rank, std::move(q));
  }
}

std::chrono::milliseconds agent_impl::left_of(const queued_call& q) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(q.timeout - (clock::now() - q.queued_at));
}

std::exception_ptr agent_impl::timed_out(const queued_call& q, const std::string& worker) {
  return std::make_exception_ptr(timeout_error("rpc '" + q.fn + "' on worker '" + worker + "': no connection within " +
                                               std::to_string(q.timeout.count()) + " ms"));
}

void agent_impl::send(const std::shared_ptr<net::connection>& conn, int rank, queued_call&& q) {
  asio::co_spawn(ex_, request(conn, rank, std::move(q.fn), std::move(q.call), q.timeout, std::move(q.done)),
                 asio::detached);
}

asio::awaitable<void> agent_impl::request(std::shared_ptr<net::connection> conn, int rank, std::string fn, encoded call,
                                          std::chrono::milliseconds timeout, reply_handler done) {
  auto self = shared_from_this();
  auto r = co_await conn->request(kind_call, std::move(call.body), std::move(call.attachments), timeout);
  finish(rank, fn, std::move(r), done);
}

void agent_impl::fail(std::exception_ptr e, reply_handler& done) {
  --outgoing_active_;
  call_ended();
  done(reply{std::move(e), {}});
}

void agent_impl::finish(int rank, const std::string& fn, net::response&& r, reply_handler& done) {
  const auto& worker = workers_[static_cast<std::size_t>(rank)].name;
  --outgoing_active_;
  call_ended(); // wait_idle resumes later, through the loop: after this reply is delivered
  if (r.ec) {
    std::exception_ptr e;
    try {
      net::throw_net_error(r.ec, "rpc '" + fn + "' on worker '" + worker + "'");
    } catch (...) {
      e = std::current_exception();
    }
    done(reply{std::move(e), {}});
    return;
  }
  if (r.msg.header.kind == kind_error_reply) {
    done(reply{decode_failure(worker, std::move(r.msg.payload)), {}});
    return;
  }
  done(reply{nullptr, std::move(r.msg.payload)});
}

// ---- incoming calls -----------------------------------------------------------

void agent_impl::accept(std::shared_ptr<net::connection> conn) {
  if (state_ == agent_state::stopped) {
    conn->close();
    return;
  }
  incoming_[conn.get()] = conn;
  conn->start(
      [w = weak_from_this()](const std::shared_ptr<net::connection>& c, net::message&& m) {
        if (auto self = w.lock())
          self->serve(c, std::move(m));
      },
      [w = weak_from_this(), raw = conn.get()](std::error_code) {
        if (auto self = w.lock())
          self->incoming_.erase(raw);
      });
}

void agent_impl::send_failure(const std::shared_ptr<net::connection>& c, std::uint64_t id, failure code,
                               std::string_view type, std::string_view message) {
  auto out = encode_failure(code, type, message);
  c->respond(id, kind_error_reply, std::move(out.body));
}

void agent_impl::serve(const std::shared_ptr<net::connection>& conn, net::message&& m) {
  if (m.header.flags & net::frame_flags::one_way)
    return; // the protocol has none
  const auto id = m.header.request_id;
  if (m.header.kind != kind_call) {
    conn->respond_error(id, m.header.kind, "rpc: unknown frame kind " + std::to_string(m.header.kind));
    return;
  }
  ++calls_received_;
  parsed_payload p;
  std::string_view name;
  const msgpack::object* args = nullptr;
  try {
    p = parse_payload(std::move(m.payload));
    const auto& body = p.body.get();
    if (body.type != msgpack::type::ARRAY || body.via.array.size != 2 || body.via.array.ptr[0].type != msgpack::type::STR)
      throw protocol_error("a call is [name, [args...]]");
    name = std::string_view(body.via.array.ptr[0].via.str.ptr, body.via.array.ptr[0].via.str.size);
    args = &body.via.array.ptr[1];
  } catch (const std::exception& e) {
    CORODIST_LOG_WARN("rpc: malformed call from {}: {}", conn->remote_endpoint().address().to_string(), e.what());
    send_failure(conn, id, failure::malformed, "protocol_error", e.what());
    return;
  }
  auto it = handlers_.find(std::string(name));
  if (it == handlers_.end()) {
    send_failure(conn, id, failure::unknown_function, "unknown_function",
                  "no function '" + std::string(name) + "' is registered on worker '" + opts_.name + "'");
    return;
  }
  bound_call b;
  try {
    decode_scope scope(&p.attachments);
    b = it->second(*args);
  } catch (const std::exception& e) {
    send_failure(conn, id, failure::bad_arguments, "bad_arguments",
                  "function '" + std::string(name) + "': " + e.what());
    return;
  }
  if (b.plain && !pool_) { // the agent is being destroyed: its pool is gone
    send_failure(conn, id, failure::exception, "corodist::usage_error",
                 "worker '" + opts_.name + "' is shutting down");
    return;
  }
  ++incoming_active_;
  std::weak_ptr<net::connection> wc = conn;
  if (b.plain) {
    asio::post(*pool_, [w = weak_from_this(), ex = ex_, wc, id, work = std::move(b.plain)]() mutable {
      encoded out;
      std::exception_ptr err;
      try {
        out = work();
      } catch (...) {
        err = std::current_exception();
      }
      work = {}; // the function's arguments go here, off the loop
      asio::post(ex, [w, wc, id, out = std::move(out), err]() mutable {
        if (auto self = w.lock())
          self->send_reply(wc, id, std::move(out), err);
      });
    });
  } else {
    asio::co_spawn(ex_, std::move(b.coro), [w = weak_from_this(), wc, id](std::exception_ptr err, encoded out) {
      if (auto self = w.lock())
        self->send_reply(wc, id, std::move(out), err);
    });
  }
}

void agent_impl::send_reply(const std::weak_ptr<net::connection>& wc, std::uint64_t id, encoded out,
                       std::exception_ptr err) {
  --incoming_active_;
  call_ended(); // wait_idle resumes later, through the loop: after this reply is queued
  auto c = wc.lock();
  if (!c || !c->is_open())
    return; // the caller is gone (it sees connection_error)
  if (err) {
    std::string type = "unknown", message = "a non-standard exception";
    try {
      std::rethrow_exception(err);
    } catch (const std::exception& e) {
      type = demangle(typeid(e).name());
      message = e.what();
    } catch (...) {
    }
    send_failure(c, id, failure::exception, type, message);
    return;
  }
  if (auto ec = c->respond(id, kind_reply, std::move(out.body), std::move(out.attachments)))
    if (c->is_open())
      send_failure(c, id, failure::exception, "corodist::usage_error", "cannot send the result: " + ec.message());
}

// ---- shutdown -----------------------------------------------------------------

asio::awaitable<void> agent_impl::wait_idle(clock::time_point deadline) {
  // Sleeps until the deadline; call_ended() cancels the wait when the last call ends.
  // A call may start again in between (another thread's rpc_async), hence the loop.
  // The timer lives in this frame, not in the agent: a frame Asio destroys at
  // context shutdown must not take Asio objects down with it (Asio issue 1235).
  asio::steady_timer t(ex_, deadline);
  idle_waiter_ = &t;
  struct reset {
    asio::steady_timer*& waiter;
    ~reset() { waiter = nullptr; }
  } guard{idle_waiter_};
  while (active() > 0 && clock::now() < deadline)
    co_await t.async_wait(corodist::detail::use_tuple);
  if (active() > 0)
    throw timeout_error("rpc: agent '" + opts_.name + "' shutdown: " + std::to_string(outgoing_active_.load()) +
                        " outgoing and " + std::to_string(incoming_active_) + " incoming calls still in flight after " +
                        std::to_string(opts_.shutdown_timeout.count()) + " ms");
}

// PyTorch's _wait_all_workers, on the store: in rounds, each worker waits
// until it has no call of its own in flight (outgoing or being served),
// publishes how many calls it has sent plus received so far, and passes a
// barrier. When every worker's count is the same as in the previous round,
// nobody did anything in between: no call is in flight anywhere.
asio::awaitable<void> agent_impl::join() {
  const auto& pre = opts_.key_prefix;
  const std::string world = std::to_string(opts_.world_size);
  std::vector<std::string> previous;
  constexpr int max_rounds = 10000;
  for (int round = 0; round < max_rounds; ++round) {
    co_await wait_idle(clock::now() + opts_.shutdown_timeout);
    const auto base = pre + "join/" + std::to_string(round);
    co_await store_->set(base + "/" + std::to_string(opts_.rank),
                         std::to_string(calls_sent_.load() + calls_received_));
    co_await store_->barrier(base, opts_.world_size, opts_.shutdown_timeout);
    std::vector<std::string> keys;
    for (int r = 0; r < opts_.world_size; ++r)
      keys.push_back(base + "/" + std::to_string(r));
    auto counts = co_await store_->multi_get(std::move(keys), opts_.shutdown_timeout);
    if (round > 0 && counts == previous)
      co_return;
    previous = std::move(counts);
  }
  throw timeout_error("rpc: agent '" + opts_.name + "' shutdown: calls kept starting for " +
                      std::to_string(max_rounds) + " rounds");
}

asio::awaitable<void> agent_impl::shutdown(bool graceful) {
  auto self = shared_from_this();
  if (state_ == agent_state::created || state_ == agent_state::stopped) {
    state_ = agent_state::stopped;
    co_return;
  }
  if (state_ == agent_state::starting)
    throw usage_error("rpc: agent '" + opts_.name + "': shutdown() while start() is running");
  std::exception_ptr failure;
  if (graceful) {
    try {
      co_await join();
    } catch (...) {
      failure = std::current_exception();
    }
  }
  state_ = agent_state::stopped;
  close_all();
  if (failure)
    std::rethrow_exception(failure);
}

void agent_impl::close_all() {
  if (listener_)
    listener_->close();
  for (auto& p : peers_) {
    auto conn = std::move(p.conn);
    p.conn.reset();
    if (conn)
      conn->close();
  }
  auto incoming = std::move(incoming_);
  incoming_.clear();
  for (auto& [raw, wc] : incoming)
    if (auto c = wc.lock())
      c->close();
  if (pool_)
    pool_->stop();
}

} // namespace detail

// ---- agent ------------------------------------------------------------------

agent::agent(event_loop& loop, agent_options opts)
    : loop_(loop), impl_(std::make_shared<detail::agent_impl>(loop.get_executor(), std::move(opts))) {
  auto& o = impl_->opts_;
  if (o.name.empty())
    throw usage_error("rpc::agent: a worker name is required");
  if (o.name.find('\n') != std::string::npos)
    throw usage_error("rpc::agent: the worker name must not contain a newline");
  if (!o.store && o.init_method.empty())
    throw usage_error("rpc::agent '" + o.name + "': give a store (with rank and world_size) or an init_method URL");
  if (o.store && (o.world_size <= 0 || o.rank < 0 || o.rank >= o.world_size))
    throw usage_error("rpc::agent '" + o.name + "': rank " + std::to_string(o.rank) + " is not in [0, " +
                      std::to_string(o.world_size) + ")");
  if (o.max_message_size > 0xffffffffu)
    throw usage_error("rpc::agent: max_message_size cannot exceed 4 GiB - 1 (the frame length is 32 bits)");
}

agent::~agent() {
  auto im = impl_;
  im->state_ = detail::agent_state::stopped;
  if (loop_.running_in_this_thread())
    im->close_all();
  else
    asio::post(im->ex_, [im] { im->close_all(); });
  if (im->pool_) {
    im->pool_->stop();
    if (loop_.running_in_this_thread()) {
      // Joining here could deadlock: a running plain function may be waiting
      // for something only this loop can complete. Join on a thread of its own.
      std::thread([pool = std::move(im->pool_)] { pool->join(); }).detach();
    } else {
      im->pool_->join();
    }
  }
}

void agent::refuse_on_loop_thread() {
  if (corodist::detail::on_loop_thread())
    corodist::detail::throw_blocking_on_loop("rpc::agent::rpc_sync (use call() in coroutines)");
}

void agent::spin_until_ready(const std::function<bool()>& ready) const {
  const auto spin = impl_->opts_.sync_spin;
  if (spin.count() <= 0 || corodist::detail::on_loop_thread())
    return;
  const auto end = std::chrono::steady_clock::now() + spin;
  while (!ready() && std::chrono::steady_clock::now() < end) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

void agent::add_handler(std::string name, detail::handler h) {
  if (impl_->state_ != detail::agent_state::created)
    throw usage_error("rpc: register_function('" + name + "') after start()");
  if (!impl_->handlers_.emplace(name, std::move(h)).second)
    throw usage_error("rpc: function '" + name + "' is already registered");
}

// co_spawn onto the loop (a co_spawned coroutine resumes its awaiter on the awaiter's executor).
asio::awaitable<void> agent::async_start() { return asio::co_spawn(impl_->ex_, impl_->start(), asio::use_awaitable); }

void agent::start() { run_blocking(impl_->ex_, async_start(), "rpc::agent::start()"); }

asio::awaitable<void> agent::async_shutdown() { return async_shutdown(true); }

asio::awaitable<void> agent::async_shutdown(bool graceful) {
  return asio::co_spawn(impl_->ex_, impl_->shutdown(graceful), asio::use_awaitable);
}

void agent::shutdown(bool graceful) { run_blocking(impl_->ex_, async_shutdown(graceful), "rpc::agent::shutdown()"); }

void agent::start_call(worker_ref to, std::string_view fn, detail::encoded call,
                       std::optional<std::chrono::milliseconds> timeout, detail::reply_handler done) {
  auto& im = *impl_;
  const auto st = im.state_.load();
  int rank = -1;
  try {
    if (st != detail::agent_state::running)
      throw usage_error(st == detail::agent_state::stopped
                            ? "rpc: agent '" + im.opts_.name + "' is shut down"
                            : "rpc: agent '" + im.opts_.name + "' is not started");
    rank = get_worker_info(to).rank;
    std::size_t size = call.body.size();
    for (auto& seg : call.attachments)
      size += seg.data.size();
    if (size > im.opts_.max_message_size)
      throw usage_error("rpc '" + std::string(fn) + "': the call's " + std::to_string(size) +
                        " bytes exceed max_message_size " + std::to_string(im.opts_.max_message_size));
  } catch (...) {
    done(detail::reply{std::current_exception(), {}});
    return;
  }
  ++im.outgoing_active_;
  ++im.calls_sent_;
  const auto t = timeout.value_or(im.opts_.rpc_timeout);
  if (loop_.running_in_this_thread()) {
    im.issue(rank, std::string(fn), std::move(call), t, std::move(done));
  } else {
    asio::post(im.ex_, [im = impl_, rank, fn = std::string(fn), call = std::move(call), t,
                        done = std::move(done)]() mutable { im->issue(rank, std::move(fn), std::move(call), t, std::move(done)); });
  }
}

const worker_info& agent::self() const {
  if (impl_->workers_.empty())
    throw usage_error("rpc: agent '" + impl_->opts_.name + "' is not started");
  return impl_->self_;
}

const worker_info& agent::get_worker_info(worker_ref w) const {
  auto& im = *impl_;
  if (im.workers_.empty())
    throw usage_error("rpc: agent '" + im.opts_.name + "' is not started");
  if (w.by_rank()) {
    if (static_cast<std::size_t>(w.rank()) >= im.workers_.size())
      throw usage_error("rpc: no worker of rank " + std::to_string(w.rank()) + " (world size " +
                        std::to_string(im.workers_.size()) + ")");
    return im.workers_[static_cast<std::size_t>(w.rank())];
  }
  auto it = im.by_name_.find(std::string(w.name()));
  if (it == im.by_name_.end())
    throw usage_error("rpc: no worker named '" + std::string(w.name()) + "'");
  return im.workers_[static_cast<std::size_t>(it->second)];
}

const std::vector<worker_info>& agent::get_worker_infos() const {
  if (impl_->workers_.empty())
    throw usage_error("rpc: agent '" + impl_->opts_.name + "' is not started");
  return impl_->workers_;
}

asio::ip::tcp::endpoint agent::local_endpoint() const { return impl_->local_; }

std::size_t agent::open_channels() const {
  std::size_t n = 0;
  for (auto& p : impl_->peers_)
    n += p.conn && p.conn->is_open();
  return n;
}

} // namespace corodist::rpc
