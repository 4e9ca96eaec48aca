/// \file
/// Suite `subgroups`: how long making subgroups takes, on 16 rank processes
/// forked from this one over loopback Gloo (a store_server in this process,
/// the launcher's place; one tcp_store client per rank). Every rank creates
/// the parent gloo_group once (defaults, 127.0.0.1), then per iteration:
/// a barrier on the parent, the timed call, and the new groups dropped.
///   split_r16          `parent->split(rank / 4, rank)`: four groups of four
///   new_group_r16      `new_group(parent, {0..7})`: one group of eight, the
///                      other eight ranks non-members (null)
///   mesh_4x4_r16       `device_mesh::create(parent, {{"dp", 4}, {"tp", 4}})`:
///                      two splits, a dp and a tp group of four per rank
///   store_barrier_r16  one `store::barrier` of the 16 ranks: the floor of any
///                      group creation here (a rank cannot finish before
///                      every member has published its address), measured
///                      in the same run on the same processes
/// Each includes the allgather of colors over the parent, the new groups'
/// rendezvous in the store and their full mesh of TCP connections, and the
/// member keys. The time of an iteration is its slowest rank's (the groups
/// are usable everywhere only then); p50/p99 over the iterations.

#include "forked_ranks.hpp"
#include "harness.hpp"
#include "store_host.hpp"

#include <corodist/collective/device_mesh.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/new_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/this_coro.hpp>
#include <fmt/core.h>

#include <chrono>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

namespace corodist::bench {
namespace {

using clock_type = std::chrono::steady_clock;
namespace cc = collective;

enum class what { split, new_group, mesh, store_barrier };


/// One rank: the parent group, then `iters` timed creations; writes
/// "T <iteration> <ns>" lines to `out`.
asio::awaitable<void> rank_body(std::uint16_t port, int rank, int n, what w, int iters, int out) {
  auto ex = co_await asio::this_coro::executor;
  store::tcp_store_options so;
  so.host = "127.0.0.1";
  so.port = port;
  auto s = co_await store::tcp_store::connect(ex, so);
  cc::gloo_options o;
  o.host = "127.0.0.1";
  o.prefix = "bench/subgroups";
  o.timeout = std::chrono::seconds(60);
  std::shared_ptr<cc::process_group> parent = co_await cc::gloo_group::create(s, rank, n, o);
  std::vector<int> half(static_cast<std::size_t>(n / 2));
  std::iota(half.begin(), half.end(), 0);
  std::vector<cc::mesh_dim> shape{{"dp", 4}, {"tp", n / 4}};
  for (int i = 0; i < iters; ++i) {
    co_await parent->barrier();
    const auto t0 = clock_type::now();
    std::vector<std::shared_ptr<cc::process_group>> made;
    switch (w) {
    case what::split:
      made.push_back(co_await parent->split(rank / 4, rank));
      break;
    case what::new_group:
      made.push_back(co_await cc::new_group(parent, half));
      break;
    case what::mesh: {
      auto m = co_await cc::device_mesh::create(parent, shape);
      made.push_back(m.group("dp"));
      made.push_back(m.group("tp"));
      break;
    }
    case what::store_barrier:
      co_await s->barrier("bench/store_barrier/" + std::to_string(i), n);
      break;
    }
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count();
    auto line = fmt::format("T {} {}\n", i, ns);
    if (::write(out, line.data(), line.size()) < 0)
      throw std::runtime_error("subgroups suite: write failed");
    for (auto& g : made)
      if (g) // every member checks its group once, outside the time
        co_await g->barrier();
  }
  co_await parent->barrier();
}

void run_case(context& ctx, what w, const char* name) {
  const int n = 16, iters = ctx.quick ? 5 : 30;
  store_host host;
  const auto port = host.port();
  auto text = run_forked(
      "subgroups suite", n,
      [&](int r, int out) {
        asio::io_context io;
        std::exception_ptr failed;
        asio::co_spawn(io, rank_body(port, r, n, w, iters, out), [&](std::exception_ptr e) { failed = e; });
        io.run();
        if (failed)
          std::rethrow_exception(failed);
        return 0;
      },
      std::chrono::minutes(5));
  std::map<int, std::int64_t> slowest; // iteration -> its slowest rank's ns
  std::map<int, int> ranks_in;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    std::string tag;
    int i = 0;
    std::int64_t ns = 0;
    if (l >> tag >> i >> ns && tag == "T") {
      slowest[i] = std::max(slowest[i], ns);
      ++ranks_in[i];
    }
  }
  latency_recorder lat;
  for (auto [i, ns] : slowest)
    if (ranks_in[i] == n)
      lat.add(std::chrono::nanoseconds(ns));
  if (lat.size() == 0)
    throw std::runtime_error(fmt::format("subgroups suite: {} measured nothing", name));
  record rec;
  rec.suite = "subgroups";
  rec.name = name;
  rec.p50_us = lat.percentile(0.5);
  rec.p99_us = lat.percentile(0.99);
  rec.extra = {{"ranks", n}, {"iterations", static_cast<double>(lat.size())}};
  if (w != what::store_barrier) {
    rec.extra.push_back({"target_us", 50000.0});
    rec.extra.push_back({"of_target", rec.p50_us / 50000.0});
  }
  ctx.report(std::move(rec));
}

void run_subgroup_suite(context& ctx) {
  run_case(ctx, what::split, "split_r16");
  run_case(ctx, what::new_group, "new_group_r16");
  run_case(ctx, what::mesh, "mesh_4x4_r16");
  run_case(ctx, what::store_barrier, "store_barrier_r16");
}

} // namespace

const suite_registrar registrar("subgroups", &run_subgroup_suite, 52, 4);

} // namespace corodist::bench
