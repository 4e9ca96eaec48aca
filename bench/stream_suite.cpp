/// \file
/// Suite `stream`: one server stream between the rpc suite's two agents
/// (agent_pair: each on an event-loop thread of its own, over loopback), read
/// by a coroutine on the client's loop:
///   stream_64B            items/s of 64 B items (msgpack strings)
///   stream_64KiB          items/s and GB/s of 64 KiB strings (encoded: one copy)
///   stream_64KiB_attachment  the same as zero-copy attachments
///   stream_latency_64B    p50/p99 from the handler's write to the client's
///                         read, items written 50 µs apart
/// against gRPC C++ server streaming (a callback ServerWriteReactor, read with
/// a blocking ClientReader; the better of plain writes and writes with
/// buffer_hint) in the same run.

#include "agent_pair.hpp"
#include "harness.hpp"
#include "peers.hpp"

#include <corodist/rpc/agent.hpp>

#include <stdexcept>
#include <string>

namespace corodist::bench {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr std::uint64_t small = 64;
constexpr std::uint64_t big = 64 * 1024;
constexpr std::uint64_t interval_us = 50;

struct sizes {
  std::uint64_t items, big_items, latency_items;
};
sizes sizes_of(const context& ctx) {
  return ctx.quick ? sizes{200'000, 5'000, 5'000} : sizes{1'000'000, 20'000, 20'000};
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// Reads one stream of `n` items of `bytes` from `fn`; returns the seconds from the open to the end.
template <typename T>
double read_stream(agent_pair& pair, const char* fn, std::uint64_t n, std::uint64_t bytes) {
  auto& a = pair.client();
  return pair.run_on_client([&](asio::any_io_executor) -> asio::awaitable<double> {
    const auto t0 = clock_type::now();
    auto r = a.open_stream<T>(corodist::timeout::never(), "server", fn, n, bytes);
    std::uint64_t got = 0;
    while (auto v = co_await r.next()) {
      if (v->size() != bytes)
        throw std::runtime_error("stream item size mismatch");
      ++got;
    }
    if (got != n)
      throw std::runtime_error("stream ended after " + std::to_string(got) + " items");
    co_return seconds_since(t0);
  });
}

template <typename T>
void rate_case(context& ctx, agent_pair& pair, const char* name, const char* fn, std::uint64_t n,
               std::uint64_t bytes, std::vector<peer_result> peers) {
  read_stream<T>(pair, fn, std::max<std::uint64_t>(n / 10, 100), bytes); // warm-up
  const double elapsed = read_stream<T>(pair, fn, n, bytes);
  record r;
  r.suite = "stream";
  r.name = name;
  r.ops_per_s = static_cast<double>(n) / elapsed;
  if (bytes >= 4096)
    r.gbytes_per_s = static_cast<double>(n * bytes) / elapsed / 1e9;
  r.extra = {{"items", static_cast<double>(n)}, {"item_bytes", static_cast<double>(bytes)},
             {"items_per_s", static_cast<double>(n) / elapsed}};
  r.peers = std::move(peers);
  ctx.report(std::move(r));
}

void latency_case(context& ctx, agent_pair& pair, std::uint64_t n, std::vector<peer_result> peers) {
  auto& a = pair.client();
  auto [rec, elapsed] =
      pair.run_on_client([&](asio::any_io_executor) -> asio::awaitable<std::pair<latency_recorder, double>> {
        latency_recorder rec(n);
        const auto t0 = clock_type::now();
        auto r = a.open_stream<stamped_item>(corodist::timeout::never(), "server", "paced", n, small,
                                             interval_us * 1000);
        while (auto v = co_await r.next())
          rec.add(std::chrono::nanoseconds(steady_ns() - v->sent_ns));
        co_return std::pair{std::move(rec), seconds_since(t0)};
      });
  if (rec.size() != n)
    throw std::runtime_error("paced stream ended after " + std::to_string(rec.size()) + " items");
  auto r = latency_record("stream", "stream_latency_64B", rec, elapsed);
  r.extra = {{"samples", static_cast<double>(rec.size())}, {"interval_us", static_cast<double>(interval_us)}};
  r.peers = std::move(peers);
  ctx.report(std::move(r));
}

void run_stream_suite(context& ctx) {
  const auto sz = sizes_of(ctx);
  const auto grpc = grpc_cpp_peer(ctx, {"--cases", "streams", "--stream-items", std::to_string(sz.items),
                                        "--stream-big-items", std::to_string(sz.big_items), "--latency-items",
                                        std::to_string(sz.latency_items), "--interval-us", std::to_string(interval_us)});
  auto grpc_of = [&](const char* op, const char* p50, const char* ops) {
    return peer_from("grpc", grpc, {{"op", op}}, p50, ops);
  };
  agent_pair pair;
  rate_case<std::string>(ctx, pair, "stream_64B", "items", sz.items, small,
                         {grpc_of("stream_64B", nullptr, "items_per_s")});
  rate_case<std::string>(ctx, pair, "stream_64KiB", "items", sz.big_items, big,
                         {grpc_of("stream_64KiB", nullptr, "items_per_s")});
  rate_case<rpc::attachment>(ctx, pair, "stream_64KiB_attachment", "attachments", sz.big_items, big,
                             {grpc_of("stream_64KiB", nullptr, "items_per_s")});
  latency_case(ctx, pair, sz.latency_items, {grpc_of("stream_latency_64B", "p50_us", nullptr)});
}

const suite_registrar registrar("stream", &run_stream_suite, 41, 4);

} // namespace
} // namespace corodist::bench
