// Serving with streams and cancellation: an inference router.
//
//   corodist-run --nproc-per-node 4 inference_router
//   corodist-run --nproc-per-node 4 --tls-cert C --tls-key K --tls-ca CA -- inference_router
//
// Rank 0 is the client, rank 1 the router, ranks 2.. the model workers
// ("worker2", "worker3", ...). A worker's stream function "generate" makes
// tokens one by one (a short timer per token stands in for the model). The
// router's stream function "route" picks a worker (round-robin), opens its
// "generate" stream, passing the client's request id on as metadata, and
// forwards each token to its own client as it comes.
//
// The idiom is what happens when the client goes away mid-stream: it cancels
// its reader, so the router's function is cancelled (its pending next() or
// write() ends with operation_aborted); on the way out the router cancels the
// worker's stream, so the worker's generation is cancelled in turn, and no
// worker keeps generating tokens nobody reads. The client checks that the
// cancel got through by asking the worker (a call that waits for the event,
// with a time limit).
//
// Every wait has a time limit: the streams' deadlines (stream_options::timeout,
// which the router's open inherits while serving), the calls' limits, and
// the worker's wait for a cancellation. Under corodist-run's --tls-* flags the
// agents' channels use mutual TLS (agent_options::tls defaults to the
// CORODIST_TLS_* variables the launcher exports); the client says which.
#include "usage.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/net/tls.hpp>
#include <corodist/rpc/agent.hpp>

#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

namespace rpc = corodist::rpc;
using namespace std::chrono_literals;

namespace {

bool is_cancellation(const std::system_error& e) { return e.code() == asio::error::operation_aborted; }

// A model worker. Its state is touched only on the agent's loop (stream and
// coroutine functions run there), so it needs no lock.
struct model_worker {
  int completed = 0;
  int cancelled = 0;
  std::map<std::string, int> cancelled_after; // request id -> tokens written when it was cancelled
  std::vector<asio::steady_timer*> waiters;   // wait_cancelled calls waiting for a cancellation

  // "generate": the next tokens of `prompt`, one every 2 ms, at most max_tokens.
  asio::awaitable<void> generate(const rpc::call_context& ctx, rpc::stream_writer<std::string>& out,
                                 std::string prompt, int max_tokens) {
    static constexpr std::array<const char*, 8> vocabulary = {"the", "cat", "sat", "on", "a", "warm", "mat", "."};
    const std::string id(ctx.header("request-id").value_or("?"));
    asio::steady_timer step(co_await asio::this_coro::executor);
    int written = 0;
    try {
      for (; written < max_tokens; ++written) {
        step.expires_after(2ms); // "the model" computes the next token
        co_await step.async_wait(asio::use_awaitable);
        co_await out.write(std::string(vocabulary[(prompt.size() + written) % vocabulary.size()]));
      }
    } catch (const std::system_error& e) {
      // Cancelled: by the reader (the router) or at the stream's deadline. The
      // pending timer or write ends with operation_aborted (a write after the
      // cancel throws rpc::cancelled_error, one too).
      if (!is_cancellation(e))
        throw;
      ++cancelled;
      cancelled_after[id] = written;
      for (asio::steady_timer* w : waiters)
        w->cancel(); // wakes every wait_cancelled call
      throw;         // the stream ends cancelled
    }
    ++completed;
  }

  // "wait_cancelled": the tokens the generation of request `id` had written
  // when it was cancelled, once it has been; -1 if it was not within `ms`.
  asio::awaitable<int> wait_cancelled(std::string id, int ms) {
    asio::steady_timer until(co_await asio::this_coro::executor, std::chrono::milliseconds(ms));
    while (!cancelled_after.contains(id)) {
      waiters.push_back(&until);
      auto [ec] = co_await until.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
      std::erase(waiters, &until);
      if (!ec)
        co_return -1; // the time limit passed
      // Woken by a cancellation (maybe another request's): wait again, to the same deadline.
    }
    co_return cancelled_after[id];
  }
};

// The router: which worker serves each request.
struct router {
  rpc::agent& agent;
  std::vector<std::string> workers;
  std::size_t next = 0;
  std::map<std::string, std::string> served_by; // request id -> worker

  // "route": the tokens of a worker's "generate", forwarded as they come.
  asio::awaitable<void> route(const rpc::call_context& ctx, rpc::stream_writer<std::string>& out,
                              std::string prompt, int max_tokens) {
    const std::string id(ctx.header("request-id").value_or("?"));
    const std::string worker = workers[next++ % workers.size()]; // round-robin
    served_by[id] = worker;
    rpc::stream_options so;
    so.metadata = {{"request-id", id}}; // the trace travels on; the deadline is inherited from this stream
    rpc::stream_reader<std::string> tokens = agent.open_stream<std::string>(so, worker, "generate", prompt, max_tokens);
    try {
      while (std::optional<std::string> token = co_await tokens.next())
        co_await out.write(*token);
    } catch (const std::system_error& e) {
      // The client went away: this function is cancelled (its pending next()
      // or write() ended with operation_aborted), and so must be the worker's
      // generation. Dropping `tokens` before its end would cancel it too;
      // saying so is clearer.
      if (is_cancellation(e))
        std::printf("router: %s was cancelled by its client; cancelling its stream on %s\n", id.c_str(),
                    worker.c_str());
      tokens.cancel();
      throw;
    } catch (...) { // any other early end (the deadline, a lost client): the same
      tokens.cancel();
      throw;
    }
  }
};

// The client: three requests at once; two read to the end, one abandoned.
asio::awaitable<int> run_client(rpc::agent& agent) {
  struct request {
    std::string id, prompt;
    int max_tokens;
  };
  const std::vector<request> requests = {
      {"req-1", "Once upon a time", 6}, {"req-2", "In a hole in the ground", 4}, {"req-3", "Tell me everything", 2000}};
  std::vector<rpc::stream_reader<std::string>> streams;
  for (const request& r : requests) {
    rpc::stream_options so;
    so.timeout = 10s; // the whole request, router and worker included
    so.metadata = {{"request-id", r.id}};
    streams.push_back(agent.open_stream<std::string>(so, "router", "route", r.prompt, r.max_tokens)); // at once
  }
  for (std::size_t i = 0; i < 2; ++i) { // read to the end
    std::string text = requests[i].prompt;
    int n = 0;
    while (std::optional<std::string> token = co_await streams[i].next()) {
      text += " " + *token;
      ++n;
    }
    std::printf("client: %s: %s (%d tokens)\n", requests[i].id.c_str(), text.c_str(), n);
  }
  int read = 0;
  for (; read < 3; ++read) // a few tokens of the long one ...
    co_await streams[2].next();
  std::printf("client: %s: read %d tokens, disconnecting\n", requests[2].id.c_str(), read);
  streams[2].cancel(); // ... then it goes away (dropping the reader would do the same)

  // Did the cancel reach the worker? Ask the router who served it, then the worker.
  const std::string worker = co_await agent.call<std::string>(5s, "router", "served_by", requests[2].id);
  const int k = co_await agent.call<int>(5s, worker, "wait_cancelled", requests[2].id, 3000);
  if (k < 0) {
    std::printf("client: %s's generation of %s was not cancelled within 3 s\n", worker.c_str(),
                requests[2].id.c_str());
    co_return 1;
  }
  std::printf("client: %s's generation of %s was cancelled after %d tokens\n", worker.c_str(),
              requests[2].id.c_str(), k);
  for (const char* w : {"worker2", "worker3"}) {
    const auto [done, cancelled] = co_await agent.call<std::pair<int, int>>(5s, w, "stats");
    std::printf("client: %s: completed %d, cancelled %d\n", w, done, cancelled);
  }
  co_return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (auto status = examples::no_arguments(
          argc, argv,
          "An inference router (rank 0: client, 1: router, 2..: model workers) streaming tokens, and a\n"
          "client that disconnects mid-stream (the worker's generation is cancelled). Run it under\n"
          "corodist-run: corodist-run --nproc-per-node 4 inference_router"))
    return *status;
  corodist::event_loop loop;
  loop.start();
  rpc::agent_options o;
  o.init_method = "env://"; // RANK and WORLD_SIZE from corodist-run, whose launcher hosts the store
  const char* rank_text = std::getenv("RANK");
  const int rank = rank_text ? std::atoi(rank_text) : 0;
  o.name = rank == 0 ? "client" : rank == 1 ? "router" : "worker" + std::to_string(rank);
  rpc::agent agent(loop, o);

  model_worker worker;
  router route{agent, {}, 0, {}};
  if (rank == 1) {
    route.workers = {"worker2", "worker3"};
    agent.register_stream("route", [&route](const rpc::call_context& ctx, rpc::stream_writer<std::string>& out,
                                            std::string prompt, int max_tokens) {
      return route.route(ctx, out, std::move(prompt), max_tokens);
    });
    agent.register_function("served_by", [&route](std::string id) -> asio::awaitable<std::string> {
      co_return route.served_by.contains(id) ? route.served_by[id] : std::string();
    });
  } else if (rank >= 2) {
    agent.register_stream("generate", [&worker](const rpc::call_context& ctx, rpc::stream_writer<std::string>& out,
                                                std::string prompt, int max_tokens) {
      return worker.generate(ctx, out, std::move(prompt), max_tokens);
    });
    agent.register_function("wait_cancelled", [&worker](std::string id, int ms) {
      return worker.wait_cancelled(std::move(id), ms);
    });
    agent.register_function("stats", [&worker]() -> asio::awaitable<std::pair<int, int>> {
      co_return std::pair{worker.completed, worker.cancelled};
    });
  }
  agent.start(); // every worker is known from here on

  int status = 0;
  if (rank == 0) {
    // What the agent resolved its tls option to (agent_options::tls: nullopt reads CORODIST_TLS_*).
    const std::optional<corodist::net::tls_options> t = corodist::net::resolve_tls_options(o.tls);
    const bool tls = t && t->enabled();
    std::printf("client: the agents' channels use %s\n", tls ? "mutual TLS" : "plain TCP");
    status = corodist::run_blocking(loop.get_executor(), run_client(agent), "client");
  }
  agent.shutdown(); // graceful: waits until every worker is done calling and streaming
  return status;
}
