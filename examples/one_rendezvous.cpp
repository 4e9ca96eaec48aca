// One rendezvous for a whole job: its store, an RPC agent, an RRef and a gloo
// process group in one program. Run it under corodist-run:
//
//   corodist-run --nproc-per-node 2 one_rendezvous
//
// The ranks meet once (env://); the store that yields is given to the agent
// and to the group, whose keys (under corodist/rpc/ and corodist/pg/) sit
// beside the program's own. Each rank asks the next one, through an RRef, for
// a vector that stays there, fetches it, and sums the fetched vectors with an
// allreduce.
#include "usage.hpp"

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/remote.hpp>
#include <corodist/store/rendezvous.hpp>
#include <corodist/store/sync_store.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace rr = corodist::rref;

int main(int argc, char** argv) {
  if (auto status = examples::no_arguments(argc, argv, "One rendezvous for a job's store, RPC agent, RRef and gloo group: run it under corodist-run,\n  corodist-run --nproc-per-node 2 one_rendezvous"))
    return *status;
  corodist::event_loop loop;
  loop.start();
  // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT come from corodist-run (or torchrun).
  auto [store, rank, world] = corodist::store::rendezvous(loop, "env://");

  // The store: the program's keys.
  corodist::store::sync_store kv(store);
  kv.set("greeting/" + std::to_string(rank), "hello from rank " + std::to_string(rank));

  // An RPC agent on the same store (no second rendezvous), with RRefs.
  corodist::rpc::agent_options o;
  o.name = "w" + std::to_string(rank);
  o.rank = rank;
  o.world_size = world;
  o.store = store;
  corodist::rpc::agent rpc(loop, o);
  rr::enable(rpc); // before start()
  rpc.register_function("filled", [rank](int n) { return std::vector<float>(n, static_cast<float>(rank + 1)); });
  rpc.start();

  // A gloo process group on the same store.
  auto group = corodist::collective::gloo_group::create_sync(store, rank, world);

  // An RRef: the next rank makes the vector and keeps it; this rank fetches it.
  const int next = (rank + 1) % world;
  rr::rref<std::vector<float>> remote_vector = rr::remote<std::vector<float>>(rpc, next, "filled", 4);
  std::vector<float> v = remote_vector.to_here().get();
  group->allreduce(v).get(); // the sum over the ranks: 1 + 2 + ... + world in every element

  const std::string greeting = kv.get("greeting/" + std::to_string(next));
  std::printf("rank %d of %d: allreduce of the fetched RRef values = %g %g %g %g; the store has '%s'\n", rank, world,
              v[0], v[1], v[2], v[3], greeting.c_str());

  remote_vector = {}; // the owner may delete its vector
  rpc.shutdown();     // graceful: waits until every worker is done; rank 0, which hosts the store without a launcher, leaves last
}
