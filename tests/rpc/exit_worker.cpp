// One rank of the shortest RPC job, shaped like docs/rpc.md: start from env://
// (rank 0 hosts the store), call the next rank (rpc_sync, rpc_async and
// co_await call), shut down, return -- after a
// pause of 0-24 ms drawn from EXIT_SEED and the rank, so that ranks leave in
// every order. With
// END_WITH_BARRIER=1 the program makes the store itself (rendezvous) and ends
// with a store barrier after shutdown, as docs/store.md advises.
// Exit status 0 when the call was right and everything ended cleanly.
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/store.hpp>
#include <corodist/store/sync_store.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>

int main() {
  try {
    const int rank = std::atoi(std::getenv("RANK"));
    const int world = std::atoi(std::getenv("WORLD_SIZE"));
    const char* seed = std::getenv("EXIT_SEED");
    const char* barrier = std::getenv("END_WITH_BARRIER");
    corodist::event_loop loop;
    loop.start();
    const bool end_with_barrier = barrier && std::string(barrier) == "1";
    std::shared_ptr<corodist::store::store> store;
    corodist::rpc::agent_options o;
    o.name = "w" + std::to_string(rank);
    if (end_with_barrier) {
      corodist::store::rendezvous_options ro;
      ro.auth_token = "";
      auto r = corodist::store::rendezvous(loop, "env://", ro);
      store = r.store;
      o.store = store;
      o.rank = r.rank;
      o.world_size = r.world_size;
    } else {
      o.init_method = "env://";
    }
    o.auth_token = "";
    o.init_timeout = std::chrono::seconds(30);
    o.shutdown_timeout = std::chrono::seconds(30);
    corodist::rpc::agent a(loop, o);
    a.register_function("add", [](int x, int y) { return x + y; });
    a.start();
    const int peer = (rank + 1) % world;
    // The three ways of docs/rpc.md: blocking, a future, and awaited in a coroutine.
    const int s = a.rpc_sync<int>(peer, "add", rank, 1);
    auto f = a.rpc_async<int>(peer, "add", rank, 2);
    const int c = corodist::run_blocking(loop.get_executor(), a.call<int>(peer, "add", rank, 3));
    if (s != rank + 1 || f.get() != rank + 2 || c != rank + 3) {
      std::fprintf(stderr, "rank %d: wrong answer\n", rank);
      return 2;
    }
    a.shutdown();
    if (end_with_barrier)
      corodist::store::sync_store(store).barrier("end", world);
    if (seed) // deliberate: a random delay (not a synchronisation), so that the ranks leave in every order
      std::this_thread::sleep_for(std::chrono::milliseconds((std::atoi(seed) * 31 + rank * 17) % 25));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exit_worker: %s\n", e.what());
    return 1;
  }
}
