#pragma once
// The state of one RPC agent (private): its parts -- the worker registry, the
// channels to peers, the dispatcher -- and the message port they make up.
// Started in agent_core.cpp, outgoing calls in outgoing_calls.cpp, graceful
// shutdown in shutdown.cpp; rpc::agent (agent.cpp) is the public facade.

#include <corodist/core/flight_recorder.hpp>
#include <corodist/core/future.hpp>
#include <corodist/core/gate.hpp>
#include <corodist/core/unique_function.hpp>
#include <corodist/net/listener.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/rpc/agent_options.hpp>
#include <corodist/rpc/message_port.hpp>

#include "rpc/channels.hpp"
#include "rpc/dispatcher.hpp"
#include "rpc/stream_table.hpp"
#include "rpc/worker_registry.hpp"

#include <asio/any_io_executor.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace corodist::rpc::detail {

enum class agent_state : int { created, starting, running, stopped };

/// What a call or message's sender gets back, once: the error, or the reply
/// payload (the same type as agent's completion).
using reply_handler = corodist::unique_function<void(std::exception_ptr error, net::bytes&& reply)>;

/// What an outgoing message is, in its errors (`<what>: <reason>`): `text`,
/// or for a call (`text` empty) "rpc '<fn>' on worker '<callee>'", made only
/// when an error needs it.
struct message_what {
  message_what(std::string t) : text(std::move(t)) {} // NOLINT: a plain text converts
  static message_what call(std::string_view fn) {
    message_what w{std::string()};
    w.fn.assign(fn);
    return w;
  }
  std::string text;
  std::string fn;
};

class agent_core final : public message_port, public std::enable_shared_from_this<agent_core> {
public:
  agent_core(asio::any_io_executor ex, agent_options opts);
  ~agent_core() override;

  // ---- lifecycle (agent_core.cpp, shutdown.cpp) ----
  asio::awaitable<void> start();
  /// Graceful (join protocol, bounded by shutdown_timeout) or immediate. A
  /// second call while one runs waits for the first's outcome.
  asio::awaitable<void> shutdown(bool graceful);
  /// Closes everything at once (loop only).
  void close_all();

  // ---- outgoing calls (outgoing_calls.cpp) ----
  /// Sends an encoded call to `to` (any thread); `done` runs once, on the loop
  /// or on the pool for a large reply.
  /// `cancel`: the call's cancel handle (null: none).
  void start_call(worker_ref to, std::string_view fn, payload call, corodist::deadline by, reply_handler done,
                  std::shared_ptr<outgoing_call> cancel = nullptr);
  /// Cancels the call of `handle` (any thread): see channels::cancel.
  static void cancel_call(const std::shared_ptr<outgoing_call>& handle);
  /// Sends a request of any kind to rank `to` (any thread): counted as a call
  /// in flight until `done` ran. `what` names the operation in errors (`<what>: <reason>`).
  /// `record`: the call's flight-recorder entry (0: none), ended with the reply.
  void start_message(int to, message_kind kind, payload p, corodist::deadline by, reply_handler done,
                     message_what what, flight_recorder::handle record = 0,
                     std::shared_ptr<outgoing_call> cancel = nullptr);
  /// The text of `what` for a message to rank `to`.
  std::string what_text(const message_what& what, int to) const;
  /// The time limit of a call with none of its own.
  corodist::timeout default_timeout() const noexcept {
    return opts_.rpc_timeout.or_else(agent_options::default_rpc_timeout);
  }

  // ---- message_port ----
  const worker_info& self() const override { return registry_.self(); }
  int world_size() const override { return opts_.world_size; }
  const worker_info& worker(worker_ref w) const override { return registry_.lookup(w); }
  asio::any_io_executor get_executor() override { return ex_; }
  void set_handler(message_kind kind, std::string name, handler h) override;
  future<net::bytes> request(int to, message_kind kind, payload p, corodist::deadline by,
                             std::string what) override;
  void notify(int to, message_kind kind, payload p) override;
  future<payload> run_local(std::string_view fn, const msgpack::object& args, std::shared_ptr<const void> keep,
                            call_context ctx) override;
  void add_shutdown_step(std::string name, shutdown_step step) override;
  void decode_context(int from, codec_context& ctx) override;
  std::weak_ptr<const void> lifetime() const override { return weak_from_this(); }

  // (any thread)
  const asio::any_io_executor ex_;
  agent_options opts_;
  std::atomic<agent_state> state_{agent_state::created};
  worker_registry registry_;
  std::shared_ptr<dispatcher> dispatcher_;
  std::shared_ptr<stream_table> streams_; // (its functions: before start; the rest: loop only)
  gate outgoing_{"rpc: the agent"};    // calls issued, not yet completed
  std::atomic<std::uint64_t> calls_sent_{0};
  const std::shared_ptr<flight_recorder> recorder_; // calls made and served; null: recording off

  // (loop only)
  std::shared_ptr<store::store> store_;
  std::shared_ptr<net::listener> listener_;
  std::shared_ptr<channels> channels_;
  asio::ip::tcp::endpoint local_;
  std::vector<std::pair<std::string, shutdown_step>> shutdown_steps_;
  std::optional<shared_future<void>> shutting_down_; // the shutdown in progress, if any

private:
  void finish_message(int rank, const message_what& what, std::chrono::milliseconds length, net::response&& r,
                      reply_handler& done,
                      flight_recorder::handle record);
  // Graceful shutdown's parts (shutdown.cpp), each within the one deadline.
  asio::awaitable<void> run_shutdown(bool graceful);
  asio::awaitable<void> join(corodist::deadline deadline);
  asio::awaitable<void> leave(std::string base, corodist::deadline deadline);
  asio::awaitable<void> wait_idle(corodist::deadline deadline);
  corodist::timeout shutdown_limit() const noexcept {
    return opts_.shutdown_timeout.or_else(agent_options::default_shutdown_timeout);
  }
  asio::awaitable<void> in_phase(std::string what, asio::awaitable<void> op);
};

} // namespace corodist::rpc::detail
