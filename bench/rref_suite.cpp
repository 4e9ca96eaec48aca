/// \file
/// Suite `rref`: three RRef-enabled rpc::agents in this process (w0, w1, w2),
/// each on an event-loop thread of its own, over loopback; they meet in a
/// hash_store on a fourth, idle loop. w0 is the caller; w1 owns the values.
///   * remote_to_here: `remote<int>(w1, "make", 1).to_here().get()` from a plain thread;
///   * to_here_cached: a second to_here of a confirmed RRef;
///   * fork_user_to_user: w0 passes an RRef owned by w1 to w2, whose function reads it;
///   * remote_x64: 64 coroutines on w0's loop, each with one remote + to_here in flight;
///   * memory_per_rref: heap bytes (malloc's own count) per live RRef of an
///     8-byte value: 100,000 OwnerRRefs made locally (owner side; less the
///     same number of bare values, its protocol state), then 100,000 remote()
///     RRefs (owner and user side together; less the owner's, the user side).
/// PyTorch's remote + to_here (bench/torch_rpc_peer.py) is the peer of remote_to_here.

#include "closed_loop.hpp"
#include "harness.hpp"
#include "peers.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/rref/enable.hpp>
#include <corodist/rref/debug_info.hpp>
#include <corodist/rref/remote.hpp>
#include <corodist/store/hash_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/use_future.hpp>

#include <malloc.h>

#include <algorithm>
#include <future>
#include <stdexcept>
#include <thread>

namespace corodist::bench {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr int pipeline_depth = 64;
constexpr auto case_timeout = std::chrono::seconds(120);

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

class rref_cluster {
public:
  static constexpr int size = 3;

  rref_cluster() {
    store_loop_.start();
    auto store = std::make_shared<store::hash_store>(store_loop_.get_executor());
    for (int r = 0; r < size; ++r) {
      loops_[r].start();
      rpc::agent_options o;
      o.name = "w" + std::to_string(r);
      o.rank = r;
      o.world_size = size;
      o.store = store;
      o.auth_token = "";
      o.rpc_timeout = std::chrono::seconds(60);
      agents_[r] = std::make_unique<rpc::agent>(loops_[r], o);
      rref::enable(*agents_[r]);
      agents_[r]->register_function("make", [](int v) -> asio::awaitable<int> { co_return v; });
      agents_[r]->register_function("read", [](rref::rref<int> r) -> asio::awaitable<int> {
        co_return co_await r.to_here().async_get();
      });
    }
    each([](rpc::agent& a) { a.start(); });
  }
  ~rref_cluster() {
    each([](rpc::agent& a) { a.shutdown(); });
  }

  rpc::agent& operator[](int r) { return *agents_[r]; }

  /// Runs `make(executor)` on w0's loop and waits (bounded) for its result.
  template <typename F>
  auto run_on_caller(F make) {
    auto fut = asio::co_spawn(loops_[0].get_executor(), make(asio::any_io_executor(loops_[0].get_executor())),
                              asio::use_future);
    if (fut.wait_for(case_timeout) != std::future_status::ready)
      throw std::runtime_error("rref benchmark case timed out");
    return fut.get();
  }

private:
  template <typename F>
  void each(F f) {
    std::vector<std::thread> ts;
    for (int r = 1; r < size; ++r)
      ts.emplace_back([&, r] { f(*agents_[r]); });
    f(*agents_[0]);
    for (auto& t : ts)
      t.join();
  }

  event_loop store_loop_;
  event_loop loops_[size];
  std::unique_ptr<rpc::agent> agents_[size];
};

/// Times `op()` from this (plain) thread: a warm-up, then up to `samples` or the time budget.
template <typename Op>
record time_sync(context& ctx, const char* name, std::size_t quick_samples, std::size_t full_samples, Op op) {
  const std::size_t samples = ctx.quick ? quick_samples : full_samples;
  const double budget_s = ctx.quick ? 4.0 : 20.0;
  for (std::size_t i = 0; i < std::max<std::size_t>(samples / 10, 10); ++i)
    op();
  latency_recorder rec(samples);
  const auto start = clock_type::now();
  for (std::size_t i = 0; i < samples; ++i) {
    const auto t0 = clock_type::now();
    op();
    const auto t1 = clock_type::now();
    rec.add(t1 - t0);
    if (std::chrono::duration<double>(t1 - start).count() > budget_s)
      break;
  }
  const double elapsed = seconds_since(start);
  auto r = latency_record("rref", name, rec, elapsed);
  r.extra = {{"samples", static_cast<double>(rec.size())}, {"ops_per_s", static_cast<double>(rec.size()) / elapsed}};
  return r;
}

void check(bool ok, const char* what) {
  if (!ok)
    throw std::runtime_error(std::string("rref suite: wrong result in ") + what);
}

std::size_t heap_bytes() { return mallinfo2().uordblks; }

// Waits until the protocol on w0 and w1 holds exactly `owners`/`users` (deletes are asynchronous).
void settle(rref_cluster& c) {
  for (int i = 0; i < 2000; ++i) {
    const auto a = rref::info(c[0]), b = rref::info(c[1]);
    if (a.unacked + b.unacked + a.pending_users + b.pending_users + a.pending_children == 0)
      return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void memory_per_rref(context& ctx, rref_cluster& c) {
  const std::size_t n = ctx.quick ? 20'000 : 100'000;
  std::vector<rref::rref<std::int64_t>> held;
  held.reserve(n);
  settle(c);
  const auto before_owned = heap_bytes();
  for (std::size_t i = 0; i < n; ++i)
    held.push_back(rref::make_rref(c[0], static_cast<std::int64_t>(i)));
  settle(c);
  check(rref::info(c[0]).owners >= n, "memory_per_rref (owners)");
  const double owner_bytes = static_cast<double>(heap_bytes() - before_owned) / static_cast<double>(n);
  held.clear();
  settle(c);
  // The value alone, as an OwnerRRef holds it (its slot and the typed object):
  // what the owner holds beyond it is protocol state.
  double value_bytes = 0;
  {
    std::vector<std::shared_ptr<rref::detail::value_slot>> values;
    values.reserve(n);
    const auto before_values = heap_bytes();
    for (std::size_t i = 0; i < n; ++i)
      values.push_back(rref::detail::value_slot::of(static_cast<std::int64_t>(i)));
    value_bytes = static_cast<double>(heap_bytes() - before_values) / static_cast<double>(n);
  }
  std::vector<rref::rref<int>> remote;
  remote.reserve(n);
  const auto before_remote = heap_bytes();
  for (std::size_t i = 0; i < n; ++i) {
    remote.push_back(rref::remote<int>(c[0], "w1", "make", static_cast<int>(i)));
    if (i % 1000 == 999) // within the connection's cap on pending requests
      check(remote.back().to_here().get() == static_cast<int>(i), "memory_per_rref (remote)");
  }
  check(remote.back().to_here().get() == static_cast<int>(n - 1), "memory_per_rref (remote)");
  settle(c);
  const double both = static_cast<double>(heap_bytes() - before_remote) / static_cast<double>(n);
  remote.clear();
  settle(c);
  record r;
  r.suite = "rref";
  r.name = "memory_per_rref";
  r.extra = {{"rrefs", static_cast<double>(n)},
             {"owner_bytes_per_rref", owner_bytes},
             {"owner_value_bytes_per_rref", value_bytes},
             {"owner_protocol_bytes_per_rref", owner_bytes - value_bytes},
             {"user_bytes_per_rref", both - owner_bytes},
             {"owner_and_user_bytes_per_remote_rref", both}};
  ctx.report(std::move(r));
}

void run_rref_suite(context& ctx) {
  const auto torch = torch_rpc_peer(ctx);
  rref_cluster c;
  auto& a = c[0];

  auto r = time_sync(ctx, "remote_to_here", 5'000, 30'000,
                     [&] { check(rref::remote<int>(a, "w1", "make", 7).to_here().get() == 7, "remote_to_here"); });
  r.peers = {peer_from("pytorch", torch, {{"op", "remote_to_here"}}, "p50_us")};
  ctx.report(std::move(r));

  auto held = rref::remote<int>(a, "w1", "make", 8);
  check(held.to_here().get() == 8, "to_here_cached (first)");
  ctx.report(time_sync(ctx, "to_here_cached", 5'000, 30'000,
                       [&] { check(held.to_here().get() == 8, "to_here_cached"); }));

  ctx.report(time_sync(ctx, "fork_user_to_user", 3'000, 20'000,
                       [&] { check(a.rpc_sync<int>("w2", "read", held) == 8, "fork_user_to_user"); }));

  {
    const std::size_t total = ctx.quick ? 50'000 : 300'000;
    auto [rec, elapsed] = c.run_on_caller([&](asio::any_io_executor ex) {
      auto one = [&a](int) -> asio::awaitable<void> {
        (void)co_await rref::remote<int>(a, "w1", "make", 1).to_here().async_get();
      };
      return run_closed_loop(ex, pipeline_depth, total, one);
    });
    auto x = latency_record("rref", "remote_x64", rec, elapsed);
    x.extra = {{"in_flight", double(pipeline_depth)},
               {"rrefs", static_cast<double>(rec.size())},
               {"rrefs_per_s", static_cast<double>(rec.size()) / elapsed}};
    ctx.report(std::move(x));
  }
  memory_per_rref(ctx, c);
}

const suite_registrar registrar("rref", &run_rref_suite, 42, 5);

} // namespace
} // namespace corodist::bench
