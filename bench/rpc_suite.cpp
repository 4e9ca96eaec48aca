/// \file
/// Suite `rpc`: two rpc::agents in this process ("client" w0 and "server" w1),
/// each on an event-loop thread of its own, over loopback; the store they
/// meet in (a hash_store) sits on a third, idle loop. rpc_sync cases call from
/// the benchmark's own (plain) thread, as a user's rpc_sync would.
/// `mesh_64_agents` (`mesh_16_agents` with --quick), run first, is a job of
/// 64 agents as processes, each calling every other: see rpc_mesh.hpp.

#include "bench_config.hpp" // CORODIST_BENCH_GRPC: whether the build found gRPC C++
#include "agent_pair.hpp"
#include "closed_loop.hpp"
#include "harness.hpp"
#include "peers.hpp"
#include "rpc_mesh.hpp"

#include <corodist/core/event_loop.hpp>
#include <corodist/rpc/agent.hpp>
#include <corodist/store/hash_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <functional>
#include <future>
#include <stdexcept>
#include <thread>

#include <stdlib.h>

namespace corodist::bench {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr int pipeline_depth = 64;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

struct sync_case {
  const char* name;
  std::size_t bytes; // 0: no argument
  std::size_t quick_samples;
  std::size_t full_samples;
};

// One rpc_sync of the case's shape: no argument, a msgpack string, or (1 MiB)
// a zero-copy attachment.
void one_sync(rpc::agent& a, const sync_case& sc, const std::string& text, const rpc::attachment& blob,
              const char* fn) {
  if (sc.bytes == 0) {
    a.rpc_sync<void>("server", fn);
  } else if (sc.bytes < (1u << 20)) {
    if (a.rpc_sync<std::size_t>("server", "size_of", text) != sc.bytes)
      throw std::runtime_error("size mismatch");
  } else {
    if (a.rpc_sync<std::size_t>("server", "att_size", blob) != sc.bytes)
      throw std::runtime_error("size mismatch");
  }
}

// Returns the p50 in µs.
// `amend` may add to the record before it is reported.
double sync_latency(context& ctx, agent_pair& pair, const sync_case& sc, const char* fn = "noop",
                    std::vector<peer_result> peers = {}, const std::function<void(record&)>& amend = {}) {
  const std::size_t samples = ctx.quick ? sc.quick_samples : sc.full_samples;
  const double budget_s = ctx.quick ? 4.0 : 30.0;
  const std::string text(sc.bytes, 'x');
  const rpc::attachment blob(std::vector<std::byte>(sc.bytes));
  auto& a = pair.client();
  for (std::size_t i = 0; i < std::max<std::size_t>(samples / 10, 10); ++i)
    one_sync(a, sc, text, blob, fn);
  latency_recorder rec(samples);
  const auto start = clock_type::now();
  for (std::size_t i = 0; i < samples; ++i) {
    const auto t0 = clock_type::now();
    one_sync(a, sc, text, blob, fn);
    const auto t1 = clock_type::now();
    rec.add(t1 - t0);
    if (std::chrono::duration<double>(t1 - start).count() > budget_s)
      break;
  }
  const double elapsed = seconds_since(start);
  auto r = latency_record("rpc", sc.name, rec, elapsed);
  if (sc.bytes >= 4096)
    r.gbytes_per_s = static_cast<double>(sc.bytes) * static_cast<double>(rec.size()) / elapsed / 1e9;
  r.extra = {{"argument_bytes", static_cast<double>(sc.bytes)},
             {"samples", static_cast<double>(rec.size())},
             {"calls_per_s", static_cast<double>(rec.size()) / elapsed}};
  r.peers = std::move(peers);
  if (amend)
    amend(r);
  const double p50 = r.p50_us;
  ctx.report(std::move(r));
  return p50;
}

// call<void> from a coroutine on the client's loop: no caller thread to wake.
void coroutine_latency(context& ctx, agent_pair& pair) {
  const std::size_t samples = ctx.quick ? 20'000 : 200'000;
  const double budget_s = ctx.quick ? 4.0 : 30.0;
  auto& a = pair.client();
  auto [rec, elapsed] = pair.run_on_client([&](asio::any_io_executor) -> asio::awaitable<std::pair<latency_recorder, double>> {
    for (std::size_t i = 0; i < samples / 10; ++i)
      co_await a.call<void>("server", "noop");
    latency_recorder rec(samples);
    const auto start = clock_type::now();
    for (std::size_t i = 0; i < samples; ++i) {
      const auto t0 = clock_type::now();
      co_await a.call<void>("server", "noop");
      const auto t1 = clock_type::now();
      rec.add(t1 - t0);
      if (std::chrono::duration<double>(t1 - start).count() > budget_s)
        break;
    }
    co_return std::pair{std::move(rec), seconds_since(start)};
  });
  auto r = latency_record("rpc", "call_empty_coroutine", rec, elapsed);
  r.extra = {{"samples", static_cast<double>(rec.size())}, {"calls_per_s", static_cast<double>(rec.size()) / elapsed}};
  ctx.report(std::move(r));
}

// From future::cancel() on the client (a plain thread) to the server's
// coroutine function seeing its wait end cancelled (both agents in this
// process: one clock). Issue target: p50 at most 2 x rpc_sync_empty's.
void cancel_latency(context& ctx, agent_pair& pair) {
  const std::size_t samples = ctx.quick ? 2'000 : 20'000;
  const double budget_s = ctx.quick ? 4.0 : 30.0;
  auto& a = pair.client();
  auto& probe = cancel_probe();
  auto one = [&]() -> clock_type::duration {
    probe.waiting.store(false);
    probe.observed_ns.store(0);
    auto f = a.rpc_async<void>("server", "cancel_probe");
    while (!probe.waiting.load(std::memory_order_acquire))
      std::this_thread::yield();
    const auto t0 = clock_type::now();
    f.cancel();
    std::int64_t seen = 0;
    while ((seen = probe.observed_ns.load(std::memory_order_acquire)) == 0)
      std::this_thread::yield();
    f.wait(); // (cancelled_error)
    return clock_type::duration(seen) - t0.time_since_epoch();
  };
  for (std::size_t i = 0; i < std::max<std::size_t>(samples / 10, 10); ++i)
    one();
  latency_recorder rec(samples);
  const auto start = clock_type::now();
  for (std::size_t i = 0; i < samples; ++i) {
    rec.add(one());
    if (seconds_since(start) > budget_s)
      break;
  }
  auto r = latency_record("rpc", "cancel_to_callee", rec, seconds_since(start));
  r.extra = {{"samples", static_cast<double>(rec.size())}};
  ctx.report(std::move(r));
}

// 64 coroutines on the client loop, each keeping one rpc_async call in flight.
void async_throughput(context& ctx, agent_pair& pair, std::vector<peer_result> peers) {
  const std::size_t total = ctx.quick ? 200'000 : 1'000'000;
  auto& a = pair.client();
  auto [rec, elapsed] = pair.run_on_client([&](asio::any_io_executor ex) {
    auto one_call = [&a](int) -> asio::awaitable<void> { (void)co_await a.rpc_async<int>("server", "add", 1, 2).async_get(); };
    return run_closed_loop(ex, pipeline_depth, total, one_call);
  });
  auto r = latency_record("rpc", "rpc_async_x64", rec, elapsed);
  r.extra = {{"in_flight", double(pipeline_depth)},
             {"calls", static_cast<double>(rec.size())},
             {"calls_per_s", static_cast<double>(rec.size()) / elapsed}};
  r.peers = std::move(peers);
  ctx.report(std::move(r));
}

// 64 MiB out and back as an attachment (zero-copy on send, one copy out of
// the socket on receive); GB/s counts both directions.
constexpr std::size_t echo_bytes = std::size_t{64} << 20;

// Returns the GB/s; `amend` may add to the record before it is reported.
double echo_64MiB(context& ctx, agent_pair& pair, std::vector<peer_result> peers, const char* name = "echo_64MiB",
                  const std::function<void(record&)>& amend = {}) {
  const std::size_t bytes = echo_bytes;
  const int rounds = ctx.quick ? 3 : 10;
  auto data = std::make_shared<std::vector<std::byte>>(bytes, std::byte{7});
  const rpc::attachment blob(data, std::span<const std::byte>(*data));
  auto& a = pair.client();
  if (a.rpc_sync<rpc::attachment>("server", "echo", blob).size() != bytes) // warm-up
    throw std::runtime_error("echo size mismatch");
  latency_recorder rec(static_cast<std::size_t>(rounds));
  const auto start = clock_type::now();
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = clock_type::now();
    auto back = a.rpc_sync<rpc::attachment>("server", "echo", blob);
    rec.add(clock_type::now() - t0);
    if (back.size() != bytes)
      throw std::runtime_error("echo size mismatch");
  }
  const double elapsed = seconds_since(start);
  auto r = latency_record("rpc", name, rec, elapsed);
  // From the median round trip: 2 x 64 MiB moved.
  r.gbytes_per_s = 2.0 * static_cast<double>(bytes) / (rec.percentile(0.5) * 1e-6) / 1e9;
  r.extra = {{"bytes", static_cast<double>(bytes)}, {"rounds", static_cast<double>(rounds)}};
  r.peers = std::move(peers);
  if (amend)
    amend(r);
  const double gbs = r.gbytes_per_s;
  ctx.report(std::move(r));
  return gbs;
}

} // namespace

// ---- peers: measured in this run, as child processes with our pinning ----

peer_output torch_rpc_peer(context& ctx) {
  if (!ctx.peers) return {{}, "skipped"};
  if (auto why = torch_unavailable()) return {{}, *why};
  const auto script = bench_script("torch_rpc_peer.py");
  const auto launcher = built_program("tools/corodist-run");
  if (script.empty() || launcher.empty()) return {{}, "not installed"};
  return run_peer(ctx, "PyTorch RPC",
                  {launcher, "--nproc", "2", "--", "/usr/bin/python3", script, "--samples", ctx.quick ? "2000" : "10000",
                   "--calls", ctx.quick ? "20000" : "100000", "--depth", std::to_string(pipeline_depth)},
                  std::chrono::seconds(600));
}

peer_output grpc_cpp_peer(context& ctx, const std::vector<std::string>& args) {
  if (!ctx.peers) return {{}, "skipped"};
  const auto program = built_program("bench/corodist-grpc-peer");
  if (program.empty()) {
#if CORODIST_BENCH_GRPC
    throw std::runtime_error("peer gRPC C++: the build found gRPC but bench/corodist-grpc-peer is not built "
                             "(ninja -C BUILD benchmarks builds it)");
#else
    // What bench/meson.build looks for: installed after this build was configured?
    if (command_succeeds({"/bin/sh", "-c",
                          "pkg-config --exists grpc++ protobuf && command -v protoc && command -v grpc_cpp_plugin"}))
      throw std::runtime_error("peer gRPC C++: gRPC C++ is installed but this build was configured before it was, "
                               "so bench/corodist-grpc-peer was not built (meson setup --reconfigure BUILD, then "
                               "ninja -C BUILD benchmarks)");
    return {{}, "not installed"};
#endif
  }
  std::vector<std::string> argv{program};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_peer(ctx, "gRPC C++", argv, std::chrono::seconds(600));
}

namespace {

/// gRPC C++'s unary cases: sync unary 64 B, 64 in flight, echo.
peer_output grpc_peer(context& ctx) {
  return grpc_cpp_peer(ctx, {"--cases", "unary", "--samples", ctx.quick ? "20000" : "100000", "--calls",
                             ctx.quick ? "100000" : "500000", "--echo-bytes", std::to_string(echo_bytes), "--rounds",
                             ctx.quick ? "3" : "10"});
}

void run_rpc_suite(context& ctx) {
  const auto torch = torch_rpc_peer(ctx);
  const auto grpc = grpc_peer(ctx);
  auto torch_peer = [&](const char* op, const char* p50, const char* ops) {
    return peer_from("pytorch", torch, {{"op", op}}, p50, ops);
  };
  auto grpc_peer_of = [&](const char* op, const char* p50, const char* ops, const char* gbytes) {
    return peer_from("grpc", grpc, {{"op", op}}, p50, ops, gbytes);
  };
  mesh_agents(ctx); // forked while no agent of this process is alive
  agent_pair pair;
  static const sync_case cases[] = {
      {"rpc_sync_empty", 0, 20'000, 200'000},
      {"rpc_sync_64B", 64, 20'000, 100'000},
      {"rpc_sync_4KiB", 4096, 10'000, 50'000},
      {"rpc_sync_1MiB", 1 << 20, 300, 2'000},
  };
  for (const auto& sc : cases) {
    std::vector<peer_result> peers;
    if (sc.name == std::string_view("rpc_sync_empty"))
      peers = {torch_peer("rpc_sync_empty", "p50_us", nullptr), grpc_peer_of("sync_unary_64B", "p50_us", nullptr, nullptr)};
    else if (sc.name == std::string_view("rpc_sync_64B"))
      peers = {grpc_peer_of("sync_unary_64B", "p50_us", nullptr, nullptr)};
    sync_latency(ctx, pair, sc, "noop", std::move(peers));
  }
  sync_latency(ctx, pair, sync_case{"rpc_sync_empty_plain_fn", 0, 20'000, 100'000}, "plain_noop");
  {
    // The same empty call with the caller polling for its reply (sync_spin).
    agent_pair spinning(std::chrono::microseconds(100));
    sync_latency(ctx, spinning, sync_case{"rpc_sync_empty_spin100us", 0, 20'000, 200'000});
  }
  coroutine_latency(ctx, pair);
  cancel_latency(ctx, pair);
  async_throughput(ctx, pair,
                   {torch_peer("rpc_async_x64", nullptr, "ops_per_s"), grpc_peer_of("async_x64", nullptr, "ops_per_s", nullptr)});
  echo_64MiB(ctx, pair, {grpc_peer_of("echo", nullptr, nullptr, "gbytes_per_s")});
}

const suite_registrar registrar("rpc", &run_rpc_suite, 40, 10);

// ---- suite `tls`: what TLS costs corodist's RPC and gRPC C++, same run ----

/// The certificates of scripts/make_test_certs.sh (openssl CLI) in a fresh
/// temporary directory, removed with it.
struct bench_certs {
  bench_certs() {
    char name[] = "/tmp/corodist_bench_tls_XXXXXX";
    if (::mkdtemp(name) == nullptr)
      throw std::runtime_error("tls suite: mkdtemp failed");
    dir = name;
    if (!command_succeeds({"bash", CORODIST_BENCH_SOURCE_DIR "/../scripts/make_test_certs.sh", dir}))
      throw std::runtime_error("tls suite: scripts/make_test_certs.sh failed (is the openssl command-line tool installed?)");
  }
  ~bench_certs() { remove_tree(dir); }
  bench_certs(const bench_certs&) = delete;
  bench_certs& operator=(const bench_certs&) = delete;
  std::string dir;
};

peer_output grpc_tls_peer(context& ctx, const std::string& tls_dir) {
  if (!ctx.peers) return {{}, "skipped"};
  const auto program = built_program("bench/corodist-grpc-peer");
  if (program.empty()) return {{}, "not installed"};
  std::vector<std::string> argv{program, "--samples", ctx.quick ? "20000" : "100000", "--echo-bytes",
                                std::to_string(echo_bytes), "--rounds", ctx.quick ? "3" : "10", "--no-async", "--cases", "unary"};
  if (!tls_dir.empty()) {
    argv.push_back("--tls-dir");
    argv.push_back(tls_dir);
  }
  return run_peer(ctx, tls_dir.empty() ? "gRPC C++" : "gRPC C++ with TLS", argv, std::chrono::seconds(600));
}

// rpc_sync_empty and echo_64MiB, plain and over mutual TLS (TLS 1.3, the
// certificates of make_test_certs.sh), each against gRPC C++ likewise (a
// secure channel with the same certificates). The TLS rows carry the cost
// of TLS to each: tls_cost = TLS figure / plain figure (time: p50; echo:
// plain GB/s over TLS GB/s), for corodist and for gRPC.
void run_tls_suite(context& ctx) {
  bench_certs certs;
  const auto grpc_plain = grpc_tls_peer(ctx, "");
  const auto grpc_tls = grpc_tls_peer(ctx, certs.dir);
  auto figure = [](const peer_output& o, const char* op, const char* key) {
    const auto* l = o.find({{"op", op}});
    return l ? l->number(key) : not_applicable;
  };
  const double g_sync_plain = figure(grpc_plain, "sync_unary_64B", "p50_us");
  const double g_sync_tls = figure(grpc_tls, "sync_unary_64B", "p50_us");
  const double g_echo_plain = figure(grpc_plain, "echo", "gbytes_per_s");
  const double g_echo_tls = figure(grpc_tls, "echo", "gbytes_per_s");
  net::tls_options t;
  t.certificate_chain_file = certs.dir + "/client.pem"; // (its SAN: 127.0.0.1, where the agents listen)
  t.private_key_file = certs.dir + "/client.key";
  t.ca_file = certs.dir + "/ca.pem";
  t.require_client_certificate = true;
  const sync_case plain_case{"rpc_sync_empty_plain", 0, 20'000, 200'000};
  const sync_case tls_case{"rpc_sync_empty_tls", 0, 20'000, 200'000};
  double plain_p50 = not_applicable, plain_gbs = not_applicable;
  {
    agent_pair plain;
    plain_p50 = sync_latency(ctx, plain, plain_case, "noop",
                             {peer_from("grpc", grpc_plain, {{"op", "sync_unary_64B"}}, "p50_us")});
    plain_gbs = echo_64MiB(ctx, plain, {peer_from("grpc", grpc_plain, {{"op", "echo"}}, nullptr, nullptr, "gbytes_per_s")},
                           "echo_64MiB_plain");
  }
  agent_pair secure(std::chrono::microseconds{}, t);
  sync_latency(ctx, secure, tls_case, "noop", {peer_from("grpc", grpc_tls, {{"op", "sync_unary_64B"}}, "p50_us")},
               [&](record& r) {
                 r.extra.insert(r.extra.end(), {{"plain_p50_us", plain_p50},
                                                {"tls_cost", r.p50_us / plain_p50},
                                                {"grpc_plain_p50_us", g_sync_plain},
                                                {"grpc_tls_p50_us", g_sync_tls},
                                                {"grpc_tls_cost", g_sync_tls / g_sync_plain}});
                 r.text.emplace_back("tls_costs", fmt::format("TLS costs corodist x{:.2f} ({:.1f} -> {:.1f} us), gRPC x{:.2f} "
                                                              "({:.1f} -> {:.1f} us)",
                                                              r.p50_us / plain_p50, plain_p50, r.p50_us,
                                                              g_sync_tls / g_sync_plain, g_sync_plain, g_sync_tls));
               });
  echo_64MiB(ctx, secure, {peer_from("grpc", grpc_tls, {{"op", "echo"}}, nullptr, nullptr, "gbytes_per_s")},
             "echo_64MiB_tls", [&](record& r) {
               r.extra.insert(r.extra.end(), {{"plain_gbytes_per_s", plain_gbs},
                                              {"tls_cost", plain_gbs / r.gbytes_per_s},
                                              {"grpc_plain_gbytes_per_s", g_echo_plain},
                                              {"grpc_tls_gbytes_per_s", g_echo_tls},
                                              {"grpc_tls_cost", g_echo_plain / g_echo_tls}});
               r.text.emplace_back("tls_costs", fmt::format("TLS costs corodist x{:.2f} ({:.2f} -> {:.2f} GB/s), gRPC "
                                                            "x{:.2f} ({:.2f} -> {:.2f} GB/s)",
                                                            plain_gbs / r.gbytes_per_s, plain_gbs, r.gbytes_per_s,
                                                            g_echo_plain / g_echo_tls, g_echo_plain, g_echo_tls));
             });
}

const suite_registrar tls_registrar("tls", &run_tls_suite, 41, 4);

} // namespace
} // namespace corodist::bench
