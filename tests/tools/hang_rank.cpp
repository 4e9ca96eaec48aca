// A rank of the hang-verdict tests, started by corodist-run (which hosts the
// store and runs the hang watch). Usage: corodist-test-hang SCENARIO
// (A group numbers its collectives from 0.)
//   skip      ranks make allreduce #0; the last rank skips the first of the
//             two that follow (its next allreduce pairs with the others' #1)
//             and then computes: the others wait in #2
//   compute   ranks make allreduce #0; the last rank then computes (blocks its
//             main thread) while the others wait in #1
//   dead-rpc  rank 1 is RPC worker "w1" and stops itself (SIGSTOP) once the
//             others know it; rank 0 calls "load" on it and hangs there; the
//             other ranks wait for rank 0 in allreduce #1
//   died      ranks make allreduce #0; the last rank kills itself (SIGKILL)
//             while the others wait in #1; they catch the error and stay
//   cross     two ranks, groups "a" and "b": rank 0 calls a's allreduce first,
//             rank 1 b's first: each waits for the other in another group
// Every rank prints "ready" before it starts hanging; an alarm ends a rank
// after 120 s so that nothing outlives a broken test.
#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/debug_responder.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/sync_store.hpp>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace cc = corodist::collective;
namespace cs = corodist::store;

namespace {

void ready() {
  std::printf("ready\n");
  std::fflush(stdout);
}

/// "Compute" that never ends (until the launcher stops the rank).
[[noreturn]] void compute_forever() {
  for (;;)
    ::pause();
}

} // namespace

int main(int argc, char** argv) {
  ::alarm(120);
  if (argc != 2) {
    std::fprintf(stderr, "usage: corodist-test-hang skip|compute|dead-rpc|died|cross\n");
    return 2;
  }
  const std::string mode = argv[1];
  corodist::event_loop loop;
  loop.start();
  auto [store, rank, world] = cs::rendezvous(loop, "env://");
  const bool last = rank == world - 1;
  std::vector<float> v(1000, 1.0f);

  if (mode == "cross") {
    cc::gloo_options a;
    a.prefix = "a";
    cc::gloo_options b;
    b.prefix = "b";
    auto ga = cc::gloo_group::create_sync(store, rank, world, a);
    auto gb = cc::gloo_group::create_sync(store, rank, world, b);
    ready();
    if (rank == 0) {
      ga->allreduce(v).get();
      gb->allreduce(v).get();
    } else {
      gb->allreduce(v).get();
      ga->allreduce(v).get();
    }
    return 0;
  }

  if (mode == "dead-rpc") {
    corodist::rpc::agent_options o;
    o.name = "w" + std::to_string(rank);
    o.rank = rank;
    o.world_size = world;
    o.store = store;
    corodist::rpc::agent rpc(loop, o);
    rpc.register_function("load", [](int x) { return x; });
    rpc.start();
    auto g = cc::gloo_group::create_sync(store, rank, world);
    g->allreduce(v).get(); // #0: every agent has started
    if (rank == 1) {
      ready();
      ::raise(SIGSTOP); // hung: its connections stay open, nothing answers
      return 0;
    }
    ready();
    if (rank == 0)
      (void)rpc.rpc_sync<int>("w1", "load", 7);
    g->allreduce(v).get(); // #1
    return 0;
  }

  auto g = cc::gloo_group::create_sync(store, rank, world);
  g->allreduce(v).get(); // #0
  if (mode == "skip") {
    if (last) {
      g->allreduce(v).get(); // pairs with the others' #1
      ready();
      compute_forever();
    }
    ready();
    g->allreduce(v).get(); // #1
    g->allreduce(v).get(); // #2
    return 0;
  }
  if (mode == "compute") {
    ready();
    if (last)
      compute_forever();
    g->allreduce(v).get(); // #1
    return 0;
  }
  if (mode == "died") {
    ready();
    if (last) {
      // Once the others are in #1 (their stuck reports show it), die.
      cs::sync_store s(store);
      s.wait({cs::debug_key("stuck/1")}, std::chrono::seconds(60));
      ::raise(SIGKILL);
    }
    try {
      g->allreduce(v).get(); // #1
    } catch (const std::exception& e) {
      // The survivors stay (as a program that handles the error would) until stopped.
      std::printf("allreduce #1 failed: %s\n", e.what());
      std::fflush(stdout);
      compute_forever();
    }
    return 0;
  }
  std::fprintf(stderr, "unknown scenario '%s'\n", mode.c_str());
  return 2;
}
