#include "rpc/agent_core.hpp"

#include <corodist/core/error.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/store_server.hpp>

#include "core/log.hpp"
#include "rpc/error_reply.hpp"
#include "rpc/protocol.hpp"

#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/ip/address.hpp>
#include <asio/post.hpp>

namespace corodist::rpc::detail {

namespace {
// Calls and replies at least this large are decoded off the loop.
constexpr std::size_t offload_size = 64 * 1024;
} // namespace

agent_core::agent_core(asio::any_io_executor ex, agent_options opts)
    : ex_(std::move(ex)), opts_(std::move(opts)), registry_(opts_.key_prefix, opts_.name),
      recorder_(flight_recorder::create("rpc", opts_.name)) {
  dispatch_env env;
  env.loop = ex_;
  env.port = this;
  env.worker_name = opts_.name;
  env.self_rank = opts_.rank; // (set again by start() when a rendezvous URL gives it)
  env.max_message_size = opts_.max_message_size;
  env.max_output_per_peer = opts_.max_buffered_output_per_peer;
  env.offload_size = offload_size;
  env.recorder = recorder_;
  env.name_of = [this](int rank) -> std::string {
    if (rank < 0 || !registry_.table() || rank >= static_cast<int>(registry_.table()->by_rank.size()))
      return {};
    return registry_.lookup(rank).name;
  };
  dispatcher_ = std::make_shared<dispatcher>(std::move(env), opts_.worker_threads);
  streams_ = std::make_shared<stream_table>(opts_.stream_window_items, opts_.stream_window_bytes);
  dispatcher_->set_stream_handler([w = std::weak_ptr<stream_table>(streams_)](
                                      int from, const std::string& from_name,
                                      const std::shared_ptr<net::connection>& c, net::message&& m) {
    if (auto t = w.lock())
      t->on_server_frame(from, from_name, c, std::move(m));
  });
}

agent_core::~agent_core() = default;

asio::awaitable<void> agent_core::start() {
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
      ro.tls = opts_.tls;
      auto res = co_await store::async_rendezvous(ex_, opts_.init_method, ro);
      store_ = res.store;
      opts_.rank = res.rank;
      opts_.world_size = res.world_size;
      dispatcher_->set_self_rank(opts_.rank);
    }
    if (opts_.world_size <= 0 || opts_.rank < 0 || opts_.rank >= opts_.world_size)
      throw usage_error("rpc: agent '" + opts_.name + "': rank " + std::to_string(opts_.rank) + " is not in [0, " +
                        std::to_string(opts_.world_size) + ")");
    std::error_code aec;
    auto addr = asio::ip::make_address(opts_.host, aec);
    if (aec)
      throw usage_error("rpc: host '" + opts_.host + "' is not an IP address");
    net::connection_options copts;
    copts.max_frame_size = opts_.max_message_size;
    copts.max_buffered_output = opts_.max_buffered_output_per_peer; // a lone larger message still goes
    copts.shared_output = std::make_shared<net::output_budget>(opts_.max_buffered_output);
    copts.request_timeout = corodist::timeout::never();
    copts.peer_timeout = opts_.peer_timeout;
    copts.auth_token = store::resolve_auth_token(opts_.auth_token);
    copts.tls = net::tls_context::resolve(opts_.tls); // one context for the listener and every channel
    channels_ = std::make_shared<channels>(
        ex_, registry_, copts, [d = std::weak_ptr<dispatcher>(dispatcher_)](message_kind k) {
          auto p = d.lock();
          return p ? p->kind_name(k) : std::string("a message");
        },
        [w = std::weak_ptr<dispatcher>(dispatcher_)](int from, const std::string& from_name,
                                                     const std::shared_ptr<net::connection>& c, net::message&& m) {
          if (auto d = w.lock())
            d->on_message(from, from_name, c, std::move(m));
        });
    streams_->set_owner(weak_from_this());
    channels_->set_stream_hooks(
        [w = std::weak_ptr<stream_table>(streams_)](int rank, const std::shared_ptr<net::connection>& c,
                                                    net::message&& m) {
          if (auto t = w.lock())
            t->on_client_frame(rank, c, std::move(m));
        },
        [w = std::weak_ptr<stream_table>(streams_)](const net::connection* c, int rank) {
          if (auto t = w.lock())
            t->on_closed(c, rank);
        });
    auto [lec, l] = net::listener::listen(ex_, {addr, opts_.port}, copts,
                                          [w = std::weak_ptr<channels>(channels_)](std::shared_ptr<net::connection> c) {
                                            if (auto ch = w.lock())
                                              ch->adopt(std::move(c));
                                            else
                                              c->close();
                                          });
    if (lec)
      throw connection_error("rpc: agent '" + opts_.name + "' cannot listen on " + opts_.host + ":" +
                             std::to_string(opts_.port) + ": " + lec.message());
    listener_ = l;
    listener_->set_connection_limit(net::connection_limit(opts_.max_connections),
                                    [w = std::weak_ptr<channels>(channels_)] {
                                      auto ch = w.lock();
                                      return ch ? ch->accepted() : std::size_t{0};
                                    });
    listener_->start();
    local_ = listener_->local_endpoint();
    // Named: GCC 12 destroys a brace-initialised temporary twice inside a co_await expression.
    worker_info me{opts_.name, opts_.rank, opts_.host, local_.port()};
    co_await registry_.join(*store_, std::move(me), opts_.world_size,
                            opts_.init_timeout.or_else(agent_options::default_init_timeout));
    state_ = agent_state::running;
    dispatcher_->start_serving(); // (calls that came meanwhile waited for this)
    CORODIST_LOG_INFO("rpc: agent '{}' (rank {} of {}) running on {}:{}", opts_.name, opts_.rank, opts_.world_size,
                      opts_.host, local_.port());
  } catch (...) {
    state_ = agent_state::stopped;
    close_all();
    throw;
  }
}

void agent_core::close_all() {
  streams_->close_all();
  if (listener_)
    listener_->close();
  if (channels_)
    channels_->close_all();
  dispatcher_->stop();
}

// ---- message_port -------------------------------------------------------------

void agent_core::set_handler(message_kind kind, std::string name, handler h) {
  if (state_ != agent_state::created)
    throw usage_error("rpc: set_handler('" + name + "') after start()");
  dispatcher_->set_handler(kind, std::move(name), std::move(h));
}

void agent_core::add_shutdown_step(std::string name, shutdown_step step) {
  if (state_ != agent_state::created)
    throw usage_error("rpc: add_shutdown_step() after start()");
  shutdown_steps_.emplace_back(std::move(name), std::move(step));
}

void agent_core::decode_context(int from, codec_context& ctx) {
  ctx.port = this;
  ctx.self = opts_.rank;
  ctx.peer = from;
}

future<net::bytes> agent_core::request(int to, message_kind kind, payload p, corodist::deadline by,
                                       std::string what) {
  promise<net::bytes> pr;
  auto f = pr.get_future();
  start_message(
      to, kind, std::move(p), by,
      [pr = std::move(pr)](std::exception_ptr error, net::bytes&& reply) mutable {
        if (error)
          pr.set_exception(std::move(error));
        else
          pr.set_value(std::move(reply));
      },
      std::move(what));
  return f;
}

void agent_core::notify(int to, message_kind kind, payload p) {
  if (state_ != agent_state::running) {
    CORODIST_LOG_DEBUG("rpc: {} to rank {} dropped: agent '{}' is not running", dispatcher_->kind_name(kind), to,
                       opts_.name);
    return;
  }
  ++calls_sent_;
  asio::dispatch(ex_, [self = shared_from_this(), to, kind, p = std::move(p)]() mutable {
    self->channels_->notify(to, kind, std::move(p));
  });
}

future<payload> agent_core::run_local(std::string_view fn, const msgpack::object& args,
                                      std::shared_ptr<const void> keep, call_context ctx) {
  return dispatcher_->run_local(fn, args, std::move(keep), std::move(ctx));
}

} // namespace corodist::rpc::detail
