/// \file
/// Suite `observability`: what the flight recorder costs on the hot paths.
/// The three cases the recorder must not slow down — rpc_sync_empty,
/// rpc_async_x64 (on the rpc suite's agent pair) and a 4 KiB Gloo allreduce
/// (two ranks as threads of this process) — each measured with recording on
/// and off (`flight_recorder::set_enabled` before the agents and groups are
/// made), in alternating rounds so that both see the same machine; every
/// "_recorder_on" record carries `cost_pct` against its "_off" twin. A third
/// mode has the metrics on as well (`metrics::metrics_server` serving, so the
/// recorders' observer counts every ended entry; nobody scrapes): its
/// "_metrics_on" records carry `cost_pct` against "_recorder_on" (what the
/// metrics add) and `cost_vs_off_pct` against "_recorder_off".

#include "agent_pair.hpp"
#include "closed_loop.hpp"
#include "harness.hpp"

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/flight_recorder.hpp>
#include <corodist/metrics/metrics_server.hpp>

#include <array>
#include <thread>
#include <vector>

namespace corodist::bench {
namespace {

using clock_type = std::chrono::steady_clock;

struct mode_results {
  latency_recorder sync;
  latency_recorder async;
  double async_calls = 0, async_s = 0;
  latency_recorder allreduce;
  double sync_s = 0, allreduce_s = 0;
};

void rpc_round(bool quick, mode_results& m) {
  agent_pair pair;
  auto& a = pair.client();
  const std::size_t sync_n = quick ? 3'000 : 20'000;
  for (std::size_t i = 0; i < sync_n / 10; ++i)
    a.rpc_sync<void>("server", "noop");
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < sync_n; ++i) {
    const auto s = clock_type::now();
    a.rpc_sync<void>("server", "noop");
    m.sync.add(clock_type::now() - s);
  }
  m.sync_s += std::chrono::duration<double>(clock_type::now() - t0).count();
  const std::size_t async_n = quick ? 30'000 : 200'000;
  auto [rec, elapsed] = pair.run_on_client([&](asio::any_io_executor ex) {
    auto one_call = [&a](int) -> asio::awaitable<void> { (void)co_await a.rpc_async<int>("server", "add", 1, 2).async_get(); };
    return run_closed_loop(ex, 64, async_n, one_call);
  });
  m.async.add_all(rec);
  m.async_calls += static_cast<double>(rec.size());
  m.async_s += elapsed;
}

void allreduce_round(bool quick, int round, bool on, mode_results& m) {
  event_loop store_loop;
  store_loop.start();
  auto st = std::make_shared<store::hash_store>(store_loop.get_executor());
  const std::size_t n = quick ? 2'000 : 10'000;
  std::array<latency_recorder, 2> lat;
  std::array<double, 2> took{};
  auto rank = [&](int r) {
    collective::gloo_options o;
    o.prefix = "obs" + std::to_string(round) + (on ? "on" : "off");
    o.host = "127.0.0.1";
    auto g = collective::gloo_group::create_sync(st, r, 2, o);
    std::vector<float> v(1024, 1.0f); // 4 KiB
    for (std::size_t i = 0; i < n / 10; ++i)
      g->allreduce(v).get();
    const auto t0 = clock_type::now();
    for (std::size_t i = 0; i < n; ++i) {
      const auto s = clock_type::now();
      g->allreduce(v).get();
      lat[r].add(clock_type::now() - s);
    }
    took[r] = std::chrono::duration<double>(clock_type::now() - t0).count();
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  m.allreduce.add_all(lat[0]);
  m.allreduce_s += took[0];
}

void report_pair(context& ctx, const char* name, const latency_recorder& on, double on_s, const latency_recorder& off,
                 double off_s, double on_ops = -1, double off_ops = -1) {
  auto r_on = latency_record("observability", std::string(name) + "_recorder_on", on, on_s);
  auto r_off = latency_record("observability", std::string(name) + "_recorder_off", off, off_s);
  if (on_ops >= 0) { // a throughput case: the cost is the lost calls per second
    r_on.ops_per_s = on_ops;
    r_off.ops_per_s = off_ops;
    r_on.extra = {{"cost_pct", (off_ops - on_ops) / off_ops * 100.0}};
  } else {
    r_on.extra = {{"cost_pct", (r_on.p50_us - r_off.p50_us) / r_off.p50_us * 100.0}};
  }
  ctx.report(std::move(r_off));
  ctx.report(std::move(r_on));
}

// The "_metrics_on" record of a case, against the recorder on (what the
// metrics add) and off.
void report_metrics(context& ctx, const char* name, const latency_recorder& m, double m_s, const latency_recorder& on,
                    double on_s, const latency_recorder& off, double off_s, double m_ops = -1, double on_ops = -1,
                    double off_ops = -1) {
  auto r = latency_record("observability", std::string(name) + "_metrics_on", m, m_s);
  if (m_ops >= 0) {
    r.ops_per_s = m_ops;
    r.extra = {{"cost_pct", (on_ops - m_ops) / on_ops * 100.0}, {"cost_vs_off_pct", (off_ops - m_ops) / off_ops * 100.0}};
  } else {
    const double p_on = latency_record("observability", "", on, on_s).p50_us;
    const double p_off = latency_record("observability", "", off, off_s).p50_us;
    r.extra = {{"cost_pct", (r.p50_us - p_on) / p_on * 100.0}, {"cost_vs_off_pct", (r.p50_us - p_off) / p_off * 100.0}};
  }
  ctx.report(std::move(r));
}

void run_observability_suite(context& ctx) {
  const bool was = flight_recorder::enabled();
  const bool metrics_were_on = metrics::metrics_server::port() != 0;
  const int rounds = ctx.quick ? 2 : 6;
  std::array<mode_results, 3> res; // [0] recorder off, [1] on, [2] on with the metrics
  for (int round = 0; round < rounds; ++round)
    for (int k = 0; k < 3; ++k) {
      const int mode = (round + k) % 3; // rotate which goes first
      flight_recorder::set_enabled(mode != 0);
      if (mode == 2)
        metrics::metrics_server::start(0);
      else
        metrics::metrics_server::stop();
      rpc_round(ctx.quick, res[mode]);
      allreduce_round(ctx.quick, round * 3 + k, mode != 0, res[mode]);
    }
  flight_recorder::set_enabled(was);
  if (metrics_were_on)
    metrics::metrics_server::start(0);
  else
    metrics::metrics_server::stop();
  report_pair(ctx, "rpc_sync_empty", res[1].sync, res[1].sync_s, res[0].sync, res[0].sync_s);
  report_metrics(ctx, "rpc_sync_empty", res[2].sync, res[2].sync_s, res[1].sync, res[1].sync_s, res[0].sync,
                 res[0].sync_s);
  report_pair(ctx, "rpc_async_x64", res[1].async, res[1].async_s, res[0].async, res[0].async_s,
              res[1].async_calls / res[1].async_s, res[0].async_calls / res[0].async_s);
  report_metrics(ctx, "rpc_async_x64", res[2].async, res[2].async_s, res[1].async, res[1].async_s, res[0].async,
                 res[0].async_s, res[2].async_calls / res[2].async_s, res[1].async_calls / res[1].async_s,
                 res[0].async_calls / res[0].async_s);
  report_pair(ctx, "allreduce_4KiB", res[1].allreduce, res[1].allreduce_s, res[0].allreduce, res[0].allreduce_s);
  report_metrics(ctx, "allreduce_4KiB", res[2].allreduce, res[2].allreduce_s, res[1].allreduce, res[1].allreduce_s,
                 res[0].allreduce, res[0].allreduce_s);
}

const suite_registrar registrar("observability", &run_observability_suite, 90, 9);

} // namespace
} // namespace corodist::bench
