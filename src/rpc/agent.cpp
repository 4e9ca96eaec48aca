// rpc::agent: the public facade over agent_core.
#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/rpc/agent.hpp>

#include "rpc/agent_core.hpp"

#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <thread>

namespace corodist::rpc {

agent::agent(event_loop& loop, agent_options opts)
    : loop_(loop), impl_(std::make_shared<detail::agent_core>(loop.get_executor(), std::move(opts))) {
  auto& o = impl_->opts_;
  if (o.name.empty())
    throw usage_error("rpc::agent: a worker name is required");
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
  // Running plain functions finish first. Joining on the loop could deadlock
  // (a function may wait for this loop): then the dispatcher joins elsewhere.
  if (!loop_.running_in_this_thread())
    im->dispatcher_->join_pool();
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

void agent::add_function(std::string name, detail::handler h) {
  if (impl_->state_ != detail::agent_state::created)
    throw usage_error("rpc: register_function('" + name + "') after start()");
  impl_->dispatcher_->add_function(std::move(name), std::move(h));
}

void agent::add_stream_function(std::string name, detail::stream_function f) {
  if (impl_->state_ != detail::agent_state::created)
    throw usage_error("rpc: register_stream('" + name + "') after start()");
  impl_->streams_->add_function(std::move(name), std::move(f));
}

std::shared_ptr<detail::stream_core> agent::make_stream(int rank, std::string_view fn, detail::stream_mode mode) {
  const auto& peer = impl_->registry_.lookup(rank).name;
  auto core = std::make_shared<detail::stream_core>(impl_->ex_, detail::stream_core::role::client,
                                                    impl_->streams_->next_id(), rank,
                                                    "stream '" + std::string(fn) + "' on worker '" + peer + "'", mode,
                                                    impl_->streams_->window_items(), impl_->streams_->window_bytes());
  core->set_port(impl_.get(), impl_->opts_.rank, peer);
  return core;
}

void agent::stream_window(std::size_t& items, std::size_t& bytes) const noexcept {
  items = impl_->streams_->window_items();
  bytes = impl_->streams_->window_bytes();
}

void agent::launch_stream(std::shared_ptr<detail::stream_core> core, payload open, corodist::deadline by) {
  asio::dispatch(impl_->ex_, [t = impl_->streams_, core = std::move(core), open = std::move(open), by]() mutable {
    t->open(std::move(core), std::move(open), by);
  });
}

std::size_t agent::open_streams() const noexcept { return impl_->streams_->open_streams(); }

// co_spawn onto the loop (a co_spawned coroutine resumes its awaiter on the awaiter's executor).
asio::awaitable<void> agent::async_start() { return asio::co_spawn(impl_->ex_, impl_->start(), asio::use_awaitable); }

void agent::start() { run_blocking(impl_->ex_, async_start(), "rpc::agent::start()"); }

asio::awaitable<void> agent::async_shutdown() { return async_shutdown(true); }

asio::awaitable<void> agent::async_shutdown(bool graceful) {
  return asio::co_spawn(impl_->ex_, impl_->shutdown(graceful), asio::use_awaitable);
}

void agent::shutdown(bool graceful) { run_blocking(impl_->ex_, async_shutdown(graceful), "rpc::agent::shutdown()"); }

int agent::rank_of(worker_ref to) const {
  const auto st = impl_->state_.load();
  if (st != detail::agent_state::running)
    throw usage_error(st == detail::agent_state::stopped ? "rpc: agent '" + impl_->opts_.name + "' is shut down"
                                                         : "rpc: agent '" + impl_->opts_.name + "' is not started");
  if (!loop_.embedded() && !loop_.running())
    throw usage_error("rpc: agent '" + impl_->opts_.name +
                      "': its event loop is not running (the call could never complete)");
  return impl_->registry_.lookup(to).rank;
}

int agent::self_rank() const { return impl_->opts_.rank; }

corodist::timeout agent::default_timeout() const noexcept { return impl_->default_timeout(); }

void agent::send_call(int rank, std::string_view fn, payload call, corodist::deadline by, completion done,
                      std::shared_ptr<detail::outgoing_call> cancel) {
  impl_->start_call(rank, fn, std::move(call), by, std::move(done), std::move(cancel));
}

std::shared_ptr<detail::outgoing_call> agent::make_outgoing_call() const {
  return std::make_shared<detail::outgoing_call>(impl_);
}

void agent::cancel_call(const std::shared_ptr<detail::outgoing_call>& handle) { detail::agent_core::cancel_call(handle); }

void agent::check_metadata(const call_metadata& metadata, std::string_view fn) {
  std::size_t bytes = 0;
  for (const auto& [k, v] : metadata)
    bytes += k.size() + v.size();
  if (bytes > max_metadata_bytes)
    throw usage_error("rpc '" + std::string(fn) + "': the call's metadata holds " + std::to_string(bytes) +
                      " bytes, over max_metadata_bytes " + std::to_string(max_metadata_bytes));
}

const worker_info& agent::self() const { return impl_->registry_.self(); }

const worker_info& agent::get_worker_info(worker_ref w) const { return impl_->registry_.lookup(w); }

const std::vector<worker_info>& agent::get_worker_infos() const {
  const auto* t = impl_->registry_.table();
  if (!t)
    throw usage_error("rpc: agent '" + impl_->opts_.name + "' is not started");
  return t->by_rank;
}

asio::ip::tcp::endpoint agent::local_endpoint() const { return impl_->local_; }

std::size_t agent::connected_peers() const { return impl_->channels_ ? impl_->channels_->dialled_peers() : 0; }

message_port& agent::port() noexcept { return *impl_; }

} // namespace corodist::rpc
