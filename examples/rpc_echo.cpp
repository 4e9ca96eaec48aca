// An RPC echo server and its client: two processes, one program.
//
//   corodist-run --nproc-per-node 2 rpc_echo
//
// Rank 0 ("server") registers "echo"; rank 1 ("client") calls it three ways:
// rpc_sync (blocking), rpc_async (a future) and co_await (in a coroutine).
#include "usage.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/rpc/agent.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

// The third way: inside a coroutine, a call is awaited (the loop is never blocked).
asio::awaitable<std::string> echo_from_a_coroutine(corodist::rpc::agent& rpc) {
  co_return co_await rpc.call<std::string>("server", "echo", "co_await");
}

int main(int argc, char** argv) {
  if (auto status = examples::no_arguments(argc, argv, "An RPC echo server (rank 0) and its client (rank 1): run it under corodist-run,\n  corodist-run --nproc-per-node 2 rpc_echo"))
    return *status;
  corodist::event_loop loop;
  loop.start();
  corodist::rpc::agent_options o;
  o.init_method = "env://"; // RANK and WORLD_SIZE from corodist-run, whose launcher hosts the store
  const char* rank = std::getenv("RANK");
  o.name = rank && std::string(rank) == "0" ? "server" : "client";
  corodist::rpc::agent rpc(loop, o);
  rpc.register_function("echo", [](std::string s) { return "echo: " + s; });
  rpc.start(); // every worker is known from here on

  if (rpc.self().name == "client") {
    std::string a = rpc.rpc_sync<std::string>("server", "echo", "sync");
    corodist::future<std::string> f = rpc.rpc_async<std::string>("server", "echo", "async");
    std::string c = corodist::run_blocking(loop.get_executor(), echo_from_a_coroutine(rpc));
    std::printf("%s | %s | %s\n", a.c_str(), f.get().c_str(), c.c_str());
  }
  rpc.shutdown(); // graceful: waits until every worker is done calling
}
