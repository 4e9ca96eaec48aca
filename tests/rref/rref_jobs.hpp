#pragma once
// The RRef suite's multi-process jobs, shared by its process tests (loopback)
// and the hosts suite (namespaced hosts): a worker process's body, the
// functions every worker registers, and the note's four scenarios. For
// worker processes: failures throw (no Boost.Test there).

#include <corodist/rpc/agent.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/debug_info.hpp>
#include <corodist/rref/register_method.hpp>
#include <corodist/rref/remote.hpp>
#include <corodist/store/tcp_store.hpp>

#include "rpc/rpc_fixtures.hpp"

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace corodist::test::rref_jobs {


// A failed expectation inside a worker process: its exit status says so.
inline void expect(bool ok, const std::string& what) {
  if (!ok)
    throw std::runtime_error("expected: " + what);
}

inline std::string counts(const corodist::rref::debug_info& i) {
  return "owners " + std::to_string(i.owners) + ", users " + std::to_string(i.users) + ", pending users " +
         std::to_string(i.pending_users) + ", pending children " + std::to_string(i.pending_children) + ", forks " +
         std::to_string(i.forks) + ", unacked " + std::to_string(i.unacked);
}

inline bool empty(const corodist::rref::debug_info& i) {
  return i.owners + i.users + i.pending_users + i.pending_children + i.forks + i.unacked == 0;
}

/// One worker process: an RRef-enabled agent listening on `host`, meeting
/// the others at the store server on `store_host`:`port`; `setup` registers
/// functions, `body` runs the scenario; then a graceful shutdown, after which
/// this worker's protocol must hold nothing. Returns 0 (throws otherwise).
inline int worker(const std::string& store_host, std::uint16_t port, int rank, int world,
                  const std::function<void(rpc::agent&)>& setup, const std::function<void(rpc::agent&)>& body,
                  const std::string& host = "127.0.0.1") {
  event_loop loop;
  loop.start();
  store::tcp_store_options so;
  so.host = store_host;
  so.port = port;
  so.auth_token = "";
  so.timeout = std::chrono::seconds(20);
  auto o = worker_options(rank, world, store::tcp_store::connect_sync(loop.get_executor(), so));
  o.host = host;
  rpc::agent a(loop, o);
  corodist::rref::enable(a);
  setup(a);
  a.start();
  body(a);
  a.shutdown();
  const auto left = corodist::rref::info(a);
  expect(empty(left), "worker " + std::to_string(rank) + " holds nothing after shutdown (" + counts(left) + ")");
  return 0;
}

// The functions every scenario uses (registered on every worker).
inline corodist::rref::rref<int> kept;                      // a reference a worker holds on to
inline corodist::rref::rref<std::vector<double>> params;    // the parameter server's values
inline constexpr int trainers = 3, steps = 20;
inline std::atomic<int> trainers_done{0};
inline std::promise<void> all_trained; // set by the last trainer's trainer_done

inline void standard(rpc::agent& a) {
  auto* ap = &a;
  a.register_function("make", [](int v) { return v; });
  // A reference arriving as an argument: its value read where it arrived.
  a.register_function("read", [](corodist::rref::rref<int> r) { return r.to_here().get(); });
  // On the owner: the value itself, not a copy over the network.
  a.register_function("read_local", [](corodist::rref::rref<int> r) {
    expect(r.is_owner(), "the reference came back to its owner as the owner's own");
    return *r.local_value();
  });
  // Keeps a reference (a user that holds it), returns it on request.
  a.register_function("keep", [](corodist::rref::rref<int> r) {
    kept = r;
    return kept.is_owner();
  });
  a.register_function("give_back", [] { return std::exchange(kept, {}); });
  // Asks worker `who` for the reference it keeps (a user returns it to its owner).
  a.register_function("read_back_from", [ap](int who) {
    auto r = ap->rpc_sync<corodist::rref::rref<int>>(who, "give_back");
    expect(r.is_owner(), "a reference returned to its owner is the owner's own");
    return *r.local_value();
  });
  // Passes the reference along a chain of workers; the last one reads it.
  a.register_function("chain", [ap](corodist::rref::rref<int> r, std::vector<int> rest) {
    if (rest.empty())
      return r.to_here().get();
    const int next = rest.front();
    rest.erase(rest.begin());
    return ap->rpc_sync<int>(next, "chain", r, rest);
  });
  // The owner starts a chain with a value of its own.
  a.register_function("start_chain", [ap](int v, std::vector<int> rest) {
    auto r = corodist::rref::make_rref(*ap, v);
    const int next = rest.front();
    rest.erase(rest.begin());
    return ap->rpc_sync<int>(next, "chain", r, rest);
  });
  a.register_function("share_local", [ap](int v) { return corodist::rref::make_rref(*ap, v); });
  // The parameter server's side.
  a.register_function("get_params", [ap] {
    static std::mutex m;
    std::lock_guard lk(m);
    if (!params.valid()) // made on the first trainer's request
      params = corodist::rref::make_rref(*ap, std::vector<double>(4, 0.0));
    return params;
  });
  a.register_function("trainer_done", [] {
    if (++trainers_done == trainers)
      all_trained.set_value();
    return 0;
  });
  corodist::rref::register_method<std::vector<double>>(a, "update", [](std::vector<double>& p, double delta) {
    for (auto& x : p)
      x += delta;
    return std::accumulate(p.begin(), p.end(), 0.0);
  });
}


/// The note's four scenarios, driven by worker 0 of three (the others serve):
/// remote() and to_here, a reference shared with its owner as an argument
/// and as a return value, an owner's reference read on a user, references
/// passed on to a third worker (forks), and one kept on w2 until shutdown
/// deletes it.
inline void four_scenarios(rpc::agent& a, int rank) {
  if (rank != 0)
    return;
  // User shares with owner, as an argument: the owner accepts it directly.
  auto r = corodist::rref::remote<int>(a, "w1", "make", 7);
  expect(r.owner() == 1 && !r.is_owner(), "remote() gives a UserRRef owned by the callee");
  expect(a.rpc_sync<int>("w1", "read_local", r) == 7, "the owner reads its own value");
  expect(r.to_here().get() == 7, "to_here on the creator");
  expect(r.confirmed_by_owner(), "the creator's UserRRef is confirmed");
  // User shares with owner, as a return value: w2 keeps a fork, w1 asks for it back.
  expect(!a.rpc_sync<bool>("w2", "keep", corodist::rref::remote<int>(a, "w1", "make", 8)), "w2 keeps a UserRRef");
  expect(a.rpc_sync<int>("w1", "read_back_from", 2) == 8, "w1 reads the reference w2 returned");
  // Owner shares with user: w1 makes a value of its own and returns the reference.
  auto o = a.rpc_sync<corodist::rref::rref<int>>("w1", "share_local", 9);
  expect(o.owner() == 1 && o.to_here().get() == 9, "the owner's reference, read on a user");
  // User shares with user: w0 passes references owned by w1 to w2, which reads them.
  expect(a.rpc_sync<int>("w2", "read", o) == 9, "a user's fork read by another user");
  expect(a.rpc_sync<int>("w2", "read", r) == 7, "the creator's fork read by another user");
  // w2 keeps one until shutdown: shutdown deletes it.
  expect(!a.rpc_sync<bool>("w2", "keep", o), "w2 keeps a UserRRef at shutdown");
}

} // namespace corodist::test::rref_jobs
