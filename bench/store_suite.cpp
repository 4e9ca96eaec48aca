/// \file
/// Suite `store`: store_server + tcp_store over loopback. Server and clients
/// run on two event-loop threads (the raw floor's two-thread shape); the
/// memory case runs the standalone `corodist-store serve` daemon as its own
/// process and reads its resident memory.

#include "closed_loop.hpp"
#include "harness.hpp"
#include "peers.hpp"
#include "process_resources.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/file_store.hpp>
#include <corodist/store/hash_store.hpp>
#include <corodist/store/store_server.hpp>
#include <corodist/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <fmt/core.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <spawn.h>
#include <stdexcept>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace corodist::bench {
namespace {

namespace cs = corodist::store;
using clock_type = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

cs::tcp_store_options client_options(std::uint16_t port) {
  cs::tcp_store_options o;
  o.port = port;
  o.auth_token = "";
  o.timeout = std::chrono::seconds(60);
  return o;
}

struct server_and_client {
  server_and_client() {
    server_loop.start();
    client_loop.start();
    cs::server_options so;
    so.auth_token = "";
    server = cs::store_server::start(server_loop.get_executor(), so);
    port = server->local_endpoint().port();
  }
  ~server_and_client() {
    server.reset();
    client_loop.stop();
    server_loop.stop();
  }
  event_loop server_loop;
  event_loop client_loop;
  std::shared_ptr<cs::store_server> server;
  std::uint16_t port = 0;
};

/// PyTorch's TCPStore client (python3-torch 1.13) against its own master and
/// against `port` (our server), as a child process with our pinning.
peer_output torch_store_peer(context& ctx, std::uint16_t port) {
  if (!ctx.peers) return {{}, "skipped"};
  if (auto why = torch_unavailable()) return {{}, *why};
  const auto script = bench_script("torch_store_peer.py");
  if (script.empty()) return {{}, "not installed"};
  return run_peer(ctx, "PyTorch TCPStore", {"/usr/bin/python3", script, "--json", "--port", std::to_string(port),
                                             "--clients", "64", "--samples", ctx.quick ? "2000" : "20000",
                                             "--adds", ctx.quick ? "500" : "2000"},
                  std::chrono::seconds(600));
}

/// The case's peers: PyTorch's client against its own master, and against our server.
std::vector<peer_result> torch_store_peers(const peer_output& torch, const std::string& op, const char* p50_key,
                                           const char* ops_key) {
  return {peer_from("pytorch", torch, {{"master", "pytorch"}, {"op", op}}, p50_key, ops_key),
          peer_from("pytorch-client@corodist", torch, {{"master", "corodist"}, {"op", op}}, p50_key, ops_key)};
}

void single_client(context& ctx, server_and_client& env, const peer_output& torch) {
  const std::size_t samples = ctx.quick ? 10'000 : 100'000;
  const double budget_s = ctx.quick ? 3.0 : 20.0;
  auto ex = asio::any_io_executor(env.client_loop.get_executor());
  auto store = run_blocking(ex, cs::tcp_store::connect(ex, client_options(env.port)));
  struct op_case {
    const char* name;
    int which;
  };
  for (op_case oc : {op_case{"get", 0}, op_case{"set", 1}, op_case{"add", 2}, op_case{"compare_set", 3}}) {
    auto [lat, elapsed] = run_blocking(ex, [&]() -> asio::awaitable<std::pair<latency_recorder, double>> {
      co_await store->set("bench/key", "0123456789abcdef");
      auto one = [&]() -> asio::awaitable<void> {
        switch (oc.which) {
        case 0: (void)co_await store->get("bench/key"); break;
        case 1: co_await store->set("bench/key", "0123456789abcdef"); break;
        case 2: (void)co_await store->add("bench/counter", 1); break;
        default: (void)co_await store->compare_set("bench/key", "0123456789abcdef", "0123456789abcdef"); break;
        }
      };
      for (std::size_t i = 0; i < samples / 10; ++i)
        co_await one();
      latency_recorder rec(samples);
      const auto start = clock_type::now();
      for (std::size_t i = 0; i < samples; ++i) {
        const auto t0 = clock_type::now();
        co_await one();
        const auto t1 = clock_type::now();
        rec.add(t1 - t0);
        if (std::chrono::duration<double>(t1 - start).count() > budget_s)
          break;
      }
      co_return std::pair{std::move(rec), seconds_since(start)};
    }());
    auto r = latency_record("store", oc.name, lat, elapsed);
    if (oc.which != 3) // PyTorch 1.13's Python TCPStore has no compare_set
      r.peers = torch_store_peers(torch, oc.name, "p50_us", nullptr);
    if (oc.which == 1) // our set is a round trip; PyTorch 1.13's returns once sent
      for (auto& p : r.peers) {
        p.comparable = false;
        p.note = "one-way: PyTorch 1.13's set returns without a reply";
      }
    ctx.report(std::move(r));
  }
}

void concurrent_clients(context& ctx, server_and_client& env, const peer_output& torch) {
  constexpr int clients = 64;
  const std::size_t total = ctx.quick ? 200'000 : 1'000'000;
  auto ex = asio::any_io_executor(env.client_loop.get_executor());
  auto [lat, elapsed] = run_blocking(ex, [&]() -> asio::awaitable<std::pair<latency_recorder, double>> {
    std::vector<std::shared_ptr<cs::tcp_store>> stores;
    for (int i = 0; i < clients; ++i)
      stores.push_back(co_await cs::tcp_store::connect(ex, client_options(env.port)));
    auto one_add = [&stores](int c) -> asio::awaitable<void> { (void)co_await stores[c]->add("bench/agg", 1); };
    co_return co_await run_closed_loop(ex, clients, total, one_add);
  }());
  // The same shape on bare sockets, measured right after (the VM's wake-up mode drifts):
  // the most any implementation could do here.
  const auto floor = raw_fanin(clients, 64, total);
  auto r = latency_record("store", "add_64_clients", lat, elapsed);
  r.extra = {{"clients", double(clients)},
             {"ops", static_cast<double>(lat.size())},
             {"raw_fanin_ops_per_s", floor.ops_per_s},
             {"of_raw_fanin", r.ops_per_s / floor.ops_per_s}};
  r.peers = torch_store_peers(torch, "add_64_clients", nullptr, "ops_per_s");
  ctx.report(std::move(r));
}

void rendezvous_case(context& ctx, int ranks) {
  server_and_client env; // a fresh server per run
  auto ex = asio::any_io_executor(env.client_loop.get_executor());
  constexpr int max_connecting = 512; // in-flight connects, under the listen backlog
  const auto start = clock_type::now();
  run_blocking(ex, [&]() -> asio::awaitable<void> {
    std::vector<std::shared_ptr<cs::tcp_store>> stores(static_cast<std::size_t>(ranks));
    int finished = 0, connecting = 0, next = 0;
    std::exception_ptr failure;
    asio::steady_timer done(ex, clock_type::time_point::max());
    asio::steady_timer slot(ex, clock_type::time_point::max());
    auto rank_body = [&](int r) -> asio::awaitable<void> {
      try {
        auto s = co_await cs::tcp_store::connect(ex, client_options(env.port));
        --connecting;
        slot.cancel_one();
        auto n = co_await s->add("rdzv/arrived", 1);
        if (n == ranks)
          co_await s->set("rdzv/done", "1");
        std::vector<std::string> keys{"rdzv/done"};
        co_await s->wait(std::move(keys));
        stores[static_cast<std::size_t>(r)] = s;
      } catch (...) {
        failure = std::current_exception();
        done.cancel();
      }
      if (++finished == ranks)
        done.cancel();
    };
    while (next < ranks) {
      if (connecting >= max_connecting) {
        co_await slot.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
        continue;
      }
      ++connecting;
      asio::co_spawn(ex, rank_body(next++), asio::detached);
    }
    co_await done.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
    if (failure)
      std::rethrow_exception(failure);
  }());
  record r;
  r.suite = "store";
  r.name = fmt::format("rendezvous_{}_ranks", ranks);
  r.extra = {{"rendezvous_s", seconds_since(start)}, {"ranks", double(ranks)}};
  ctx.report(std::move(r));
}

std::string self_dir() {
  char buf[4096];
  auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0)
    throw std::runtime_error("cannot read /proc/self/exe");
  std::string p(buf, static_cast<std::size_t>(n));
  return p.substr(0, p.rfind('/'));
}

/// A standalone `corodist-store serve` process (no token, a port of its own),
/// killed and reaped when this goes.
struct store_daemon {
  store_daemon() {
    const std::string daemon = self_dir() + "/../tools/corodist-store";
    int out[2];
    if (::pipe(out) != 0)
      throw std::runtime_error("pipe failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    const char* argv[] = {daemon.c_str(), "--port", "0", "--auth-token", "", "serve", nullptr};
    if (posix_spawn(&pid, daemon.c_str(), &fa, nullptr, const_cast<char**>(argv), environ) != 0)
      throw std::runtime_error("cannot start " + daemon);
    posix_spawn_file_actions_destroy(&fa);
    ::close(out[1]);
    f = ::fdopen(out[0], "r");
    char line[256] = {};
    unsigned p = 0;
    if (!std::fgets(line, sizeof line, f) || std::sscanf(std::strrchr(line, ':'), ":%u", &p) != 1) {
      stop(SIGKILL);
      throw std::runtime_error("corodist-store serve did not report its port");
    }
    port = static_cast<std::uint16_t>(p);
  }
  ~store_daemon() { stop(SIGKILL); }
  store_daemon(const store_daemon&) = delete;
  store_daemon& operator=(const store_daemon&) = delete;

  /// Sends `sig` and reaps the process (once).
  void stop(int sig) {
    if (pid > 0) {
      ::kill(pid, sig);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (f) {
      std::fclose(f);
      f = nullptr;
    }
  }

  pid_t pid = -1;
  std::uint16_t port = 0;
  FILE* f = nullptr;
};

void memory_per_connection(context& ctx) {
  const int conns = ctx.quick ? 2000 : 10000;
  store_daemon server;
  const pid_t pid = server.pid;
  event_loop loop;
  loop.start();
  auto ex = asio::any_io_executor(loop.get_executor());
  auto opts = client_options(server.port);
  std::vector<std::shared_ptr<cs::tcp_store>> stores;
  long before = 0, after = 0;
  try {
    // One warm client first, so the baseline includes the server's first-use allocations.
    stores.push_back(run_blocking(ex, cs::tcp_store::connect(ex, opts)));
    run_blocking(ex, stores[0]->set("mem/warm", "1"));
    std::this_thread::sleep_for(ms(200));
    before = resident_bytes(pid);
    for (int i = 0; i < conns; i += 256) {
      auto batch = run_blocking(ex, [&]() -> asio::awaitable<std::vector<std::shared_ptr<cs::tcp_store>>> {
        std::vector<std::shared_ptr<cs::tcp_store>> made;
        for (int j = i; j < std::min(conns, i + 256); ++j) {
          auto s = co_await cs::tcp_store::connect(ex, opts);
          std::vector<std::string> keys{"mem/warm"};
          (void)co_await s->check(std::move(keys)); // fully served once
          made.push_back(std::move(s));
        }
        co_return made;
      }());
      stores.insert(stores.end(), batch.begin(), batch.end());
    }
    std::this_thread::sleep_for(ms(500));
    after = resident_bytes(pid);
  } catch (...) {
    server.stop(SIGKILL);
    throw;
  }
  stores.clear();
  loop.stop();
  server.stop(SIGTERM);
  record r;
  r.suite = "store";
  r.name = fmt::format("idle_connections_{}", conns);
  r.extra = {{"bytes_per_conn", double(after - before) / conns},
             {"connections", double(conns)},
             {"server_rss_before", double(before)},
             {"server_rss_after", double(after)}};
  ctx.report(std::move(r));
}

/// A record of how long a failure path took (p50/p99 of `rec`, in µs): an
/// error to surface, or a deadline's overrun.
record duration_record(std::string name, const latency_recorder& rec, std::vector<std::pair<std::string, double>> extra) {
  record r;
  r.suite = "store";
  r.name = std::move(name);
  r.p50_us = rec.percentile(0.5);
  r.p99_us = rec.percentile(0.99);
  r.extra = std::move(extra);
  r.extra.emplace_back("samples", static_cast<double>(rec.size()));
  r.kind = kind_error_path;
  return r;
}

/// How promptly deadline-bound operations end (the upper bounds the tests
/// leave to the benchmarks): how far past its 60 ms deadline a wait on a
/// missing key throws (tcp_store, hash_store, file_store); how far past its
/// 300 ms timeout a connect to a port nobody listens on gives up; how long a
/// wrong token takes to be refused; how long after its server is SIGKILLed a
/// pending get fails.
void deadlines(context& ctx) {
  const std::size_t samples = ctx.quick ? 5 : 20;
  using namespace std::chrono_literals;
  auto overrun = [](clock_type::time_point t0, ms deadline) { return clock_type::now() - t0 - deadline; };
  {
    server_and_client env;
    auto ex = asio::any_io_executor(env.client_loop.get_executor());
    char tmpl[] = "/tmp/corodist_bench_file_store_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    if (fd < 0)
      throw std::runtime_error("mkstemp failed");
    ::close(fd);
    std::vector<std::pair<std::string, std::shared_ptr<cs::store>>> stores{
        {"tcp", run_blocking(ex, cs::tcp_store::connect(ex, client_options(env.port)))},
        {"hash", std::make_shared<cs::hash_store>(ex)},
        {"file", std::make_shared<cs::file_store>(ex, tmpl)}};
    for (auto& [name, store] : stores) {
      latency_recorder rec(samples);
      for (std::size_t i = 0; i < samples; ++i) {
        const auto t0 = clock_type::now();
        try {
          run_blocking(ex, store->wait({"bench/absent"}, 60ms));
        } catch (const timeout_error&) {
        }
        rec.add(overrun(t0, 60ms));
      }
      ctx.report(duration_record("wait_timeout_overrun_" + name, rec, {{"deadline_ms", 60}}));
    }
    ::unlink(tmpl);
  }
  {
    event_loop loop;
    loop.start();
    auto ex = asio::any_io_executor(loop.get_executor());
    int port = 0;
    { // a port nobody listens on
      asio::io_context io;
      asio::ip::tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
      port = a.local_endpoint().port();
    }
    latency_recorder rec(samples);
    for (std::size_t i = 0; i < std::min<std::size_t>(samples, 5); ++i) {
      auto o = client_options(static_cast<std::uint16_t>(port));
      o.timeout = 300ms;
      const auto t0 = clock_type::now();
      try {
        run_blocking(ex, cs::tcp_store::connect(ex, o));
      } catch (const timeout_error&) {
      }
      rec.add(overrun(t0, 300ms));
    }
    ctx.report(duration_record("connect_timeout_overrun", rec, {{"timeout_ms", 300}}));
  }
  {
    event_loop server_loop, loop;
    server_loop.start();
    loop.start();
    cs::server_options so;
    so.auth_token = "s3cret";
    auto server = cs::store_server::start(server_loop.get_executor(), so);
    auto ex = asio::any_io_executor(loop.get_executor());
    latency_recorder rec(samples);
    for (std::size_t i = 0; i < samples; ++i) {
      auto o = client_options(server->local_endpoint().port());
      o.auth_token = "wrong";
      const auto t0 = clock_type::now();
      try {
        run_blocking(ex, cs::tcp_store::connect(ex, o));
      } catch (const protocol_error&) {
      }
      rec.add(clock_type::now() - t0);
    }
    ctx.report(duration_record("auth_refusal", rec, {}));
    server.reset();
  }
  {
    event_loop loop;
    loop.start();
    auto ex = asio::any_io_executor(loop.get_executor());
    latency_recorder rec(samples);
    for (std::size_t i = 0; i < std::min<std::size_t>(samples, 5); ++i) {
      store_daemon daemon;
      auto s = run_blocking(ex, cs::tcp_store::connect(ex, client_options(daemon.port)));
      auto pending = asio::co_spawn(ex, s->get("bench/never", std::chrono::seconds(30)), asio::use_future);
      (void)run_blocking(ex, s->num_keys()); // answered in order: the get waits at the server
      const auto t0 = clock_type::now();
      ::kill(daemon.pid, SIGKILL);
      try {
        pending.get();
      } catch (const connection_error&) {
      }
      rec.add(clock_type::now() - t0);
      daemon.stop(SIGKILL);
    }
    ctx.report(duration_record("server_death_to_error", rec, {}));
  }
}

void run_store_suite(context& ctx) {
  raise_fd_limit();
  {
    server_and_client env;
    const auto torch = torch_store_peer(ctx, env.port); // same run, same pinning, our server on env's loop
    single_client(ctx, env, torch);
    concurrent_clients(ctx, env, torch);
  }
  rendezvous_case(ctx, 1024);
  rendezvous_case(ctx, 4096);
  memory_per_connection(ctx);
  deadlines(ctx);
}

const suite_registrar registrar("store", &run_store_suite, 30, 14);

} // namespace
} // namespace corodist::bench
