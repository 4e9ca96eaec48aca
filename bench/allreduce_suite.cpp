/// \file
/// Suite `allreduce`: Gloo allreduce of float32 buffers, 4 KiB to 64 MiB, with
/// 2, 4, 8 and 16 ranks as processes (forked from this one) over loopback.
/// Each rank times, in turn on the same buffer,
///   * ours: `co_await pg->allreduce(buf)` from a coroutine on an event loop,
///     corodist::collective::gloo_group with its defaults (two communication
///     threads; bcube up to 1 MiB, the ring above; digest-carrying tags and
///     the stall probe, which a healthy collective never wakes);
///   * checked: the same with `check_calls = true` (the call-header check's share);
///   * bare: `gloo::allreduce` with the same algorithm, called directly from
///     the rank's plain thread on a Gloo context of its own (gloo::sum<float>,
///     PyTorch's reduce function);
///   * bare2: the same calls made by two plain threads in turn, handed over
///     by the timing thread (how PyTorch drives Gloo: on one CPU-starved
///     machine, one thread alone can stall Gloo's event loop for a tick);
/// and rank 0 reports p50s; overhead_pct compares ours with the better bare one. PyTorch's gloo allreduce on the same sizes and
/// ranks (bench/torch_allreduce_peer.py under Debian's python3-torch) runs
/// alongside when it can be imported (else the peer is "not installed"):
/// both jobs are started once and take turns, block by block on each size,
/// so that both see the same machine (this VM's other tenants come and go).
/// algbw = bytes / p50, busbw = algbw * 2(n-1)/n (nccl-tests' definitions).
///
/// 8 and 16 ranks oversubscribe this project's 2 vCPUs (16 processes of about
/// ten threads each, and as many Python ones): there each size runs fewer
/// calls per block, at most 10 blocks (at least 4, more until the size has
/// had its time cap), only ours and bare2 (no `checked` group, which would be
/// one more full mesh of connections and threads per rank, and no bare), and,
/// in --quick mode, two small sizes. CORODIST_ALLREDUCE_RANKS=8,16 (a
/// comma-separated list) runs only those rank counts.
///
/// Algorithms: ours (and bare, bare2) run Gloo's bcube up to
/// gloo_options::bcube_max_bytes (1 MiB) and its ring above; PyTorch 1.13's
/// ProcessGroupGloo (AsyncAllreduceWork::allreduce) never sets the algorithm
/// of its gloo::AllreduceOptions, and gloo::allreduce runs the ring when it
/// is unset: the ring at every size. Each row says which in its JSON
/// (`algorithm`, `peer_algorithm`), and a `# allreduce:` line per rank count.

#include "harness.hpp"
#include "peers.hpp"
#include "turn_jobs.hpp"

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>

#if CORODIST_BENCH_GLOO
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#endif

#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corodist::bench {
namespace {

namespace cc = corodist::collective;
using clock_type = std::chrono::steady_clock;

struct size_case {
  std::size_t bytes;
  int iters; // per block
};

/// What one job runs per block: a set of these bits.
enum variant : unsigned { v_ours = 1, v_checked = 2, v_bare = 4, v_bare2 = 8 };
constexpr int variant_count = 4;

/// How one rank count is measured.
struct rank_plan {
  int ranks;
  std::vector<size_case> sizes;
  int blocks;     ///< turns per size and job, at most
  int min_blocks; ///< turns per size and job, at least, whatever the cap
  std::chrono::seconds cap; ///< no further turn of a size once its turns took this long
  int warmup;     ///< untimed calls the first time a job sees a size
  unsigned variants;
};

std::vector<rank_plan> plans(bool quick) {
  constexpr unsigned all = v_ours | v_checked | v_bare | v_bare2;
  // 8 and 16 ranks: ours and bare2 (Gloo driven as PyTorch drives it), so
  // that most of the time goes to ours and the peer.
  constexpr unsigned many = v_ours | v_bare2;
  constexpr auto none = std::chrono::seconds(3600);
  if (quick)
    return {
        {2, {{4 << 10, 30}, {256 << 10, 12}, {4 << 20, 4}, {64 << 20, 1}}, 8, 8, none, 3, all},
        {4, {{4 << 10, 30}, {256 << 10, 12}, {4 << 20, 4}, {64 << 20, 1}}, 8, 8, none, 3, all},
        {8, {{4 << 10, 10}, {256 << 10, 5}}, 2, 2, std::chrono::seconds(5), 2, many},
        {16, {{4 << 10, 5}, {256 << 10, 3}}, 2, 2, std::chrono::seconds(5), 2, many},
    };
  // 2 and 4 ranks: 8 blocks, a multiple of the 4 variants' rotation.
  const std::vector<size_case> sizes{{4 << 10, 100}, {16 << 10, 100}, {64 << 10, 75}, {256 << 10, 38},
                                     {1 << 20, 20},  {4 << 20, 8},    {16 << 20, 4},  {64 << 20, 2}};
  return {
      {2, sizes, 8, 8, none, 3, all},
      {4, sizes, 8, 8, none, 3, all},
      // 8 and 16 ranks: an even number of blocks (2 variants' rotation);
      // a size stops after 4 once its turns took the cap.
      {8,
       {{4 << 10, 20}, {16 << 10, 20}, {64 << 10, 15}, {256 << 10, 10},
        {1 << 20, 6}, {4 << 20, 3}, {16 << 20, 2}, {64 << 20, 1}},
       10, 4, std::chrono::seconds(20), 1, many},
      {16,
       {{4 << 10, 10}, {16 << 10, 10}, {64 << 10, 8}, {256 << 10, 6},
        {1 << 20, 4}, {4 << 20, 2}, {16 << 20, 1}, {64 << 20, 1}},
       10, 4, std::chrono::seconds(30), 1, many},
  };
}

constexpr auto step_timeout = std::chrono::minutes(5);

std::string size_name(std::size_t bytes) {
  return bytes >= (1 << 20) ? fmt::format("{}MiB", bytes >> 20) : fmt::format("{}KiB", bytes >> 10);
}

/// The Gloo algorithm ours (and bare, bare2) run for `bytes`.
const char* our_algorithm(std::size_t bytes) {
  return bytes <= cc::gloo_options::default_bcube_max_bytes ? "bcube" : "ring";
}

/// The Gloo algorithm PyTorch 1.13 runs at every size: ProcessGroupGloo's
/// AsyncAllreduceWork leaves gloo::AllreduceOptions' algorithm UNSPECIFIED,
/// which gloo::allreduce runs as the ring.
constexpr const char* peer_algorithm = "ring";

// Debian's python3-torch runs only under /usr/bin/python3 (peers.cpp checks it).
constexpr const char* python = "/usr/bin/python3";

/// Rank 0's figures for one size: "RESULT <bytes> <p50_us> <p99_us>
/// [<checked_p50_us> <bare_p50_us> <bare2_p50_us> [<samples>]]" ("nan" where
/// a variant did not run; the peer writes "RESULT <bytes> <p50_us> <p99_us> <samples>").
struct result {
  double p50_us = not_applicable;
  double p99_us = not_applicable;
  double checked_p50_us = not_applicable;
  double bare_p50_us = not_applicable;
  double bare2_p50_us = not_applicable;
  double samples = not_applicable;
};

bool parse_result(const std::string& line, std::map<std::size_t, result>& out, bool peer) {
  auto words = result_words(line);
  if (!words || words->empty())
    return false;
  const auto bytes = static_cast<std::size_t>(words->front());
  const std::vector<double> v(words->begin() + 1, words->end());
  if (v.size() < 2)
    return false;
  result r;
  r.p50_us = v[0];
  r.p99_us = v[1];
  if (peer) {
    if (v.size() >= 3)
      r.samples = v[2];
  } else if (v.size() >= 5) {
    r.checked_p50_us = v[2];
    r.bare_p50_us = v[3];
    r.bare2_p50_us = v[4];
    if (v.size() >= 6)
      r.samples = v[5];
  }
  out[bytes] = r;
  return true;
}

/// The rank counts to run: CORODIST_ALLREDUCE_RANKS (e.g. "8,16") when set, else all.
std::vector<rank_plan> selected_plans(bool quick) {
  auto all = plans(quick);
  const char* env = std::getenv("CORODIST_ALLREDUCE_RANKS");
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
        fmt::format("allreduce suite: CORODIST_ALLREDUCE_RANKS={} names none of 2, 4, 8, 16", env));
  return out;
}

constexpr const char* suite_name = "allreduce suite";

#if CORODIST_BENCH_GLOO

/// One rank of our job. Rank 0 reads commands from `control` and passes them
/// on (an untimed broadcast), and writes answers to `output`. The `checked`
/// group is made only when `variants` has v_checked.
int rank_main(int rank, int n, const std::string& dir, int control, int output, unsigned variants) {
  event_loop loop;
  loop.start();
  cc::gloo_options o;
  o.host = "127.0.0.1";
  o.timeout = std::chrono::minutes(30); // includes the peer's turns
  auto pg = cc::gloo_group::create_sync(
      loop, fmt::format("file://{}/store?rank={}&world_size={}&timeout=300", dir, rank, n), o);
  std::shared_ptr<cc::gloo_group> checked;
  if (variants & v_checked) {
    o.check_calls = true;
    o.prefix = "checked";
    checked = cc::gloo_group::create_sync(
        loop, fmt::format("file://{}/store2?rank={}&world_size={}&timeout=300", dir, rank, n), o);
  }

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
  auto bare_allreduce = [&](std::vector<float>& v) {
    gloo::AllreduceOptions opts(bare);
    opts.setOutput(v.data(), v.size());
    opts.setAlgorithm(v.size() * sizeof(float) <= cc::gloo_options::default_bcube_max_bytes
                          ? gloo::AllreduceOptions::Algorithm::BCUBE
                          : gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag++);
    gloo::allreduce(opts);
  };

  // bare2: two plain threads take the calls in turn (each waits for its turn).
  std::mutex m;
  std::condition_variable cv;
  std::vector<float>* job_buffer = nullptr;
  std::uint64_t issued = 0, taken = 0, finished = 0;
  bool stopping = false;
  std::vector<std::thread> pair;
  for (int t = 0; t < 2; ++t)
    pair.emplace_back([&] {
      std::unique_lock lk(m);
      for (;;) {
        cv.wait(lk, [&] { return stopping || taken < issued; });
        if (stopping)
          return;
        ++taken;
        auto* v = job_buffer;
        lk.unlock();
        bare_allreduce(*v);
        lk.lock();
        ++finished;
        cv.notify_all();
      }
    });
  auto bare2_allreduce = [&](std::vector<float>& v) {
    std::unique_lock lk(m);
    job_buffer = &v;
    const auto mine = ++issued;
    cv.notify_all();
    cv.wait(lk, [&] { return finished >= mine; });
  };

  struct per_size {
    std::vector<float> v; // zeros stay zeros: no overflow, no denormals
    latency_recorder ours, with_check, direct, direct2;
    int blocks = 0;
  };
  std::map<std::size_t, per_size> sizes;
  std::optional<line_reader> commands;
  if (rank == 0) {
    commands.emplace(control, suite_name);
    write_line(output, "READY", suite_name);
  }
  auto ex = loop.get_executor();
  for (;;) {
    std::int64_t cmd[5] = {0, 0, 0, 0, 0}; // run?, bytes, iters, warmup, variants
    if (rank == 0) {
      auto line = commands->next(std::chrono::hours(1), "the benchmark");
      std::istringstream in(line.value_or("QUIT"));
      std::string word;
      in >> word;
      if (word == "RUN" && (in >> cmd[1] >> cmd[2] >> cmd[3] >> cmd[4]))
        cmd[0] = 1;
    }
    pg->broadcast(cc::tensor_view(cmd, 5, cc::dtype::int64), 0).get();
    if (cmd[0] == 0)
      break;
    const auto bytes = static_cast<std::size_t>(cmd[1]);
    const int iters = static_cast<int>(cmd[2]);
    const int warmup = static_cast<int>(cmd[3]);
    const auto run = static_cast<unsigned>(cmd[4]) & (variants | ~unsigned{v_checked});
    auto [it, fresh] = sizes.try_emplace(bytes);
    auto& s = it->second;
    if (s.v.size() != bytes / sizeof(float)) {
      // Sizes come one after another: the last one's buffer is done with
      // (16 ranks would keep 16 of each).
      for (auto& [other, done] : sizes)
        if (other != bytes)
          std::vector<float>().swap(done.v);
      s.v.assign(bytes / sizeof(float), 0.0f);
    }
    if (fresh) {
      for (int i = 0; i < warmup; ++i) {
        if (run & v_ours)
          pg->allreduce(s.v).get();
        if (run & v_checked)
          checked->allreduce(s.v).get();
        if (run & v_bare)
          bare_allreduce(s.v);
        if (run & v_bare2)
          bare2_allreduce(s.v);
      }
    }
    auto timed = [&](cc::gloo_group& g, latency_recorder& rec, int n) {
      run_blocking(ex, [&]() -> asio::awaitable<void> {
        for (int i = 0; i < n; ++i) {
          const auto t0 = clock_type::now();
          co_await g.allreduce(s.v);
          rec.add(clock_type::now() - t0);
        }
      }());
    };
    auto timed_bare = [&](auto&& call, latency_recorder& rec, int n) {
      for (int i = 0; i < n; ++i) {
        const auto t0 = clock_type::now();
        call(s.v);
        rec.add(clock_type::now() - t0);
      }
    };
    // One run of each variant per block, one after another, starting with a
    // different one each block (the first after the peer's turn runs on a
    // machine that is still settling).
    std::vector<int> order;
    for (int k = 0; k < variant_count; ++k)
      if (run & (1u << k))
        order.push_back(k);
    const auto first = order.empty() ? 0 : static_cast<std::size_t>(s.blocks++) % order.size();
    for (std::size_t k = 0; k < order.size(); ++k) {
      switch (order[(first + k) % order.size()]) {
      case 0: timed(*pg, s.ours, iters); break;
      case 1: timed(*checked, s.with_check, iters); break;
      case 2: timed_bare(bare_allreduce, s.direct, iters); break;
      default: timed_bare(bare2_allreduce, s.direct2, iters); break;
      }
    }
    if (rank == 0)
      write_line(output, "DONE", suite_name);
  }
  {
    std::lock_guard lk(m);
    stopping = true;
  }
  cv.notify_all();
  for (auto& t : pair)
    t.join();
  if (rank == 0)
    for (auto& [bytes, s] : sizes)
      write_line(output, fmt::format("RESULT {} {} {} {} {} {} {}", bytes, s.ours.percentile(0.5),
                                     s.ours.percentile(0.99), s.with_check.percentile(0.5), s.direct.percentile(0.5),
                                     s.direct2.percentile(0.5), s.ours.size()),
                 suite_name);
  (checked ? checked : pg)->barrier().get();
  return 0;
}

/// Forks our `n` rank processes, which run `variants` (bits of `variant`).
std::unique_ptr<turn_job> start_ours(int n, const std::string& dir, unsigned variants) {
  return fork_job(suite_name, fmt::format("corodist's {} ranks", n), n, [&](int r, int control, int output) {
    return rank_main(r, n, dir, control, output, variants);
  });
}

#endif

/// The smaller of the present figures; NaN when neither is.
double min_present(double a, double b) {
  if (std::isnan(a))
    return b;
  if (std::isnan(b))
    return a;
  return std::min(a, b);
}

/// Prints a `# allreduce:` line to the table (between the rows).
void comment(context& ctx, const std::string& text) {
  if (ctx.status)
    ctx.status->pause();
  fmt::print(ctx.table_out, "# allreduce: {}\n", text);
  std::fflush(ctx.table_out);
}

void run_allreduce_suite(context& ctx) {
#if CORODIST_BENCH_GLOO
  const auto rank_plans = selected_plans(ctx.quick);
  // Why PyTorch is not a peer here; nullopt when it is.
  std::optional<std::string> no_peer;
  const auto script = bench_script("torch_allreduce_peer.py");
  if (!ctx.peers)
    no_peer = "skipped";
  else if (auto why = torch_unavailable())
    no_peer = *why;
  else if (script.empty())
    no_peer = "bench/torch_allreduce_peer.py not found";
  comment(ctx, fmt::format("algorithms: ours (and bare, bare2) Gloo's bcube up to {} (gloo_options::bcube_max_bytes), "
                           "the ring above; PyTorch 1.13 Gloo's ring at every size (ProcessGroupGloo leaves "
                           "gloo::AllreduceOptions' algorithm unset: gloo::allreduce runs the ring)",
                           size_name(cc::gloo_options::default_bcube_max_bytes)));
  for (const auto& plan : rank_plans) {
    const int n = plan.ranks;
    const auto started = clock_type::now();
    char tmpl[] = "/tmp/corodist_allreduce_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr)
      throw std::runtime_error("allreduce suite: mkdtemp failed");
    const std::string dir = tmpl;
    std::map<std::size_t, result> ours, peer;
    std::map<std::size_t, int> blocks_run;
    try {
      if (ctx.status)
        ctx.status->note(fmt::format("{} ranks{}", n, no_peer ? "" : " taking turns with PyTorch's"));
      auto our_job = start_ours(n, dir, plan.variants);
      std::unique_ptr<turn_job> peer_job;
      if (!no_peer)
        peer_job = spawn_job(suite_name, fmt::format("PyTorch's {} ranks", n),
                             {python, script, "--ranks", std::to_string(n)});
      our_job->ready();
      if (peer_job)
        peer_job->ready();
      for (const auto& c : plan.sizes) {
        if (ctx.status)
          ctx.status->note(fmt::format("{} ranks, {}", n, size_name(c.bytes)));
        // Turns of both jobs until `blocks`, or `min_blocks` once the size has had its cap.
        const auto size_started = clock_type::now();
        int b = 0;
        while (b < plan.blocks && (b < plan.min_blocks || clock_type::now() - size_started < plan.cap)) {
          const auto words = fmt::format("{} {} {} {}", c.bytes, c.iters, plan.warmup, plan.variants);
          our_job->run(words);
          if (peer_job)
            peer_job->run(words);
          ++b;
        }
        blocks_run[c.bytes] = b;
      }
      for (const auto& line : our_job->finish())
        parse_result(line, ours, false);
      if (peer_job)
        for (const auto& line : peer_job->finish())
          parse_result(line, peer, true);
    } catch (...) {
      remove_tree(dir);
      throw;
    }
    remove_tree(dir);
    const double took_s = std::chrono::duration<double>(clock_type::now() - started).count();
    comment(ctx, fmt::format("{} ranks: {} sizes, {} to {} blocks per size of each job ({} s cap per size), "
                             "variants{}{}{}{}, {:.1f} s with the peer's turns and both jobs' start",
                             n, plan.sizes.size(), plan.min_blocks, plan.blocks, plan.cap.count(),
                             plan.variants & v_ours ? " ours" : "", plan.variants & v_checked ? " checked" : "",
                             plan.variants & v_bare ? " bare" : "", plan.variants & v_bare2 ? " bare2" : "", took_s));
    for (const auto& c : plan.sizes) {
      auto it = ours.find(c.bytes);
      if (it == ours.end())
        throw std::runtime_error("allreduce suite: no result for " + size_name(c.bytes));
      const auto& r = it->second;
      record rec;
      rec.suite = "allreduce";
      rec.name = fmt::format("gloo_r{}_{}", n, size_name(c.bytes));
      rec.p50_us = r.p50_us;
      rec.p99_us = r.p99_us;
      const double algbw = static_cast<double>(c.bytes) / (r.p50_us * 1e-6) / 1e9;
      rec.gbytes_per_s = algbw;
      rec.extra = {{"ranks", n},
                   {"bytes", static_cast<double>(c.bytes)},
                   {"algbw_gbps", algbw},
                   {"busbw_gbps", algbw * 2.0 * (n - 1) / n},
                   {"samples", r.samples},
                   {"blocks", blocks_run[c.bytes]}};
      auto add = [&](const char* key, double v) {
        if (!std::isnan(v))
          rec.extra.emplace_back(key, v);
      };
      add("bare_p50_us", r.bare_p50_us);
      add("bare2_p50_us", r.bare2_p50_us);
      add("overhead_pct", (r.p50_us / min_present(r.bare_p50_us, r.bare2_p50_us) - 1.0) * 100.0);
      add("checked_p50_us", r.checked_p50_us);
      add("check_pct", (r.checked_p50_us / r.p50_us - 1.0) * 100.0);
      rec.text = {{"algorithm", our_algorithm(c.bytes)}};
      if (auto p = peer.find(c.bytes); p != peer.end()) {
        peer_result torch;
        torch.name = "pytorch";
        torch.p50_us = p->second.p50_us;
        rec.peers = {torch};
        add("peer_p99_us", p->second.p99_us);
        add("peer_samples", p->second.samples);
        rec.text.emplace_back("peer_algorithm", peer_algorithm);
      } else {
        rec.peers = {peer_result::missing("pytorch", no_peer.value_or("no result"))};
      }
      ctx.report(std::move(rec));
    }
  }
#else
  record rec;
  rec.suite = "allreduce";
  rec.name = "gloo (corodist-bench was built without Gloo)";
  ctx.report(std::move(rec));
#endif
}

const suite_registrar registrar("allreduce", &run_allreduce_suite, 50);

} // namespace
} // namespace corodist::bench
