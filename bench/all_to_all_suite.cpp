/// \file
/// Suite `all_to_all`: Gloo all_to_all_single of float32 buffers, 4 KiB to
/// 64 MiB per rank, between 2, 4, 8 and 16 rank processes (forked from this
/// one) over loopback, with even splits and with a fixed skew:
///   * even_r<n>_<size>: both split lists empty (size/n bytes to each rank);
///   * skewed_r<n>_<size>: rank r sends rank j a block proportional to
///     ((r + j) % n) + 1, every rank the same total (`skewed_elements`), and
///     receives what the others' splits say (out_splits[j] = rank j's
///     in_splits[r]); the largest block is 2/(n+1) of the buffer, about
///     twice an even one.
/// Rank 0 times `co_await pg->all_to_all_single(in, out, ...)` from a
/// coroutine on its event loop (collective::gloo_group, defaults) and, in the
/// same ranks and blocks (rotating which goes first), `bare`: Gloo's
/// alltoall / alltoallv called directly from the rank's plain thread on a
/// Gloo context of its own, as ProcessGroupGloo runs them (`bare_p50_us`;
/// `overhead_pct` = ours over it). The same sizes and splits run in turns,
/// block by block, with PyTorch 1.13's dist.all_to_all_single on gloo
/// (bench/torch_allreduce_peer.py --op all_to_all) when /usr/bin/python3 can
/// import torch.
/// algbw = bytes per rank / p50, busbw = algbw * (n-1)/n (nccl-tests' alltoall).
///
/// 8 and 16 ranks oversubscribe this project's 2 vCPUs: as in the allreduce
/// suite, each size runs fewer calls per block and fewer blocks there (at
/// least 2, more until the size has had its time cap), and --quick runs two
/// small sizes. CORODIST_ALL_TO_ALL_RANKS=8,16 runs only those rank counts.

#include "harness.hpp"
#include "peers.hpp"
#include "process_resources.hpp"
#include "turn_jobs.hpp"

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>

#if CORODIST_BENCH_GLOO
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#endif

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace corodist::bench {
namespace {

namespace cc = corodist::collective;
using clock_type = std::chrono::steady_clock;

constexpr const char* suite_name = "all_to_all suite";
// Debian's python3-torch runs only under /usr/bin/python3 (peers.cpp checks it).
constexpr const char* python = "/usr/bin/python3";

enum class split : int { even = 0, skewed = 1 };

struct size_case {
  std::size_t bytes; ///< per rank: the input buffer
  int iters;         ///< timed calls per block
};

/// How one rank count is measured.
struct rank_plan {
  int ranks;
  std::vector<size_case> sizes;
  int blocks;               ///< turns per size, split and job, at most
  int min_blocks;           ///< at least, whatever the cap
  std::chrono::seconds cap; ///< no further turn once a size's turns (both splits) took this long
  int warmup;               ///< untimed calls the first time a job sees a size and split
};

std::vector<rank_plan> plans(bool quick) {
  constexpr auto none = std::chrono::seconds(3600);
  if (quick)
    return {
        {2, {{4 << 10, 20}, {1 << 20, 5}, {64 << 20, 1}}, 2, 2, none, 2},
        {4, {{4 << 10, 20}, {1 << 20, 5}, {64 << 20, 1}}, 2, 2, none, 2},
        {8, {{4 << 10, 10}, {64 << 10, 5}}, 2, 2, none, 1},
        {16, {{4 << 10, 5}, {64 << 10, 3}}, 2, 2, none, 1},
    };
  return {
      {2, {{4 << 10, 60}, {64 << 10, 40}, {1 << 20, 12}, {16 << 20, 3}, {64 << 20, 1}}, 4, 4, none, 3},
      {4, {{4 << 10, 40}, {64 << 10, 25}, {1 << 20, 8}, {16 << 20, 2}, {64 << 20, 1}}, 4, 4, none, 3},
      {8,
       {{4 << 10, 15}, {64 << 10, 10}, {1 << 20, 4}, {16 << 20, 1}, {64 << 20, 1}},
       4, 2, std::chrono::seconds(10), 1},
      {16,
       {{4 << 10, 8}, {64 << 10, 5}, {1 << 20, 2}, {16 << 20, 1}, {64 << 20, 1}},
       4, 2, std::chrono::seconds(15), 1},
  };
}

/// The rank counts to run: CORODIST_ALL_TO_ALL_RANKS (e.g. "8,16") when set, else all.
std::vector<rank_plan> selected_plans(bool quick) {
  auto all = plans(quick);
  const char* env = std::getenv("CORODIST_ALL_TO_ALL_RANKS");
  if (env == nullptr || *env == '\0')
    return all;
  std::vector<int> wanted;
  std::istringstream in(env);
  for (std::string word; std::getline(in, word, ',');)
    if (!word.empty())
      wanted.push_back(std::atoi(word.c_str()));
  std::vector<rank_plan> out;
  for (auto& p : all)
    if (std::find(wanted.begin(), wanted.end(), p.ranks) != wanted.end())
      out.push_back(std::move(p));
  if (out.empty())
    throw std::runtime_error(
        fmt::format("all_to_all suite: CORODIST_ALL_TO_ALL_RANKS={} names none of 2, 4, 8, 16", env));
  return out;
}

std::string size_name(std::size_t bytes) {
  return bytes >= (1 << 20) ? fmt::format("{}MiB", bytes >> 20) : fmt::format("{}KiB", bytes >> 10);
}

/// Elements rank `src` sends rank `dst` under the skew, of `count` per rank:
/// count * w / (n(n+1)/2) with w = ((src + dst) % n) + 1, rounded down, the
/// remainder one each to the first ranks. bench/torch_allreduce_peer.py
/// computes the same.
std::size_t skewed_elements(int n, std::size_t count, int src, int dst) {
  const auto total_weight = static_cast<std::size_t>(n) * static_cast<std::size_t>(n + 1) / 2;
  std::size_t given = 0;
  for (int j = 0; j < n; ++j)
    given += count * static_cast<std::size_t>((src + j) % n + 1) / total_weight;
  const auto remainder = count - given;
  return count * static_cast<std::size_t>((src + dst) % n + 1) / total_weight +
         (static_cast<std::size_t>(dst) < remainder ? 1 : 0);
}

/// Rank 0's figures for one (split, size): "RESULT <split> <bytes> <p50_us> <p99_us> <samples>
/// [<bare_p50_us>]" (the peer writes no bare figure); and from every rank "SWITCHES <split> <bytes>
/// <variant> <switches> <calls> <cpu_us>": its process's voluntary context switches (thread
/// wake-ups, all threads) and CPU time during that many calls of variant 0 (ours; the peer's own)
/// or 1 (bare), warm-ups included.
struct result {
  double p50_us = not_applicable;
  double p99_us = not_applicable;
  double samples = 0;
  double bare_p50_us = not_applicable;
  double switches[2] = {0, 0}; ///< summed over the job's ranks
  double cpu_us[2] = {0, 0};   ///< summed over the job's ranks
  double calls[2] = {0, 0};    ///< one rank's

  /// Wake-ups per call of variant `v`, all ranks together; NaN when not counted.
  double wakeups_per_call(int v) const { return calls[v] > 0 ? switches[v] / calls[v] : not_applicable; }
  /// CPU time per call of variant `v`, all ranks together; NaN when not counted.
  double cpu_us_per_call(int v) const { return calls[v] > 0 ? cpu_us[v] / calls[v] : not_applicable; }
};
using results = std::map<std::pair<int, std::size_t>, result>;

void parse_results(const std::vector<std::string>& lines, results& out) {
  for (const auto& line : lines) {
    if (auto v = result_words(line); v && v->size() >= 5) {
      auto& r = out[{static_cast<int>((*v)[0]), static_cast<std::size_t>((*v)[1])}];
      r.p50_us = (*v)[2];
      r.p99_us = (*v)[3];
      r.samples = (*v)[4];
      if (v->size() >= 6)
        r.bare_p50_us = (*v)[5];
    } else if (line.rfind("SWITCHES ", 0) == 0) {
      std::istringstream in(line.substr(9));
      int how = 0, which = 0;
      std::size_t bytes = 0;
      double switches = 0, calls = 0, cpu = 0;
      if (in >> how >> bytes >> which >> switches >> calls >> cpu && (which == 0 || which == 1)) {
        auto& r = out[{how, bytes}];
        r.switches[which] += switches;
        r.cpu_us[which] += cpu;
        r.calls[which] = calls;
      }
    }
  }
}

#if CORODIST_BENCH_GLOO

/// One rank of our job: rank 0 reads "RUN <bytes> <iters> <warmup> <split>"
/// from `control` and passes it on (an untimed broadcast), times its calls,
/// answers "DONE" and at the end writes its results to `output`.
int rank_main(int rank, int n, const std::string& dir, int control, int output) {
  event_loop loop;
  loop.start();
  cc::gloo_options o;
  o.host = "127.0.0.1";
  o.timeout = std::chrono::minutes(30); // includes the peer's turns
  auto pg = cc::gloo_group::create_sync(
      loop, fmt::format("file://{}/store?rank={}&world_size={}&timeout=300", dir, rank, n), o);
  // The bare Gloo context: its own connections, rendezvous through Gloo's file store.
  gloo::rendezvous::FileStore files(dir);
  gloo::rendezvous::PrefixStore keys("bare", files);
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto bare = std::make_shared<gloo::rendezvous::Context>(rank, n);
  bare->setTimeout(std::chrono::minutes(30));
  bare->connectFullMesh(keys, device);
  std::uint32_t tag = 0;
  std::optional<line_reader> commands;
  if (rank == 0) {
    commands.emplace(control, suite_name);
    write_line(output, "READY", suite_name);
  }
  struct figures {
    latency_recorder ours, direct;
    int blocks = 0;
    long switches[2] = {0, 0}; // ours, bare
    double cpu_us[2] = {0, 0};
    long calls = 0; // of each
  };
  std::map<std::pair<int, std::size_t>, figures> timed;
  std::vector<float> in, out; // zeros
  auto ex = loop.get_executor();
  for (;;) {
    std::int64_t cmd[5] = {0, 0, 0, 0, 0}; // run?, bytes, iters, warmup, split
    if (rank == 0) {
      auto line = commands->next(std::chrono::hours(1), "the benchmark");
      std::istringstream words(line.value_or("QUIT"));
      std::string word;
      words >> word;
      if (word == "RUN" && (words >> cmd[1] >> cmd[2] >> cmd[3] >> cmd[4]))
        cmd[0] = 1;
    }
    pg->broadcast(cc::tensor_view(cmd, 5, cc::dtype::int64), 0).get();
    if (cmd[0] == 0)
      break;
    const auto bytes = static_cast<std::size_t>(cmd[1]);
    const int iters = static_cast<int>(cmd[2]);
    const auto how = static_cast<split>(cmd[4]);
    const auto count = bytes / sizeof(float);
    std::vector<std::size_t> in_splits, out_splits;
    std::size_t out_count = count;
    if (how == split::skewed) {
      out_count = 0;
      for (int j = 0; j < n; ++j) {
        in_splits.push_back(skewed_elements(n, count, rank, j));
        out_splits.push_back(skewed_elements(n, count, j, rank));
        out_count += out_splits.back();
      }
    }
    if (in.size() != count) {
      std::vector<float>().swap(in); // sizes come one after another: the last one's buffers are done with
      std::vector<float>().swap(out);
      in.assign(count, 0.0f);
    }
    out.resize(out_count);
    auto [it, fresh] = timed.try_emplace({static_cast<int>(how), bytes});
    auto& fig = it->second;
    const int warmup = fresh ? static_cast<int>(cmd[3]) : 0;
    auto ours = [&] {
      run_blocking(ex, [&]() -> asio::awaitable<void> {
        for (int i = 0; i < warmup + iters; ++i) {
          const auto t0 = clock_type::now();
          co_await pg->all_to_all_single(in, out, in_splits, out_splits);
          if (i >= warmup)
            fig.ours.add(clock_type::now() - t0);
        }
      }());
    };
    auto direct = [&] {
      std::vector<std::int64_t> sends(in_splits.begin(), in_splits.end()), recvs(out_splits.begin(), out_splits.end());
      for (int i = 0; i < warmup + iters; ++i) {
        const auto t0 = clock_type::now();
        if (how == split::even) {
          gloo::AlltoallOptions a(bare);
          a.setInput(in.data(), in.size());
          a.setOutput(out.data(), out.size());
          a.setTag(tag++);
          gloo::alltoall(a);
        } else {
          gloo::AlltoallvOptions a(bare);
          a.setInput(in.data(), sends);
          a.setOutput(out.data(), recvs);
          a.setTag(tag++);
          gloo::alltoallv(a);
        }
        if (i >= warmup)
          fig.direct.add(clock_type::now() - t0);
      }
    };
    auto counted = [&](int which, auto&& run) {
      const auto before = voluntary_switches();
      const auto cpu_before = own_cpu_us();
      run();
      fig.switches[which] += voluntary_switches() - before;
      fig.cpu_us[which] += own_cpu_us() - cpu_before;
    };
    if (fig.blocks++ % 2 == 0) {
      counted(0, ours);
      counted(1, direct);
    } else {
      counted(1, direct);
      counted(0, ours);
    }
    fig.calls += warmup + iters;
    if (rank == 0)
      write_line(output, "DONE", suite_name);
  }
  for (auto& [key, fig] : timed) {
    if (rank == 0)
      write_line(output,
                 fmt::format("RESULT {} {} {} {} {} {}", key.first, key.second, fig.ours.percentile(0.5),
                             fig.ours.percentile(0.99), fig.ours.size(), fig.direct.percentile(0.5)),
                 suite_name);
    for (int which = 0; which < 2; ++which)
      write_line(output,
                 fmt::format("SWITCHES {} {} {} {} {} {}", key.first, key.second, which, fig.switches[which], fig.calls,
                             fig.cpu_us[which]),
                 suite_name);
  }
  pg->barrier().get();
  return 0;
}

#endif

/// Prints a `# all_to_all:` line to the table (between the rows).
void comment(context& ctx, const std::string& text) {
  if (ctx.status)
    ctx.status->pause();
  fmt::print(ctx.table_out, "# all_to_all: {}\n", text);
  std::fflush(ctx.table_out);
}

void run_all_to_all_suite(context& ctx) {
#if CORODIST_BENCH_GLOO
  const auto rank_plans = selected_plans(ctx.quick);
  std::optional<std::string> no_peer;
  const auto script = bench_script("torch_allreduce_peer.py");
  if (!ctx.peers)
    no_peer = "skipped";
  else if (auto why = torch_unavailable())
    no_peer = *why;
  else if (script.empty())
    no_peer = "bench/torch_allreduce_peer.py not found";
  for (const auto& plan : rank_plans) {
    const int n = plan.ranks;
    const auto started = clock_type::now();
    char tmpl[] = "/tmp/corodist_all_to_all_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr)
      throw std::runtime_error("all_to_all suite: mkdtemp failed");
    const std::string dir = tmpl;
    results ours, peer;
    std::map<std::size_t, int> blocks_run;
    try {
      if (ctx.status)
        ctx.status->note(fmt::format("{} ranks{}", n, no_peer ? "" : " taking turns with PyTorch's"));
      auto our_job = fork_job(suite_name, fmt::format("corodist's {} ranks", n), n,
                              [&](int r, int control, int output) { return rank_main(r, n, dir, control, output); });
      std::unique_ptr<turn_job> peer_job;
      if (!no_peer)
        peer_job = spawn_job(suite_name, fmt::format("PyTorch's {} ranks", n),
                             {python, script, "--op", "all_to_all", "--ranks", std::to_string(n)});
      our_job->ready();
      if (peer_job)
        peer_job->ready();
      for (const auto& c : plan.sizes) {
        if (ctx.status)
          ctx.status->note(fmt::format("{} ranks, {}", n, size_name(c.bytes)));
        // Turns of both jobs on both splits until `blocks`, or `min_blocks` once the size has had its cap.
        const auto size_started = clock_type::now();
        int b = 0;
        while (b < plan.blocks && (b < plan.min_blocks || clock_type::now() - size_started < plan.cap)) {
          for (auto how : {split::even, split::skewed}) {
            const auto words = fmt::format("{} {} {} {}", c.bytes, c.iters, plan.warmup, static_cast<int>(how));
            our_job->run(words);
            if (peer_job)
              peer_job->run(words);
          }
          ++b;
        }
        blocks_run[c.bytes] = b;
      }
      parse_results(our_job->finish(), ours);
      if (peer_job)
        parse_results(peer_job->finish(), peer);
    } catch (...) {
      remove_tree(dir);
      throw;
    }
    remove_tree(dir);
    comment(ctx, fmt::format("{} ranks: {} sizes, {} to {} blocks per size, split and job ({} s cap per size), "
                             "{:.1f} s with {} and both jobs' start",
                             n, plan.sizes.size(), plan.min_blocks, plan.blocks, plan.cap.count(),
                             std::chrono::duration<double>(clock_type::now() - started).count(),
                             no_peer ? "no peer (" + *no_peer + ")" : "the peer's turns"));
    for (auto how : {split::even, split::skewed}) {
      for (const auto& c : plan.sizes) {
        const std::pair<int, std::size_t> key{static_cast<int>(how), c.bytes};
        auto it = ours.find(key);
        if (it == ours.end())
          throw std::runtime_error("all_to_all suite: no result for " + size_name(c.bytes));
        const auto& r = it->second;
        record rec;
        rec.suite = "all_to_all";
        rec.name = fmt::format("{}_r{}_{}", how == split::even ? "even" : "skewed", n, size_name(c.bytes));
        rec.p50_us = r.p50_us;
        rec.p99_us = r.p99_us;
        const double algbw = static_cast<double>(c.bytes) / (r.p50_us * 1e-6) / 1e9;
        rec.gbytes_per_s = algbw;
        rec.extra = {{"ranks", n},
                     {"bytes", static_cast<double>(c.bytes)},
                     {"algbw_gbps", algbw},
                     {"busbw_gbps", algbw * (n - 1) / n},
                     {"samples", r.samples},
                     {"blocks", blocks_run[c.bytes]}};
        if (!std::isnan(r.bare_p50_us)) {
          rec.extra.emplace_back("bare_p50_us", r.bare_p50_us);
          rec.extra.emplace_back("overhead_pct", (r.p50_us / r.bare_p50_us - 1.0) * 100.0);
        }
        // Thread wake-ups per call, all ranks together (voluntary context switches).
        auto add = [&](const char* k, double v) {
          if (!std::isnan(v))
            rec.extra.emplace_back(k, v);
        };
        add("wakeups_per_call", r.wakeups_per_call(0));
        add("bare_wakeups_per_call", r.wakeups_per_call(1));
        add("cpu_us_per_call", r.cpu_us_per_call(0));
        add("bare_cpu_us_per_call", r.cpu_us_per_call(1));
        if (how == split::skewed)
          rec.extra.emplace_back("largest_block_bytes",
                                 static_cast<double>(skewed_elements(n, c.bytes / sizeof(float), n - 1, 0) *
                                                     sizeof(float)));
        rec.text = {{"split", how == split::even ? "even" : "skewed"}};
        if (auto q = peer.find(key); q != peer.end()) {
          peer_result torch;
          torch.name = "pytorch";
          torch.p50_us = q->second.p50_us;
          rec.peers = {torch};
          rec.extra.emplace_back("peer_p99_us", q->second.p99_us);
          rec.extra.emplace_back("peer_samples", q->second.samples);
          add("peer_wakeups_per_call", q->second.wakeups_per_call(0));
          add("peer_cpu_us_per_call", q->second.cpu_us_per_call(0));
        } else {
          rec.peers = {peer_result::missing("pytorch", no_peer.value_or("no result"))};
        }
        ctx.report(std::move(rec));
      }
    }
  }
#else
  record rec;
  rec.suite = "all_to_all";
  rec.name = "gloo (corodist-bench was built without Gloo)";
  ctx.report(std::move(rec));
#endif
}

const suite_registrar registrar("all_to_all", &run_all_to_all_suite, 52);

} // namespace
} // namespace corodist::bench
