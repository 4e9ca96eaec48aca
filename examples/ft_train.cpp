// Fault-tolerant data-parallel training with ft::manager and the DDP reducer.
//
//   corodist-run --nproc 4 --restart-policy worker -- build/examples/corodist-ft-train --steps 60
//
// Each process is one replica (named "r<LOCAL_RANK>" unless --replica is
// given) that trains a linear model (64 float32 weights, SGD with momentum)
// on batches drawn from (step, replica name). Every step it asks the manager
// for the step's quorum, rebuilds its reducer when the group changed,
// computes its gradient, lets the reducer average it over the live replicas,
// and applies the update only when the manager says every member succeeded.
// A replica that is killed and restarted rejoins: the manager sends it the
// weights, the momentum and the step from a healthy replica, and it trains on.
//
// Gradients are rounded to multiples of 2^-12 (|g| <= 4), so their sum is
// exact in any order and a run can be replayed bit for bit in one process:
// each committed step prints "committed <step> <replica,replica,...>" and
// `--replay FILE` recomputes the weights from those lines. --out writes the
// final weights and momentum (raw float32) for comparison. The replicas end
// together after --steps committed steps; with --finish-with K, only in a
// quorum of K (a replica still away is waited for, so that all end equal).
//
// --hold-after N --hold-file PATH: after committing step N, waits (up to
// 60 s) until PATH is not empty before the next step, so that a test puts a
// fault in place at a known step.
//
// The store: MASTER_ADDR and MASTER_PORT (corodist-run's, or any store_server).
#include "usage.hpp"

#include <corodist/collective/errors.hpp>
#include <corodist/core/error.hpp>
#include <corodist/ddp/reducer.hpp>
#include <corodist/ft/manager.hpp>
#include <corodist/store/tcp_store.hpp>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr std::size_t dim = 64, batch = 8;
constexpr float learning_rate = 0.05f, momentum = 0.9f, grid = 4096.0f, clip = 4.0f;

struct model {
  std::vector<float> w = std::vector<float>(dim), m = std::vector<float>(dim), g = std::vector<float>(dim);

  model() {
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 0.1f);
    for (auto& x : w) x = d(rng);
  }

  /// The rounded gradient of the squared error on the batch of (step, replica).
  void gradient(std::uint64_t step, const std::string& replica) {
    std::seed_seq seed{static_cast<unsigned>(step), static_cast<unsigned>(std::hash<std::string>{}(replica))};
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::fill(g.begin(), g.end(), 0.0f);
    for (std::size_t s = 0; s < batch; ++s) {
      float x[dim], y = 0, p = 0;
      for (std::size_t i = 0; i < dim; ++i) {
        x[i] = u(rng);
        y += x[i] * (static_cast<float>(i % 7) - 3.0f) / 8.0f; // the true weights
        p += x[i] * w[i];
      }
      for (std::size_t i = 0; i < dim; ++i) g[i] += 2.0f * (p - y) * x[i] / batch;
    }
    for (auto& v : g) v = std::round(std::clamp(v, -clip, clip) * grid) / grid;
  }

  void apply() {
    for (std::size_t i = 0; i < dim; ++i) {
      m[i] = momentum * m[i] + g[i];
      w[i] -= learning_rate * m[i];
    }
  }

  void write(const std::string& path) const {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(dim * sizeof(float)));
    out.write(reinterpret_cast<const char*>(m.data()), static_cast<std::streamsize>(dim * sizeof(float)));
  }
};

struct settings {
  std::string replica, out, replay, hold_file;
  std::uint64_t steps = 60, hold_after = 0;
  int min_replicas = 1, initial_replicas = 0, finish_with = 0, step_ms = 20, group_timeout_ms = 0;
};

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

/// Waits until `path` is not empty (at most 60 s).
asio::awaitable<void> hold(const std::string& path) {
  asio::steady_timer t(co_await asio::this_coro::executor);
  for (int i = 0; i < 30000; ++i) {
    std::error_code ec;
    if (std::filesystem::file_size(path, ec) > 0 && !ec) co_return;
    t.expires_after(std::chrono::milliseconds(2));
    co_await t.async_wait(asio::use_awaitable);
  }
}

asio::awaitable<void> train(settings s) {
  auto ex = co_await asio::this_coro::executor;
  corodist::store::tcp_store_options so;
  so.host = env_or("MASTER_ADDR", "127.0.0.1");
  so.port = static_cast<std::uint16_t>(std::atoi(env_or("MASTER_PORT", "29500")));
  auto store = co_await corodist::store::tcp_store::connect(ex, so);

  corodist::ft::manager_options mo;
  mo.replica_id = s.replica;
  mo.min_replicas = s.min_replicas;
  mo.initial_replicas = s.initial_replicas;
  if (s.group_timeout_ms > 0) mo.group.timeout = std::chrono::milliseconds(s.group_timeout_ms);
  auto mgr = co_await corodist::ft::manager::create(store, mo);
  model net;
  mgr->register_state("weights", net.w);
  mgr->register_state("momentum", net.m);

  std::unique_ptr<corodist::ddp::reducer> red;
  corodist::ddp::reducer_options ro;
  ro.rebuild_buckets = false; // a joiner's buckets must match the others' at once
  asio::steady_timer compute(ex);
  // Ends after --steps committed steps, all replicas together; with
  // --finish-with K, only in a quorum of K (a lost replica has come back).
  for (;;) {
    if (mgr->step() >= s.steps && mgr->current().size() >= s.finish_with) break;
    auto q = co_await mgr->start_step();
    if (!q.joined.empty() || !q.left.empty() || q.recovered) {
      auto list = [](const std::vector<std::string>& v) {
        std::string s;
        for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
        return s.empty() ? std::string("-") : s;
      };
      std::printf("quorum %llu step %llu size %d joined %s left %s%s\n", static_cast<unsigned long long>(q.id),
                  static_cast<unsigned long long>(mgr->step()), q.size(), list(q.joined).c_str(),
                  list(q.left).c_str(), q.recovered ? " recovered" : "");
    }
    bool ok = true;
    try {
      if (q.reconfigured || !red) {
        red.reset();
        std::vector<corodist::ddp::parameter> params;
        params.emplace_back(std::span<float>(net.w), std::span<float>(net.g), "w");
        red = co_await corodist::ddp::reducer::create(ex, mgr->group(), std::move(params), ro);
      }
      net.gradient(mgr->step(), s.replica);
      compute.expires_after(std::chrono::milliseconds(s.step_ms)); // the rest of the model's work
      co_await compute.async_wait(asio::use_awaitable);
      red->prepare_for_backward();
      red->mark_grad_ready(0);
      co_await red->finalize();
    } catch (const corodist::collective::collective_failure& e) {
      std::printf("step %llu failed: %s\n", static_cast<unsigned long long>(mgr->step()),
                  dynamic_cast<const std::exception&>(e).what());
      ok = false;
      red.reset();
    }
    std::uint64_t step = mgr->step();
    const bool committed = co_await mgr->should_commit(ok);
    if (committed) {
      net.apply();
      std::string members;
      for (const auto& m : q.members) members += (members.empty() ? "" : ",") + m.replica_id;
      std::printf("committed %llu %s\n", static_cast<unsigned long long>(step), members.c_str());
    }
    std::fflush(stdout);
    if (committed && step == s.hold_after && !s.hold_file.empty()) co_await hold(s.hold_file);
  }
  red.reset();
  if (!s.out.empty()) net.write(s.out);
  std::printf("replica %s done at step %llu\n", s.replica.c_str(), static_cast<unsigned long long>(mgr->step()));
}

/// Recomputes the weights from "committed <step> <members>" lines.
int replay(const settings& s) {
  std::ifstream in(s.replay);
  if (!in) {
    std::fprintf(stderr, "ft_train: cannot read %s\n", s.replay.c_str());
    return 2;
  }
  model net;
  std::string line;
  std::uint64_t expect = 0;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string word, members;
    std::uint64_t step = 0;
    if (!(l >> word >> step >> members) || word != "committed") continue;
    if (step != expect) {
      std::fprintf(stderr, "ft_train: replay: step %llu where %llu was expected\n",
                   static_cast<unsigned long long>(step), static_cast<unsigned long long>(expect));
      return 1;
    }
    std::vector<std::string> ids;
    std::istringstream ms(members);
    for (std::string id; std::getline(ms, id, ',');) ids.push_back(id);
    std::vector<float> sum(dim, 0.0f);
    for (const auto& id : ids) {
      net.gradient(step, id);
      for (std::size_t i = 0; i < dim; ++i) sum[i] += net.g[i]; // exact: multiples of 2^-12
    }
    for (std::size_t i = 0; i < dim; ++i) net.g[i] = sum[i] / static_cast<float>(ids.size());
    net.apply();
    ++expect;
  }
  if (!s.out.empty()) net.write(s.out);
  std::printf("replayed %llu steps\n", static_cast<unsigned long long>(expect));
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  settings s;
  s.replica = std::string("r") + env_or("LOCAL_RANK", "0");
  constexpr const char* usage =
      "[--replica ID] [--steps N] [--min-replicas K] [--initial-replicas K] [--finish-with K] [--step-ms MS] "
      "[--group-timeout-ms MS] [--out FILE] [--replay LOG] [--hold-after N --hold-file PATH]";
  constexpr const char* about =
      "Fault-tolerant data-parallel training with ft::manager and the DDP reducer: one replica per process.\n"
      "Run it under corodist-run: corodist-run --nproc 4 --restart-policy worker -- corodist-ft-train --steps 60\n"
      "--replay LOG recomputes the weights from a run's \"committed\" lines in one process.";
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (examples::is_help(k))
      return examples::print_usage(argv[0], usage, about);
    if (i + 1 >= argc) {
      const std::string error = k.starts_with("--") ? "option '" + k + "' needs a value" : "unknown argument '" + k + "'";
      return examples::print_usage(argv[0], usage, about, error.c_str());
    }
    const std::string v = argv[i + 1];
    try {
      if (k == "--replica") s.replica = v;
      else if (k == "--steps") s.steps = std::stoull(v);
      else if (k == "--min-replicas") s.min_replicas = std::stoi(v);
      else if (k == "--initial-replicas") s.initial_replicas = std::stoi(v);
      else if (k == "--finish-with") s.finish_with = std::stoi(v);
      else if (k == "--step-ms") s.step_ms = std::stoi(v);
      else if (k == "--group-timeout-ms") s.group_timeout_ms = std::stoi(v);
      else if (k == "--out") s.out = v;
      else if (k == "--replay") s.replay = v;
      else if (k == "--hold-after") s.hold_after = std::stoull(v);
      else if (k == "--hold-file") s.hold_file = v;
      else {
        const std::string error = "unknown option '" + k + "'";
        return examples::print_usage(argv[0], usage, about, error.c_str());
      }
    } catch (const std::logic_error&) { // std::invalid_argument, std::out_of_range
      const std::string error = "option '" + k + "' wants a number, not '" + v + "'";
      return examples::print_usage(argv[0], usage, about, error.c_str());
    }
  }
  if (!s.replay.empty()) return replay(s);
  asio::io_context ctx;
  std::exception_ptr failed;
  asio::co_spawn(ctx, train(s), [&](std::exception_ptr e) { failed = e; });
  ctx.run();
  if (failed) {
    try {
      std::rethrow_exception(failed);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ft_train: replica %s: %s\n", s.replica.c_str(), e.what());
    }
    return 1;
  }
  return 0;
}
