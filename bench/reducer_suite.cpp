/// \file
/// Suite `reducer`: one DDP step over 100 MiB of float32 gradients (the
/// parameters of a chain of 25 Linear(1024, 1024) layers: 50 parameters) in
/// 25 MiB buckets (the first 1 MiB), on 2 and 4 rank processes forked from
/// this one, over loopback Gloo. The backward computation is simulated
/// between the gradient hooks: `layer_ms` per layer (8 ms: 200 ms for the
/// chain, about the backward of this chain on a batch of 64 at 30 GFLOP/s),
/// last layer first, either waiting (`wait`: sleeping, as a host thread does
/// while a GPU computes) or spinning on the CPU (`busy`: competing with
/// communication for this machine's cores). Each rank measures, in turn:
///   * comm: the reducer's allreduces (the same bucket sizes) issued directly
///     on the process group, all at once, then awaited;
///   * nocompute: a reducer step with every gradient marked at once;
///   * compute: the simulated backward alone;
///   * step: the reducer step with the simulated backward between the hooks;
/// each after a barrier; rank 0 reports p50s. overhead_pct = nocompute / comm
/// - 1; overlap_pct = (compute + comm - step) / comm. What bounds the
/// overhead, in the same run: the rank's CPU time (all its threads) in comm,
/// nocompute and local (the copies-mode step without communication: the
/// reducer's copies), and the machine's idle share during comm (/proc/stat):
/// when the cores are saturated (idle 0), the copies cannot hide behind the
/// allreduces and cost at least local_cpu / comm_cpu (cpu_bound_pct).
/// CORODIST_REDUCER_RANKS=2 runs only that rank count;
/// CORODIST_REDUCER_PROFILE_STEPS=N runs only N copies-mode steps without
/// computation (for a profiler; the suite then reports no rows and fails).
/// The peer is PyTorch's
/// DDP on gloo with the same chain and the same simulated backward
/// (bench/torch_ddp_peer.py), run after ours.

#include "forked_ranks.hpp"
#include "harness.hpp"
#include "peers.hpp"

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/ddp/reducer.hpp>

#include <fmt/core.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace corodist::bench {
namespace {

namespace cc = corodist::collective;
namespace dd = corodist::ddp;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t layers = 25, width = 1024;
constexpr auto layer_time = std::chrono::milliseconds(8);
constexpr const char* python = "/usr/bin/python3";

struct figures {
  double step_us = not_applicable, compute_us = not_applicable, comm_us = not_applicable,
         nocompute_us = not_applicable, overlap_stat_pct = not_applicable, view_us = not_applicable,
         local_us = not_applicable, comm_cpu_us = not_applicable, nocompute_cpu_us = not_applicable,
         local_cpu_us = not_applicable, comm_idle_pct = not_applicable;
  int buckets = 0;
};

/// The simulated backward, one layer at a time. Waiting: the host thread
/// waits for each layer's end on a fixed timeline that starts with the
/// backward (as a GPU's kernels finish on their own schedule, whatever the
/// host thread's wake-up delays); busy: each layer spins for its time on this
/// thread's CPU (so it is slowed by whatever else runs).
/// CPU time all threads of this process have used so far, in microseconds.
double process_cpu_us() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

/// The machine's CPU time so far from /proc/stat's first line: {idle (idle +
/// iowait), total}, in clock ticks; {0, 0} if unreadable.
std::pair<double, double> machine_ticks() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  f >> cpu;
  double idle = 0, total = 0, v = 0;
  for (int k = 0; k < 8 && f >> v; ++k) { // user nice system idle iowait irq softirq steal
    total += v;
    if (k == 3 || k == 4)
      idle += v;
  }
  return {idle, total};
}

class simulated_backward {
public:
  explicit simulated_backward(bool busy) : busy_(busy), start_(clock_type::now()) {}
  void layer() {
    ++done_;
    if (!busy_) {
      std::this_thread::sleep_until(start_ + done_ * layer_time);
      return;
    }
    const auto end = clock_type::now() + layer_time;
    volatile double x = 1.0;
    while (clock_type::now() < end)
      for (int i = 0; i < 1000; ++i)
        x = x * 1.0000001 + 1e-9;
  }

private:
  bool busy_;
  clock_type::time_point start_;
  int done_ = 0;
};

/// One rank: runs every variant; rank 0 writes
/// "RESULT <mode> <step> <compute> <comm> <nocompute> <overlap_stat> <buckets> <view> <local> <comm_cpu>
/// <nocompute_cpu> <local_cpu> <comm_idle>" lines to `out`.
int rank_main(int rank, int n, const std::string& dir, int iters, int warmup, int out) {
  event_loop loop;
  loop.start();
  cc::gloo_options o;
  o.host = "127.0.0.1";
  o.timeout = std::chrono::minutes(10);
  auto pg = cc::gloo_group::create_sync(
      loop, fmt::format("file://{}/store?rank={}&world_size={}&timeout=300", dir, rank, n), o);

  std::vector<std::vector<float>> values, grads;
  std::vector<dd::parameter> params;
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t sz : {width * width, width}) {
      values.emplace_back(sz, 0.001f);
      grads.emplace_back(sz, 0.0f);
      params.emplace_back(std::span<float>(values.back()), std::span<float>(grads.back()));
    }
  dd::reducer red(pg, params); // defaults: 25 MiB buckets, the first 1 MiB, copies
  auto& layout = red.layout();
  // The same in bucket-view mode (no copies), for nocompute_view.
  std::vector<dd::parameter> view_params = params;
  for (auto& p : view_params)
    p.grad = nullptr;
  dd::reducer_options vo;
  vo.gradient_as_bucket_view = true;
  dd::reducer view(pg, view_params, vo);
  // The same as `red` with a hook that communicates nothing: its step is the
  // reducer's own work (the copies, the hooks' bookkeeping), for `local`.
  std::vector<std::vector<float>> local_grads(grads);
  std::vector<dd::parameter> local_params = params;
  for (std::size_t k = 0; k < local_params.size(); ++k)
    local_params[k].grad = local_grads[k].data();
  dd::reducer local(pg, local_params);
  local.register_comm_hook([](dd::grad_bucket&) -> asio::awaitable<void> { co_return; });

  std::vector<std::vector<float>> direct; // the same bucket sizes, for `comm`
  for (const auto& b : layout.buckets)
    direct.emplace_back(b.count, 0.0f);

  auto fill = [&](std::size_t k) { std::fill(grads[k].begin(), grads[k].end(), 1.0f); };
  auto timed = [&](auto&& body) {
    pg->barrier().get();
    const auto t0 = clock_type::now();
    body();
    return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
  };
  // The same, also adding this process's CPU time (all its threads: the
  // caller, the loop, Gloo's) to `cpu` and the machine's idle share to `idle`.
  auto timed_cpu = [&](auto&& body, latency_recorder& cpu, latency_recorder* idle) {
    pg->barrier().get();
    const auto m0 = machine_ticks();
    const double c0 = process_cpu_us();
    const auto t0 = clock_type::now();
    body();
    const double wall = std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
    cpu.add_us(process_cpu_us() - c0);
    const auto m1 = machine_ticks();
    if (idle != nullptr && m1.second > m0.second)
      idle->add_us((m1.first - m0.first) / (m1.second - m0.second) * 100.0);
    return wall;
  };
  auto comm = [&] {
    std::vector<cc::work> ws;
    for (auto& d : direct)
      ws.push_back(pg->allreduce(d, cc::reduce_op::avg)); // as the reducer issues them
    for (auto& w : ws)
      w.get();
  };
  auto step = [&](bool compute, bool busy) {
    red.prepare_for_backward();
    simulated_backward backward(busy);
    for (std::size_t l = layers; l-- > 0;) {
      if (compute) { // the layer's backward: simulated time, then its gradients written
        backward.layer();
        fill(2 * l + 1);
        fill(2 * l);
      }
      red.mark_grad_ready(2 * l + 1);
      red.mark_grad_ready(2 * l);
    }
    red.finalize_sync();
  };
  auto compute_alone = [&](bool busy) {
    simulated_backward backward(busy);
    for (std::size_t l = layers; l-- > 0;) {
      backward.layer();
      fill(2 * l + 1);
      fill(2 * l);
    }
  };
  auto view_step = [&] {
    view.prepare_for_backward();
    for (std::size_t k = params.size(); k-- > 0;)
      view.mark_grad_ready(k);
    view.finalize_sync();
  };
  auto local_step = [&] {
    local.prepare_for_backward();
    for (std::size_t k = params.size(); k-- > 0;)
      local.mark_grad_ready(k);
    local.finalize_sync();
  };
  for (int i = 0; i < warmup; ++i) { // includes the first iteration's bucket rebuild
    step(false, false);
    view_step();
    local_step();
    comm();
  }
  if (const char* only = std::getenv("CORODIST_REDUCER_PROFILE_STEPS")) { // a profile of the copies-mode step alone
    for (int i = 0, k = std::atoi(only); i < k; ++i)
      timed([&] { step(false, false); });
    pg->barrier().get();
    return 0;
  }
  for (bool busy : {false, true}) {
    latency_recorder s_step, s_compute, s_comm, s_nocompute, s_overlap, s_view, s_local, c_comm, c_nocompute, c_local,
        i_comm;
    for (int i = 0; i < iters; ++i) {
      s_comm.add_us(timed_cpu(comm, c_comm, &i_comm));
      s_nocompute.add_us(timed_cpu([&] { step(false, busy); }, c_nocompute, nullptr));
      s_view.add_us(timed(view_step));
      s_local.add_us(timed_cpu(local_step, c_local, nullptr));
      s_compute.add_us(timed([&] { compute_alone(busy); }));
      s_step.add_us(timed([&] { step(true, busy); }));
      s_overlap.add_us(red.last_stats().overlap_ratio() * 100.0);
      if (rank == 0 && std::getenv("CORODIST_REDUCER_DEBUG")) {
        const auto& st = red.last_stats();
        std::string b;
        for (const auto& k : st.buckets)
          b += fmt::format(" [{} MiB ready->reduced {:.1f} ms comm {:.1f} ms]", k.bytes >> 20, k.ready_to_reduced.count() / 1e6,
                           k.communication.count() / 1e6);
        std::fprintf(stderr, "%s step: backward %.1f ms, finalize wait %.1f ms, comm %.1f ms, overlapped %.1f ms;%s\n",
                     busy ? "busy" : "wait", st.backward.count() / 1e6, st.finalize_wait.count() / 1e6,
                     st.communication.count() / 1e6, st.overlapped.count() / 1e6, b.c_str());
      }
    }
    if (rank == 0) {
      const auto line = fmt::format("RESULT {} {} {} {} {} {} {} {} {} {} {} {} {}\n", busy ? "busy" : "wait",
                                    s_step.percentile(0.5), s_compute.percentile(0.5), s_comm.percentile(0.5),
                                    s_nocompute.percentile(0.5), s_overlap.percentile(0.5), layout.buckets.size(),
                                    s_view.percentile(0.5), s_local.percentile(0.5), c_comm.percentile(0.5),
                                    c_nocompute.percentile(0.5), c_local.percentile(0.5), i_comm.percentile(0.5));
      if (::write(out, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
        return 3;
    }
  }
  pg->barrier().get();
  return 0;
}

/// Forks `n` ranks, waits for them (at most 10 min), returns rank 0's figures by mode.
std::map<std::string, figures> run_ours(int n, int iters, int warmup) {
  char tmpl[] = "/tmp/corodist_reducer_XXXXXX";
  if (::mkdtemp(tmpl) == nullptr)
    throw std::runtime_error("reducer suite: mkdtemp failed");
  const std::string dir = tmpl;
  std::string text;
  try {
    text = run_forked("reducer suite", n,
                      [&](int r, int out) { return rank_main(r, n, dir, iters, warmup, out); },
                      std::chrono::minutes(10));
  } catch (...) {
    remove_tree(dir);
    throw;
  }
  remove_tree(dir);
  std::map<std::string, figures> out;
  std::istringstream in(text);
  std::string tag, mode;
  figures f;
  while (in >> tag >> mode >> f.step_us >> f.compute_us >> f.comm_us >> f.nocompute_us >> f.overlap_stat_pct >>
         f.buckets >> f.view_us >> f.local_us >> f.comm_cpu_us >> f.nocompute_cpu_us >> f.local_cpu_us >>
         f.comm_idle_pct)
    if (tag == "RESULT")
      out[mode] = f;
  return out;
}

/// The rank counts to run: CORODIST_REDUCER_RANKS (e.g. "2") when set, else 2 and 4.
std::vector<int> selected_ranks() {
  const char* env = std::getenv("CORODIST_REDUCER_RANKS");
  if (env == nullptr || *env == '\0')
    return {2, 4};
  std::vector<int> out;
  std::istringstream in(env);
  for (std::string word; std::getline(in, word, ',');)
    if (word == "2" || word == "4")
      out.push_back(std::atoi(word.c_str()));
  if (out.empty())
    throw std::runtime_error("reducer suite: CORODIST_REDUCER_RANKS lists neither 2 nor 4");
  return out;
}

void run_reducer_suite(context& ctx) {
  const int iters = ctx.quick ? 3 : 7;
  const int warmup = 2;
  std::optional<std::string> no_peer;
  const auto script = bench_script("torch_ddp_peer.py");
  if (!ctx.peers)
    no_peer = "skipped";
  else if (auto why = torch_unavailable())
    no_peer = *why;
  else if (script.empty())
    no_peer = "bench/torch_ddp_peer.py not found";
  for (int n : selected_ranks()) {
    if (ctx.status)
      ctx.status->note(fmt::format("{} ranks", n));
    const auto ours = run_ours(n, iters, warmup);
    peer_output torch;
    if (!no_peer)
      torch = run_peer(ctx, fmt::format("PyTorch DDP, {} ranks", n),
                       {python, script, "--ranks", std::to_string(n), "--iters", std::to_string(iters), "--warmup",
                        std::to_string(warmup), "--layer-ms", std::to_string(layer_time.count())},
                       std::chrono::seconds(600));
    for (const char* mode : {"wait", "busy"}) {
      auto it = ours.find(mode);
      if (it == ours.end())
        throw std::runtime_error(fmt::format("reducer suite: no result for {} ranks, {}", n, mode));
      const auto& f = it->second;
      record rec;
      rec.suite = "reducer";
      rec.name = fmt::format("step_r{}_{}", n, mode);
      rec.p50_us = f.step_us;
      rec.gbytes_per_s = static_cast<double>(layers * (width * width + width) * sizeof(float)) / (f.step_us * 1e-6) / 1e9;
      rec.extra = {{"ranks", n},
                   {"buckets", f.buckets},
                   {"layer_ms", static_cast<double>(layer_time.count())},
                   {"compute_us", f.compute_us},
                   {"comm_us", f.comm_us},
                   {"nocompute_us", f.nocompute_us},
                   {"overhead_pct", (f.nocompute_us / f.comm_us - 1.0) * 100.0},
                   {"nocompute_view_us", f.view_us},
                   {"overhead_view_pct", (f.view_us / f.comm_us - 1.0) * 100.0},
                   {"local_us", f.local_us},
                   {"local_pct", f.local_us / f.comm_us * 100.0},
                   {"comm_cpu_us", f.comm_cpu_us},
                   {"nocompute_cpu_us", f.nocompute_cpu_us},
                   {"local_cpu_us", f.local_cpu_us},
                   {"cpu_extra_pct", (f.nocompute_cpu_us / f.comm_cpu_us - 1.0) * 100.0},
                   {"cpu_bound_pct", f.local_cpu_us / f.comm_cpu_us * 100.0},
                   {"copy_gbps", 2.0 * static_cast<double>(layers * (width * width + width) * sizeof(float)) /
                                     (f.local_cpu_us * 1e-6) / 1e9},
                   {"comm_idle_pct", f.comm_idle_pct},
                   {"overlap_pct", (f.compute_us + f.comm_us - f.step_us) / f.comm_us * 100.0},
                   {"overlap_stat_pct", f.overlap_stat_pct}};
      if (no_peer) {
        rec.peers = {peer_result::missing("pytorch", *no_peer)};
      } else {
        const std::string name = rec.name;
        rec.peers = {peer_from("pytorch", torch, {{"case", name}}, "p50_us")};
        if (const auto* line = torch.find({{"case", name}}))
          rec.extra.emplace_back("peer_compute_us", line->number("compute_us"));
      }
      ctx.report(std::move(rec));
    }
  }
}

const suite_registrar registrar("reducer", &run_reducer_suite, 55, 4);

} // namespace
} // namespace corodist::bench
