// Store rendezvous and barrier across processes. Run it under corodist-run:
//
//   corodist-run --nproc-per-node 3 store_barrier
//
// Every rank finds the others through env:// (corodist-run's launcher hosts the store server;
// without one, rank 0 does),
// publishes a key, waits at a barrier, and reads what the others published.
#include "usage.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/sync_store.hpp>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (auto status = examples::no_arguments(argc, argv, "Store rendezvous and barrier across processes: run it under corodist-run,\n  corodist-run --nproc-per-node 3 store_barrier"))
    return *status;
  corodist::event_loop loop;
  loop.start();
  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from corodist-run (or torchrun).
  auto [store, rank, world] = corodist::store::rendezvous(loop, "env://");
  corodist::store::sync_store s(store);

  s.set("hello/" + std::to_string(rank), "rank " + std::to_string(rank) + " was here");
  s.barrier("published", world); // returns once every rank has set its key

  std::string seen;
  for (int r = 0; r < world; ++r)
    seen += s.get("hello/" + std::to_string(r)) + (r + 1 < world ? ", " : "");
  std::printf("rank %d of %d sees: %s\n", rank, world, seen.c_str());

  // Without a launcher rank 0's process hosts the store: nobody leaves before everyone is done with it.
  s.barrier("done", world);
}
