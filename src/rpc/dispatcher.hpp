#pragma once
// What arrives, and who serves it (private): messages routed by kind to their
// handler -- rpc's own call handler or an upper layer's -- and the registered
// functions, run on the worker pool (plain) or on the loop (coroutines) within
// the caller's deadline.

#include <corodist/core/flight_recorder.hpp>
#include <corodist/core/future.hpp>
#include <corodist/core/gate.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/rpc/detail/call_state.hpp>
#include <corodist/rpc/detail/codec.hpp>
#include <corodist/rpc/message_port.hpp>

#include "rpc/peer_flow.hpp"

#include <asio/any_io_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/steady_timer.hpp>
#include <asio/thread_pool.hpp>

#include <chrono>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace corodist::rpc::detail {

/// What the dispatcher needs from its agent.
struct dispatch_env {
  asio::any_io_executor loop;
  message_port* port = nullptr;
  std::string worker_name;
  /// This worker's rank (calls may arrive before its own start() has seen every worker).
  int self_rank = -1;
  /// Largest result sent back.
  std::size_t max_message_size = 0;
  /// The memory held for one peer's replies (see peer_flow); 0: no cap.
  std::size_t max_output_per_peer = 0;
  /// Payloads at least this large are parsed and bound off the loop.
  std::size_t offload_size = 0;
  /// A rank's worker name from the worker table (-1, unknown, or no table yet: ""),
  /// for a caller whose connection did not give its name.
  std::function<std::string(int)> name_of;
  /// Records each call served ("serve"); null: recording off.
  std::shared_ptr<flight_recorder> recorder;
};

/// Loop-affine, except run_local() and the pool's tasks.
class dispatcher : public std::enable_shared_from_this<dispatcher> {
public:
  dispatcher(dispatch_env env, std::size_t worker_threads);
  ~dispatcher();

  /// This worker's rank, once a rendezvous has given it (before the listener starts).
  void set_self_rank(int rank) noexcept { env_.self_rank = rank; }
  /// Registers a function (before start).
  void add_function(std::string name, handler h);
  /// Registers an upper layer's handler for `kind`, which `name` describes (before start).
  void set_handler(message_kind kind, std::string name, message_port::handler h);
  /// Where stream frames go (stream_table::on_server_frame; before start).
  using stream_fn = std::function<void(int from, const std::string& from_name,
                                       const std::shared_ptr<net::connection>&, net::message&&)>;
  void set_stream_handler(stream_fn f) { stream_handler_ = std::move(f); }
  /// What a message of `kind` is, for logs: its handler's name, or rpc's own.
  std::string kind_name(message_kind kind) const;

  /// Serves one message that arrived on `conn` from worker `from` (-1: unknown)
  /// named `from_name` ("": unknown; then the worker table names it, if it can).
  /// Before start_serving() it waits, in order of arrival. Loop only.
  void on_message(int from, const std::string& from_name, const std::shared_ptr<net::connection>& conn,
                  net::message&& m);
  /// The agent's start() has ended well: serves the messages that waited and
  /// every one from now on. A worker that the others already see as joined
  /// may get calls while its own start() still waits for the worker table;
  /// served then, a function could not make calls of its own ("not
  /// started"), nor could an upper layer answer. Loop only.
  void start_serving();

  /// Runs function `fn` here on `args` (alive through `keep`); any thread.
  future<payload> run_local(std::string_view fn, const msgpack::object& args, std::shared_ptr<const void> keep,
                            call_context ctx);

  /// Calls being served (incoming and run_local), for shutdown.
  gate& serving() noexcept { return serving_; }
  /// Messages received so far (for the join protocol).
  std::uint64_t received() const noexcept { return received_.load(); }

  /// A call being served (loop only): the connection and request id it came
  /// with (null, 0: a local call), its state, and the signal that cancels a
  /// coroutine function (the caller's cancel, the deadline, stop()). A
  /// coroutine function's deadline (max: none watched) is watched by the
  /// dispatcher's one timer, which sets `deadline_hit` when it cancels it.
  struct running_call {
    const net::connection* conn = nullptr;
    std::uint64_t id = 0;
    std::shared_ptr<call_state> state;
    asio::cancellation_signal signal;
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
    bool deadline_hit = false;
    flight_recorder::handle record = 0; // its "serve" entry, ended with the reply (0: none)
  };

  /// Cancels the coroutine functions still running; calls not yet started
  /// (queued for the pool) are answered "shutting down" instead of run; a
  /// running plain function finishes. Loop only.
  void stop();
  /// Refuses queued jobs (they answer "shutting down") and joins the pool once
  /// they have run (not on the loop; not from a pool thread).
  void join_pool();
  /// The pool, for work that must leave the loop.
  asio::thread_pool::executor_type pool_executor() { return pool_->get_executor(); }

private:
  using reply_fn = corodist::unique_function<void(payload&&, std::exception_ptr)>;

  // on_message's work, once serving.
  void deliver(int from, const std::string& from_name, const std::shared_ptr<net::connection>& conn,
               net::message&& m);
  void serve_call(int from, const std::string& from_name, const std::shared_ptr<net::connection>& conn,
                  std::uint64_t id, net::bytes&& frame, std::chrono::steady_clock::time_point arrived);
  // A caller's cancel (kind_cancel) of the call it sent on `conn` as request `id`.
  void cancel_served(const net::connection* conn, std::uint64_t id);
  // Parses a call and starts it; `reply` gets the encoded result or the error
  // payload. `flow`: its peer's (null: a local call). `id`: its request id.
  // `rc`: its entry in running_ (its state is filled in here).
  void start_call(int from, std::string from_name, std::uint64_t id, net::bytes&& frame,
                  std::chrono::steady_clock::time_point arrived, reply_fn reply, std::shared_ptr<peer_flow> flow,
                  running_call* rc);
  // `rc`: the call's entry in running_ (null: a local call, which makes one
  // for a coroutine function).
  void run_bound(std::string fn, bound_call b, call_context ctx, reply_fn reply, std::shared_ptr<peer_flow> flow,
                 std::shared_ptr<call_state> state, running_call* rc);
  // The flow of the calls arriving on `conn` (made on its first call).
  std::shared_ptr<peer_flow> flow_of(const std::shared_ptr<net::connection>& conn);
  std::function<std::unique_ptr<encoder>()> result_encoder(int to);
  // Watches `rc`'s deadline (a coroutine function's): the one deadline timer
  // is moved earlier if it must be. Loop only.
  void watch_deadline(running_call& rc);
  // The deadline timer's expiry: cancels the coroutine functions whose
  // deadline has passed and sets the timer for the next. Loop only.
  void on_deadline_timer();

  dispatch_env env_;
  std::unique_ptr<asio::thread_pool> pool_;
  std::unordered_map<std::string, handler> functions_;                   // immutable once started
  struct named_handler {
    std::string name;
    message_port::handler h;
  };
  std::unordered_map<message_kind, named_handler> handlers_;             // immutable once started
  stream_fn stream_handler_;                                             // immutable once started
  gate serving_{"rpc: the worker"};
  std::atomic<std::uint64_t> received_{0};
  std::list<running_call> running_; // loop only
  // Messages that came before start_serving(), in order (loop only).
  struct held_message {
    int from;
    std::string from_name;
    std::shared_ptr<net::connection> conn;
    net::message m;
  };
  std::vector<held_message> held_;
  bool serving_started_ = false; // loop only
  // One timer for the deadlines of every coroutine function running (a timer
  // per call would cost each call a timer's start and cancel); loop only.
  std::unique_ptr<asio::steady_timer> deadline_timer_;
  std::chrono::steady_clock::time_point deadline_armed_ = std::chrono::steady_clock::time_point::max();
  std::unordered_map<const net::connection*, std::shared_ptr<peer_flow>> flows_; // loop only
  std::size_t sweep_flows_at_ = 16; // loop only: flows_ is cleared of closed connections' at this size
  std::atomic<bool> stopped_{false};
};

} // namespace corodist::rpc::detail
