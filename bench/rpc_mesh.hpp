#pragma once
/// \file
/// The rpc suite's job of many agents (`mesh_64_agents`; `mesh_16_agents`
/// with --quick): as many rpc::agent processes, forked from the benchmark one
/// after the other from one moment (the launch), meet in a store_server this
/// process hosts (as a launcher would: corodist-run, torchrun) and each calls
/// every other. Each agent, in turn:
///   1. start-up: connects to the store, starts its agent (listens, registers
///      its name and address, waits for all), and makes one call to the next
///      rank (its first dial and hello);
///   2. channels: after a store barrier, one call to each of the other peers,
///      all at once, so that it dials (and is dialled by) every peer; then a
///      barrier, so that every peer has dialled it too;
///   3. mesh: after a barrier, 64 coroutines each keep one `rpc_async` in
///      flight, to the peers in turn, until the agent has made its calls;
///   4. graceful shutdown of the whole job.
/// Figures (JSON): `startup_s`, launch to the last agent's first call
/// answered (`registered_s`: to the last start() returned; `last_forked_s`:
/// to the last process running; `store_connected_s`: to the last agent
/// connected to the store; `startup_cpu_ms_per_agent`: the CPU time an agent
/// process used until its first answer, all its threads); `calls_per_s` (=
/// ops_per_s), all agents' mesh calls over the mesh's span (first start to
/// last end), and p50/p99 of those calls (the agents' latency quantiles
/// merged); `channel_bytes_per_peer`, the median agent's growth of heap bytes
/// in use over phase 2 divided by the peers it met there (a channel: the
/// connection it dialled, the one it accepted, their buffers and coroutine
/// frames; kernel socket memory is not in it; `_max`: the largest agent's),
/// and `channel_rss_bytes_per_peer`, the same from resident memory
/// (page-grained: pages that malloc freed and reuses hide growth, so it can
/// read 0 at 16 agents); `agent_rss_growth_bytes`, the median resident growth
/// from start() returned to phase 2's end. Times are taken on CLOCK_MONOTONIC
/// (steady_clock), which every process of the machine shares.

#include "closed_loop.hpp"
#include "forked_ranks.hpp"
#include "harness.hpp"
#include "process_resources.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

namespace corodist::bench {
namespace mesh_detail {

using clock_type = std::chrono::steady_clock;

/// The shape of one mesh job.
struct mesh_params {
  int agents = 64;
  int in_flight = 64;         ///< rpc_async calls each agent keeps in flight
  std::size_t calls = 10'000; ///< calls each agent makes in the mesh phase
  std::uint16_t store_port = 0;
  clock_type::time_point launch; ///< when the first agent process was forked
};

/// Quantile points each agent sends of its own latencies (the parent merges
/// them: each agent makes the same number of calls, so each weighs the same).
constexpr int quantile_points = 1000;
/// Values per line to the parent: a line stays under PIPE_BUF, so the lines
/// of different agents never interleave.
constexpr int values_per_line = 200;

inline double seconds_between(clock_type::time_point from, clock_type::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

/// Bytes of this process's heap in use (glibc's mallinfo2: every arena's
/// allocated chunks), which unlike resident memory neither rounds to pages
/// nor counts freed memory malloc keeps.
inline long heap_in_use() { return static_cast<long>(::mallinfo2().uordblks); }

/// CPU time (user + system, all threads) this process has used so far, in seconds.
inline double own_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

inline void say(int fd, const std::string& line) {
  const auto text = line + "\n";
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size()))
    throw std::runtime_error("rpc mesh: cannot write to the benchmark's pipe");
}

/// One agent process of the mesh job (runs after the fork). Writes its
/// figures as lines to `out`; returns the exit status.
inline int mesh_agent(const mesh_params& p, int rank, int out) {
  const auto begun = clock_type::now();
  const int n = p.agents;
  event_loop loop;
  loop.start();
  auto ex = asio::any_io_executor(loop.get_executor());
  store::tcp_store_options so;
  so.port = p.store_port;
  so.auth_token = "";
  so.timeout = std::chrono::seconds(60);
  std::shared_ptr<store::store> st = run_blocking(ex, store::tcp_store::connect(ex, so));
  rpc::agent_options o;
  o.name = fmt::format("agent{}", rank);
  o.rank = rank;
  o.world_size = n;
  o.store = st;
  o.auth_token = "";
  o.rpc_timeout = std::chrono::seconds(60);
  o.init_timeout = std::chrono::seconds(60);
  o.shutdown_timeout = std::chrono::seconds(60);
  o.worker_threads = 1; // the function is a coroutine: the pool stays idle
  rpc::agent a(loop, o);
  a.register_function("add", [](int x, int y) -> asio::awaitable<int> { co_return x + y; });

  // 1. Start-up: registered and all seen, then the first call answered.
  const auto store_connected = clock_type::now();
  a.start();
  const auto registered = clock_type::now();
  const long rss_started = resident_bytes();
  if (a.rpc_sync<int>((rank + 1) % n, "add", rank, 1) != rank + 1)
    throw std::runtime_error("rpc mesh: wrong answer");
  const auto first_answered = clock_type::now();
  const double startup_cpu = own_cpu_seconds();
  say(out, fmt::format("S {} {:.6f} {:.6f} {:.6f} {:.6f} {:.6f}", rank, startup_cpu, seconds_between(p.launch, begun),
                       seconds_between(p.launch, store_connected), seconds_between(p.launch, registered),
                       seconds_between(p.launch, first_answered)));

  // 2. Channels to every peer: one call to each (all at once), then until
  // every peer has dialled this one too.
  const auto barrier_timeout = std::chrono::seconds(60);
  run_blocking(ex, st->barrier("bench/mesh/started", n, barrier_timeout));
  const long rss_before = resident_bytes();
  const long heap_before = heap_in_use();
  const auto dial_start = clock_type::now();
  run_blocking(ex, [&]() -> asio::awaitable<void> {
    std::vector<future<int>> calls;
    for (int peer = 0; peer < n; ++peer)
      if (peer != rank && peer != (rank + 1) % n)
        calls.push_back(a.rpc_async<int>(peer, "add", peer, 1));
    for (auto& f : calls)
      (void)co_await f.async_get();
  }());
  const double dial_s = seconds_between(dial_start, clock_type::now());
  run_blocking(ex, st->barrier("bench/mesh/dialled", n, barrier_timeout));
  const long rss_after = resident_bytes();
  const long heap_after = heap_in_use();
  const auto dialled = run_blocking(ex, [&]() -> asio::awaitable<std::size_t> { co_return a.connected_peers(); }());

  // 3. The mesh: in_flight coroutines, the peers in turn.
  run_blocking(ex, st->barrier("bench/mesh/go", n, barrier_timeout));
  const auto mesh_start = clock_type::now();
  auto [rec, elapsed] = run_blocking(ex, [&]() -> asio::awaitable<std::pair<latency_recorder, double>> {
    std::vector<int> next(static_cast<std::size_t>(p.in_flight));
    for (int w = 0; w < p.in_flight; ++w)
      next[static_cast<std::size_t>(w)] = w % (n - 1); // spread the first calls over the peers
    auto one_call = [&](int w) -> asio::awaitable<void> {
      auto& k = next[static_cast<std::size_t>(w)];
      const int peer = (rank + 1 + k) % n;
      k = (k + 1) % (n - 1);
      if (co_await a.rpc_async<int>(peer, "add", peer, 1).async_get() != peer + 1)
        throw std::runtime_error("rpc mesh: wrong answer");
    };
    co_return co_await run_closed_loop(ex, p.in_flight, p.calls, one_call);
  }());
  const auto mesh_end =
      mesh_start + std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(elapsed));
  say(out, fmt::format("C {} {} {} {} {} {} {:.6f} {} {:.6f} {:.6f} {}", rank, rss_started, rss_before, rss_after,
                       heap_before, heap_after, dial_s, dialled, seconds_between(p.launch, mesh_start),
                       seconds_between(p.launch, mesh_end), rec.size()));
  for (int i = 0; i < quantile_points; i += values_per_line) {
    std::string line = fmt::format("Q {}", rank);
    for (int j = i; j < std::min(quantile_points, i + values_per_line); ++j)
      line += fmt::format(" {:.3f}", rec.percentile(static_cast<double>(j) / (quantile_points - 1)));
    say(out, line);
  }

  // 4. Graceful shutdown, every agent.
  const auto shutdown_start = clock_type::now();
  a.shutdown();
  say(out, fmt::format("D {} {:.6f}", rank, seconds_between(shutdown_start, clock_type::now())));
  return 0; // (the agent goes first, then the store, then the loop)
}

/// What the agents wrote, by rank.
struct mesh_report {
  struct agent_lines {
    double startup_cpu = 0, begun = 0, store_connected = 0, registered = 0, first_answered = 0;
    long rss_started = 0, rss_before = 0, rss_after = 0, heap_before = 0, heap_after = 0;
    double dial_s = 0;
    std::size_t dialled = 0;
    double mesh_start = 0, mesh_end = 0, calls = 0;
    double shutdown_s = 0;
    int seen = 0; // bit 1: S, 2: C, 4: D
  };
  std::map<int, agent_lines> agents;
  latency_recorder latency;
};

inline mesh_report parse_mesh(const std::string& text) {
  mesh_report r;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::istringstream l(line);
    std::string tag;
    int rank = -1;
    if (!(l >> tag >> rank))
      continue;
    auto& a = r.agents[rank];
    if (tag == "S" && l >> a.startup_cpu >> a.begun >> a.store_connected >> a.registered >> a.first_answered)
      a.seen |= 1;
    else if (tag == "C" && l >> a.rss_started >> a.rss_before >> a.rss_after >> a.heap_before >> a.heap_after >>
                               a.dial_s >> a.dialled >> a.mesh_start >> a.mesh_end >> a.calls)
      a.seen |= 2;
    else if (tag == "D" && l >> a.shutdown_s)
      a.seen |= 4;
    else if (tag == "Q")
      for (double us; l >> us;)
        r.latency.add_us(us);
  }
  return r;
}

inline double median_of(std::vector<double> v) {
  if (v.empty())
    return not_applicable;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

} // namespace mesh_detail

/// Runs the mesh case and reports it.
inline void mesh_agents(context& ctx) {
  using namespace mesh_detail;
  mesh_params p;
  p.agents = ctx.quick ? 16 : 64;
  p.calls = ctx.quick ? 1'000 : 10'000;
  const auto name = fmt::format("mesh_{}_agents", p.agents);
  if (ctx.status != nullptr)
    ctx.status->note(fmt::format("{} agent processes", p.agents));
  event_loop store_loop;
  store_loop.start();
  store::server_options so;
  so.auth_token = "";
  auto server = store::store_server::start(store_loop.get_executor(), so);
  p.store_port = server->local_endpoint().port();
  std::string text;
  p.launch = clock_type::now();
  try {
    text = run_forked(
        "rpc mesh", p.agents, [&p](int rank, int out) { return mesh_agent(p, rank, out); },
        std::chrono::seconds(ctx.quick ? 120 : 300));
  } catch (...) {
    server->stop();
    throw;
  }
  server->stop();
  auto rep = parse_mesh(text);
  if (static_cast<int>(rep.agents.size()) != p.agents ||
      std::any_of(rep.agents.begin(), rep.agents.end(), [](const auto& a) { return a.second.seen != 7; }))
    throw std::runtime_error(
        fmt::format("rpc mesh: {} of {} agents reported all their figures", rep.agents.size(), p.agents));

  double startup = 0, registered = 0, store_connected = 0, last_begun = 0, startup_cpu = 0;
  double mesh_start = 1e300, mesh_end = 0, calls = 0, shutdown = 0;
  std::vector<double> per_peer, heap_per_peer, growth, rss, dial, first_answered;
  bool all_dialled = true;
  const int new_peers = p.agents - 2; // the first call already met one peer each way
  for (const auto& [rank, a] : rep.agents) {
    startup = std::max(startup, a.first_answered);
    startup_cpu += a.startup_cpu;
    registered = std::max(registered, a.registered);
    store_connected = std::max(store_connected, a.store_connected);
    last_begun = std::max(last_begun, a.begun);
    mesh_start = std::min(mesh_start, a.mesh_start);
    mesh_end = std::max(mesh_end, a.mesh_end);
    calls += a.calls;
    shutdown = std::max(shutdown, a.shutdown_s);
    per_peer.push_back(static_cast<double>(a.rss_after - a.rss_before) / new_peers);
    heap_per_peer.push_back(static_cast<double>(a.heap_after - a.heap_before) / new_peers);
    growth.push_back(static_cast<double>(a.rss_after - a.rss_started));
    rss.push_back(static_cast<double>(a.rss_after));
    first_answered.push_back(a.first_answered);
    dial.push_back(a.dial_s);
    all_dialled = all_dialled && a.dialled == static_cast<std::size_t>(p.agents - 1);
  }
  if (!all_dialled)
    throw std::runtime_error("rpc mesh: an agent holds fewer channels than it has peers");
  const double mesh_s = mesh_end - mesh_start;
  record r;
  r.suite = "rpc";
  r.name = name;
  r.p50_us = rep.latency.percentile(0.5);
  r.p99_us = rep.latency.percentile(0.99);
  r.ops_per_s = calls / mesh_s;
  r.extra = {{"agents", double(p.agents)},
             {"in_flight", double(p.in_flight)},
             {"startup_s", startup},
             {"startup_median_s", median_of(first_answered)},
             {"registered_s", registered},
             {"startup_cpu_ms_per_agent", startup_cpu * 1e3 / p.agents},
             {"last_forked_s", last_begun},
             {"store_connected_s", store_connected},
             {"calls", calls},
             {"calls_per_s", calls / mesh_s},
             {"channel_bytes_per_peer", median_of(heap_per_peer)},
             {"channel_bytes_per_peer_max", *std::max_element(heap_per_peer.begin(), heap_per_peer.end())},
             {"channel_rss_bytes_per_peer", median_of(per_peer)},
             {"agent_rss_growth_bytes", median_of(growth)},
             {"agent_rss_bytes", median_of(rss)},
             {"dial_all_s_median", median_of(dial)},
             {"shutdown_s", shutdown}};
  ctx.report(std::move(r));
}

} // namespace corodist::bench
