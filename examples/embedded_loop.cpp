// corodist inside a program's own asio::io_context (embedded mode): a store
// server and an RPC agent share the program's loop, which the program runs.
//
//   embedded_loop
#include "usage.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>

#include <cstdio>

asio::awaitable<void> serve_and_call(corodist::event_loop& loop, corodist::store::store_server& server) {
  corodist::store::tcp_store_options so;
  so.port = server.local_endpoint().port();
  auto store = co_await corodist::store::tcp_store::connect(loop.get_executor(), so);

  corodist::rpc::agent_options o;
  o.name = "solo";
  o.rank = 0;
  o.world_size = 1;
  o.store = store; // a job of one worker, its store on the same loop
  corodist::rpc::agent rpc(loop, o);
  rpc.register_function("add", [](int a, int b) { return a + b; });
  co_await rpc.async_start(); // on the loop's thread: the awaitable forms, never the blocking ones
  int sum = co_await rpc.call<int>("solo", "add", 2, 3);
  std::printf("2 + 3 = %d, computed on the program's own io_context\n", sum);
  co_await rpc.async_shutdown();

  store->close();
  server.stop(); // with nothing left to do, ctx.run() returns
}

int main(int argc, char** argv) {
  if (auto status = examples::no_arguments(argc, argv, "corodist inside the program's own asio::io_context: a store server and an RPC agent on the program's loop (one process, no launcher)."))
    return *status;
  asio::io_context ctx;           // the program's loop (it may serve other things too)
  corodist::event_loop loop(ctx); // corodist's objects run on it; the program runs it
  auto server = corodist::store::store_server::start(ctx.get_executor(), {});
  asio::co_spawn(ctx, serve_and_call(loop, *server), [](std::exception_ptr e) {
    if (e)
      std::rethrow_exception(e); // out of ctx.run(), into main()
  });
  ctx.run();
}
