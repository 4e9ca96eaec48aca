/// \file
/// Suite `gpu`: NCCL and the DDP reducer on CUDA device memory. Skipped, with
/// the reason on one line and no figures, where NCCL cannot run (no GPU, a
/// build without CUDA/NCCL).
///
///   * allreduce_<size>_r<n>: an in-place float32 allreduce (avg, as the
///     reducer issues them) of 1 MiB ... 1 GiB (powers of 4) on nccl_group, n
///     = the number of GPUs (ranks as threads of this process, one per GPU,
///     meeting in a hash_store). Per size, batches of back-to-back allreduces
///     after a barrier; p50 is the time per allreduce. gbytes_per_s is the bus
///     bandwidth, busbw = algbw * 2(n-1)/n (nccl-tests' definitions, algbw =
///     bytes / time); at n = 1 there is no communication (NCCL's one-rank
///     kernel scales the buffer in place) and gbytes_per_s is algbw, said in
///     the row's "bandwidth" text.
///   * sendrecv_pingpong_<size>_r2 and sendrecv_oneway_<size>_r2 (4 B ...
///     64 MiB, powers of 16 then 64 MiB; 2 GPUs or more, else skipped with a
///     line): send/recv between GPU 0 and GPU 1 (ranks as threads).
///     pingpong: rank 0 sends, rank 1 receives and sends back, per round
///     trip; p50 is half the round trip (the one-way latency). oneway: after
///     a barrier, rank 0 issues a batch of back-to-back sends that rank 1
///     receives; p50 is the time per message on the receiver,
///     gbytes_per_s = bytes / p50.
///   * all_to_all_single_<size>_r<n> (4 KiB ... 64 MiB per rank, powers of
///     4; n = the GPU count, 2 or more, else skipped): even splits, batches
///     after a barrier as allreduce's; algbw = the per-rank buffer's bytes /
///     time, gbytes_per_s = busbw = algbw * (n-1)/n (nccl-tests' alltoall).
///   * split_r<n> (n = the GPU count, 1 too): the time of one
///     nccl_group::split (ncclCommSplit, colors rank % 2, every rank its own
///     new communicator with its stream), on the slowest rank, p50 over
///     repetitions; the new groups are destroyed between them.
///   * reducer_<backend>_r<n>: one DDP step over 100 MiB of float32
///     parameters on GPU 0 (the reducer suite's chain of 25 Linear(1024,
///     1024): 50 parameters) in 25 MiB buckets (the first 1 MiB), on
///     nccl_group at world size 1 and on gloo_group at world size 2 (both
///     ranks on GPU 0; Gloo stages the CUDA buckets through pinned host
///     memory). The backward is simulated: per layer the host waits until
///     the layer's end on a fixed timeline (`layer_ms`, as a host thread
///     waits while the GPU computes), then queues the layer's gradients on
///     the backward's stream (device-to-device copies: the gradients'
///     kernels) and marks them ready. Timed, each after a barrier: comm (the
///     same bucket allreduces issued directly, all at once), nocompute (a step
///     with every gradient marked at once), compute (the simulated backward
///     alone), step (the step with the simulated backward); a step ends when
///     finalize returned and the backward's stream is idle. overhead_pct =
///     nocompute / comm - 1, overlap_pct = (compute + comm - step) / comm,
///     overlap_stat_pct = the reducer's own iteration_stats::overlap_ratio.
///     The peer is PyTorch's DDP on CUDA with the same model, buckets and
///     simulated backward (bench/torch_ddp_gpu_peer.py), when /usr/bin/python3
///     has torch with CUDA.

#include "harness.hpp"
#include "peers.hpp"
#include "support/on_threads.hpp"

#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/nccl_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/ddp/reducer.hpp>
#include <corodist/store/hash_store.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace corodist::bench {
namespace {

namespace cc = corodist::collective;
namespace dd = corodist::ddp;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t layers = 25, width = 1024;
constexpr std::size_t model_elements = layers * (width * width + width);
constexpr auto layer_time = std::chrono::milliseconds(2);
constexpr auto group_timeout = std::chrono::minutes(5);
constexpr const char* python = "/usr/bin/python3";
constexpr std::size_t mib = std::size_t{1} << 20;

double us_since(clock_type::time_point t0) {
  return std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
}


/// Polling settings for timing: completion is seen within 50 us (the
/// default backs off to 1 ms, which would blur the small sizes).
cc::nccl_options bench_nccl_options(int device, std::string prefix) {
  cc::nccl_options o;
  o.device = device;
  o.timeout = group_timeout;
  o.prefix = std::move(prefix);
  o.poll_interval = std::chrono::microseconds(10);
  o.max_poll_interval = std::chrono::microseconds(50);
  return o;
}

/// Back-to-back calls per sample for `bytes` per call: enough that launch and
/// poll costs are amortised (4 to 256, 512 MiB in all).
int batch_for(std::size_t bytes) {
  return static_cast<int>(std::clamp<std::size_t>((std::size_t{512} * mib) / bytes, 4, 256));
}

/// `reps` samples, each after a barrier on `pg`: `batch` calls of `issue`
/// back to back, then waiting for all; a sample is the time per call.
latency_recorder time_batches(cc::process_group& pg, int reps, int batch, const std::function<cc::work()>& issue) {
  latency_recorder lat(static_cast<std::size_t>(reps));
  std::vector<cc::work> ws;
  ws.reserve(static_cast<std::size_t>(batch));
  for (int rep = 0; rep < reps; ++rep) {
    pg.barrier().get();
    const auto t0 = clock_type::now();
    for (int b = 0; b < batch; ++b)
      ws.push_back(issue());
    for (auto& w : ws)
      w.get();
    ws.clear();
    lat.add_us(us_since(t0) / batch);
  }
  return lat;
}

/// Runs `body(rank, group, executor)` on `n` rank threads, rank r on GPU r
/// in an nccl_group named `prefix` (the ranks meet in one hash_store), each
/// with its own event loop (the executor); a barrier after the body.
void on_gpu_ranks(int n, const std::string& prefix,
                  const std::function<void(int, cc::nccl_group&, const asio::any_io_executor&)>& body) {
  event_loop store_loop;
  store_loop.start();
  auto store = std::make_shared<store::hash_store>(store_loop.get_executor());
  corodist::test::run_on_threads_or_throw(n, [&](int r) {
    event_loop loop;
    loop.start();
    const auto ex = loop.get_executor();
    auto pg = cc::nccl_group::create_sync(ex, store, r, n, bench_nccl_options(r, prefix));
    body(r, *pg, ex);
    pg->barrier().get();
  });
}

// ---- NCCL allreduce bandwidth ---------------------------------------------

struct allreduce_point {
  std::size_t bytes = 0;
  double p50_us = not_applicable, p99_us = not_applicable;
  int batch = 0;
};

/// Ranks as threads, one per GPU; every size in `sizes` (ascending), rank 0's figures.
std::vector<allreduce_point> measure_allreduce(int n, const std::vector<std::size_t>& sizes, int reps) {
  std::vector<allreduce_point> out(sizes.size());
  on_gpu_ranks(n, "bench/gpu/allreduce", [&](int r, cc::nccl_group& pg, const asio::any_io_executor&) {
    const auto where = cc::device::cuda(r);
    auto buf = cc::device_buffer::allocate(where, sizes.back());
    auto s = cc::cuda_stream::create(r);
    s.zero(buf.data(), buf.bytes()); // avg of zeros stays zero: no denormals, no overflow
    s.synchronize();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const cc::tensor_view v(buf.data(), sizes[i] / sizeof(float), cc::dtype::float32, where);
      const int batch = batch_for(sizes[i]);
      for (int w = 0; w < 3; ++w)
        pg.allreduce(v, cc::reduce_op::avg).get();
      const auto lat = time_batches(pg, reps, batch, [&] { return pg.allreduce(v, cc::reduce_op::avg); });
      if (r == 0)
        out[i] = {sizes[i], lat.percentile(0.5), lat.percentile(0.99), batch};
    }
  });
  return out;
}

std::string size_name(std::size_t bytes) {
  return bytes >= (std::size_t{1} << 30) ? fmt::format("{}GiB", bytes >> 30) : fmt::format("{}MiB", bytes >> 20);
}

void report_allreduce(context& ctx, int n, bool quick) {
  std::vector<std::size_t> sizes;
  for (std::size_t b = mib; b <= (std::size_t{1} << 30); b *= 4)
    sizes.push_back(b);
  if (ctx.status)
    ctx.status->note(fmt::format("NCCL allreduce, {} GPU(s)", n));
  const auto points = measure_allreduce(n, sizes, quick ? 3 : 7);
  for (const auto& p : points) {
    record rec;
    rec.suite = "gpu";
    rec.name = fmt::format("allreduce_{}_r{}", size_name(p.bytes), n);
    rec.p50_us = p.p50_us;
    rec.p99_us = p.p99_us;
    const double algbw = static_cast<double>(p.bytes) / (p.p50_us * 1e-6) / 1e9;
    rec.extra = {{"bytes", static_cast<double>(p.bytes)},
                 {"ranks", n},
                 {"batch", p.batch},
                 {"algbw_gbps", algbw}};
    if (n > 1) {
      const double busbw = algbw * 2.0 * (n - 1) / n;
      rec.gbytes_per_s = busbw;
      rec.extra.emplace_back("busbw_gbps", busbw);
      rec.text = {{"bandwidth", "busbw"}};
    } else {
      rec.gbytes_per_s = algbw;
      rec.text = {{"bandwidth", "algbw: world size 1, NCCL's one-rank kernel (avg in place), no communication; "
                                "busbw is not defined"}};
    }
    ctx.report(std::move(rec));
  }
  if (n == 1)
    fmt::print(ctx.table_out, "# gpu: 1 GPU: the allreduce rows are algbw of NCCL's one-rank kernel (no "
                              "communication, busbw undefined); more GPUs measure the fabric (busbw)\n");
}

// ---- NCCL send/recv, all_to_all_single, split --------------------------------

std::string bytes_name(std::size_t bytes) {
  if (bytes >= mib)
    return fmt::format("{}MiB", bytes / mib);
  if (bytes >= 1024)
    return fmt::format("{}KiB", bytes / 1024);
  return fmt::format("{}B", bytes);
}

struct p2p_point {
  std::size_t bytes = 0;
  double pingpong_p50_us = not_applicable, pingpong_p99_us = not_applicable;
  double oneway_p50_us = not_applicable, oneway_p99_us = not_applicable;
  int batch = 0;
};

/// Ranks 0 and 1 on GPUs 0 and 1; rank 0's ping-pong figures, rank 1's one-way ones.
std::vector<p2p_point> measure_p2p(const std::vector<std::size_t>& sizes, int reps) {
  std::vector<p2p_point> out(sizes.size());
  on_gpu_ranks(2, "bench/gpu/p2p", [&](int r, cc::nccl_group& pg, const asio::any_io_executor&) {
    const auto where = cc::device::cuda(r);
    auto buf = cc::device_buffer::allocate(where, sizes.back());
    auto s = cc::cuda_stream::create(r);
    s.zero(buf.data(), buf.bytes());
    s.synchronize();
    const int peer = 1 - r;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const cc::tensor_view v(buf.data(), sizes[i], cc::dtype::uint8, where);
      auto round_trip = [&] {
        if (r == 0) {
          auto a = pg.send(v, peer);
          auto b = pg.recv(v, peer);
          a.get();
          b.get();
        } else {
          auto a = pg.recv(v, peer);
          auto b = pg.send(v, peer);
          a.get();
          b.get();
        }
      };
      for (int w = 0; w < 3; ++w) // connects the pair, warms NCCL's buffers
        round_trip();
      const int trips = static_cast<int>(std::clamp<std::size_t>((std::size_t{256} * mib) / sizes[i], 4, 200));
      latency_recorder pingpong(static_cast<std::size_t>(reps));
      for (int rep = 0; rep < reps; ++rep) {
        pg.barrier().get();
        const auto t0 = clock_type::now();
        for (int t = 0; t < trips; ++t)
          round_trip();
        pingpong.add_us(us_since(t0) / trips / 2);
      }
      const int batch = batch_for(sizes[i]);
      const auto oneway =
          time_batches(pg, reps, batch, [&] { return r == 0 ? pg.send(v, peer) : pg.recv(v, peer); });
      if (r == 0) {
        out[i].bytes = sizes[i];
        out[i].pingpong_p50_us = pingpong.percentile(0.5);
        out[i].pingpong_p99_us = pingpong.percentile(0.99);
      } else {
        out[i].oneway_p50_us = oneway.percentile(0.5);
        out[i].oneway_p99_us = oneway.percentile(0.99);
        out[i].batch = batch;
      }
    }
  });
  return out;
}

void report_p2p(context& ctx, bool quick) {
  std::vector<std::size_t> sizes;
  for (std::size_t b = 4; b < 64 * mib; b *= 16)
    sizes.push_back(b);
  sizes.push_back(64 * mib);
  if (ctx.status)
    ctx.status->note("NCCL send/recv, GPUs 0 and 1");
  const auto points = measure_p2p(sizes, quick ? 3 : 7);
  for (const auto& p : points) {
    record ping;
    ping.suite = "gpu";
    ping.name = fmt::format("sendrecv_pingpong_{}_r2", bytes_name(p.bytes));
    ping.p50_us = p.pingpong_p50_us;
    ping.p99_us = p.pingpong_p99_us;
    ping.gbytes_per_s = static_cast<double>(p.bytes) / (p.pingpong_p50_us * 1e-6) / 1e9;
    ping.extra = {{"bytes", static_cast<double>(p.bytes)}, {"ranks", 2}};
    ping.text = {{"latency", "half the round trip"}};
    ctx.report(std::move(ping));
    record one;
    one.suite = "gpu";
    one.name = fmt::format("sendrecv_oneway_{}_r2", bytes_name(p.bytes));
    one.p50_us = p.oneway_p50_us;
    one.p99_us = p.oneway_p99_us;
    one.gbytes_per_s = static_cast<double>(p.bytes) / (p.oneway_p50_us * 1e-6) / 1e9;
    one.extra = {{"bytes", static_cast<double>(p.bytes)}, {"ranks", 2}, {"batch", p.batch}};
    one.text = {{"bandwidth", "one-way, per message of a back-to-back batch"}};
    ctx.report(std::move(one));
  }
}

/// all_to_all_single with even splits, ranks as threads on `n` GPUs; rank 0's figures.
std::vector<allreduce_point> measure_all_to_all(int n, const std::vector<std::size_t>& sizes, int reps) {
  std::vector<allreduce_point> out(sizes.size());
  on_gpu_ranks(n, "bench/gpu/all_to_all", [&](int r, cc::nccl_group& pg, const asio::any_io_executor&) {
    const auto where = cc::device::cuda(r);
    auto in = cc::device_buffer::allocate(where, sizes.back());
    auto result = cc::device_buffer::allocate(where, sizes.back());
    auto s = cc::cuda_stream::create(r);
    s.zero(in.data(), in.bytes());
    s.synchronize();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      // Whole float32 elements, a multiple of n.
      const std::size_t count = sizes[i] / sizeof(float) / static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
      const cc::tensor_view a(in.data(), count, cc::dtype::float32, where);
      const cc::tensor_view b(result.data(), count, cc::dtype::float32, where);
      const int batch = batch_for(sizes[i]);
      for (int w = 0; w < 3; ++w)
        pg.all_to_all_single(a, b).get();
      const auto lat = time_batches(pg, reps, batch, [&] { return pg.all_to_all_single(a, b); });
      if (r == 0)
        out[i] = {count * sizeof(float), lat.percentile(0.5), lat.percentile(0.99), batch};
    }
  });
  return out;
}

void report_all_to_all(context& ctx, int n, bool quick) {
  std::vector<std::size_t> sizes;
  for (std::size_t b = 4096; b <= 64 * mib; b *= 4)
    sizes.push_back(b);
  if (ctx.status)
    ctx.status->note(fmt::format("NCCL all_to_all_single, {} GPUs", n));
  const auto points = measure_all_to_all(n, sizes, quick ? 3 : 7);
  for (std::size_t i = 0; i < points.size(); ++i) {
    const auto& p = points[i];
    record rec;
    rec.suite = "gpu";
    rec.name = fmt::format("all_to_all_single_{}_r{}", bytes_name(sizes[i]), n);
    rec.p50_us = p.p50_us;
    rec.p99_us = p.p99_us;
    const double algbw = static_cast<double>(p.bytes) / (p.p50_us * 1e-6) / 1e9;
    const double busbw = algbw * (n - 1) / n;
    rec.gbytes_per_s = busbw;
    rec.extra = {{"bytes", static_cast<double>(p.bytes)},
                 {"ranks", n},
                 {"batch", p.batch},
                 {"algbw_gbps", algbw},
                 {"busbw_gbps", busbw}};
    rec.text = {{"bandwidth", "busbw = algbw * (n-1)/n (nccl-tests' alltoall)"}};
    ctx.report(std::move(rec));
  }
}

/// Time of nccl_group::split on `n` GPUs (the slowest rank's, per repetition).
void report_split(context& ctx, int n, bool quick) {
  if (ctx.status)
    ctx.status->note(fmt::format("ncclCommSplit, {} GPU(s)", n));
  const int reps = quick ? 3 : 7;
  std::vector<std::vector<double>> times(static_cast<std::size_t>(n), std::vector<double>(static_cast<std::size_t>(reps)));
  on_gpu_ranks(n, "bench/gpu/split", [&](int r, cc::nccl_group& pg, const asio::any_io_executor& ex) {
    for (int rep = -1; rep < reps; ++rep) { // rep -1: a warm-up
      pg.barrier().get();
      const auto t0 = clock_type::now();
      auto child = run_blocking(ex, pg.split(r % 2, r), "split");
      const double us = us_since(t0);
      if (!child)
        throw std::runtime_error("split: no group for a rank with a color");
      if (rep >= 0)
        times[static_cast<std::size_t>(r)][static_cast<std::size_t>(rep)] = us;
    }
  });
  latency_recorder lat(static_cast<std::size_t>(reps));
  for (int rep = 0; rep < reps; ++rep) {
    double worst = 0;
    for (int r = 0; r < n; ++r)
      worst = std::max(worst, times[static_cast<std::size_t>(r)][static_cast<std::size_t>(rep)]);
    lat.add_us(worst);
  }
  record rec;
  rec.suite = "gpu";
  rec.name = fmt::format("split_r{}", n);
  rec.p50_us = lat.percentile(0.5);
  rec.p99_us = lat.percentile(0.99);
  rec.extra = {{"ranks", n}, {"colors", n >= 2 ? 2 : 1}};
  rec.text = {{"operation", "nccl_group::split (ncclCommSplit, non-blocking, polled), the slowest rank"}};
  ctx.report(std::move(rec));
}

// ---- reducer step on device -------------------------------------------------

struct step_figures {
  double step_us = not_applicable, compute_us = not_applicable, comm_us = not_applicable,
         nocompute_us = not_applicable, overlap_stat_pct = not_applicable;
  int buckets = 0;
};

/// The reducer on `backend` ("nccl" or "gloo") with `n` ranks (threads), all
/// on GPU 0 for gloo, GPU r for nccl. Rank 0's p50s.
step_figures measure_reducer(const std::string& backend, int n, int iters, int warmup) {
  event_loop store_loop;
  store_loop.start();
  auto store = std::make_shared<store::hash_store>(store_loop.get_executor());
  step_figures out;
  corodist::test::run_on_threads_or_throw(n, [&](int r) {
    event_loop loop;
    loop.start();
    std::shared_ptr<cc::process_group> pg;
    int dev = 0;
    if (backend == "nccl") {
      dev = r;
      pg = cc::nccl_group::create_sync(loop.get_executor(), store, r, n, bench_nccl_options(dev, "bench/gpu/reducer"));
    } else {
      cc::gloo_options o;
      o.host = "127.0.0.1";
      o.timeout = group_timeout;
      o.prefix = "bench/gpu/gloo";
      pg = cc::gloo_group::create_sync(store, r, n, o);
    }
    const auto where = cc::device::cuda(dev);
    auto backward_stream = cc::cuda_stream::create(dev);
    const std::size_t bytes = model_elements * sizeof(float);
    auto values = cc::device_buffer::allocate(where, bytes);
    auto grads = cc::device_buffer::allocate(where, bytes);
    auto source = cc::device_buffer::allocate(where, bytes); // what the gradients' "kernels" write
    {
      std::vector<float> host(model_elements, 0.001f);
      backward_stream.copy(values.data(), host.data(), bytes);
      std::fill(host.begin(), host.end(), 1.0f);
      backward_stream.copy(source.data(), host.data(), bytes);
      backward_stream.zero(grads.data(), bytes);
      backward_stream.synchronize();
    }
    std::vector<dd::parameter> params;
    std::vector<std::size_t> offsets; // element offset of each parameter
    std::size_t off = 0;
    for (std::size_t l = 0; l < layers; ++l)
      for (std::size_t sz : {width * width, width}) {
        offsets.push_back(off);
        params.emplace_back(static_cast<float*>(values.data()) + off, static_cast<float*>(grads.data()) + off, sz,
                            cc::dtype::float32, where, fmt::format("layer{}.{}", l, sz == width ? "bias" : "weight"));
        off += sz;
      }
    dd::reducer_options ro; // defaults: 25 MiB buckets, the first 1 MiB, copies
    ro.stream = backward_stream.native();
    dd::reducer red(pg, params, ro);

    // The gradient of parameter k, "computed": a copy queued on the backward's stream.
    auto produce = [&](std::size_t k) {
      backward_stream.copy(static_cast<float*>(grads.data()) + offsets[k], static_cast<float*>(source.data()) + offsets[k],
                           params[k].bytes());
    };
    auto timed = [&](auto&& body) {
      pg->barrier().get();
      const auto t0 = clock_type::now();
      body();
      return us_since(t0);
    };
    std::vector<cc::device_buffer> direct; // the bucket sizes, for `comm`
    auto make_direct = [&] {
      direct.clear();
      for (const auto& b : red.layout().buckets) {
        direct.push_back(cc::device_buffer::allocate(where, b.bytes()));
        backward_stream.zero(direct.back().data(), b.bytes());
      }
      backward_stream.synchronize();
    };
    auto comm = [&] {
      std::vector<cc::work> ws;
      for (auto& d : direct)
        ws.push_back(pg->allreduce(cc::tensor_view(d.data(), d.bytes() / sizeof(float), cc::dtype::float32, where),
                                   cc::reduce_op::avg));
      for (auto& w : ws)
        w.get();
    };
    auto step = [&](bool compute) {
      red.prepare_for_backward();
      const auto start = clock_type::now();
      for (std::size_t l = layers; l-- > 0;) {
        if (compute) {
          std::this_thread::sleep_until(start + (layers - l) * layer_time);
          produce(2 * l + 1);
          produce(2 * l);
        }
        red.mark_grad_ready(2 * l + 1);
        red.mark_grad_ready(2 * l);
      }
      red.finalize_sync();
      backward_stream.synchronize();
    };
    auto compute_alone = [&] {
      const auto start = clock_type::now();
      for (std::size_t l = layers; l-- > 0;) {
        std::this_thread::sleep_until(start + (layers - l) * layer_time);
        produce(2 * l + 1);
        produce(2 * l);
      }
      backward_stream.synchronize();
    };
    for (int i = 0; i < warmup; ++i) // includes the first iteration's bucket rebuild
      step(true);
    make_direct(); // after the rebuild: the layout the steps use
    comm();
    latency_recorder s_step, s_compute, s_comm, s_nocompute, s_overlap;
    for (int i = 0; i < iters; ++i) {
      s_comm.add_us(timed(comm));
      s_nocompute.add_us(timed([&] { step(false); }));
      s_compute.add_us(timed(compute_alone));
      s_step.add_us(timed([&] { step(true); }));
      s_overlap.add_us(red.last_stats().overlap_ratio() * 100.0);
    }
    if (r == 0) {
      out.step_us = s_step.percentile(0.5);
      out.compute_us = s_compute.percentile(0.5);
      out.comm_us = s_comm.percentile(0.5);
      out.nocompute_us = s_nocompute.percentile(0.5);
      out.overlap_stat_pct = s_overlap.percentile(0.5);
      out.buckets = static_cast<int>(red.layout().buckets.size());
    }
    pg->barrier().get();
  });
  return out;
}

/// Why PyTorch with CUDA cannot be the peer, or nullopt.
std::optional<std::string> torch_cuda_unavailable(context& ctx, const std::string& script) {
  if (!ctx.peers)
    return "skipped";
  if (auto why = torch_unavailable())
    return *why;
  if (script.empty())
    return "bench/torch_ddp_gpu_peer.py not found";
  const auto probe = run_peer(ctx, "PyTorch CUDA probe", {python, script, "--probe"}, std::chrono::seconds(120));
  if (!probe.failure.empty())
    return "probe " + probe.failure;
  const auto* line = probe.find({{"case", "probe"}});
  if (line == nullptr)
    return "probe printed nothing";
  if (const auto why = line->string("unavailable"); !why.empty())
    return why;
  return std::nullopt;
}

void report_reducer(context& ctx, bool quick) {
  const int iters = quick ? 3 : 7;
  const int warmup = 2;
  const auto script = bench_script("torch_ddp_gpu_peer.py");
  const auto no_peer = torch_cuda_unavailable(ctx, script);
  struct config {
    const char* backend;
    int ranks;
  };
  for (const config c : {config{"nccl", 1}, config{"gloo", 2}}) {
    const std::string name = fmt::format("reducer_{}_r{}", c.backend, c.ranks);
    if (ctx.status)
      ctx.status->note(fmt::format("reducer on {}, {} rank(s)", c.backend, c.ranks));
    const auto f = measure_reducer(c.backend, c.ranks, iters, warmup);
    peer_output torch;
    if (!no_peer)
      torch = run_peer(ctx, fmt::format("PyTorch DDP on CUDA, {}, {} rank(s)", c.backend, c.ranks),
                       {python, script, "--backend", c.backend, "--ranks", std::to_string(c.ranks), "--iters",
                        std::to_string(iters), "--warmup", std::to_string(warmup), "--layer-ms",
                        std::to_string(layer_time.count())},
                       std::chrono::seconds(300));
    record rec;
    rec.suite = "gpu";
    rec.name = name;
    rec.p50_us = f.step_us;
    rec.gbytes_per_s = static_cast<double>(model_elements * sizeof(float)) / (f.step_us * 1e-6) / 1e9;
    rec.extra = {{"ranks", c.ranks},
                 {"buckets", f.buckets},
                 {"layer_ms", static_cast<double>(layer_time.count())},
                 {"compute_us", f.compute_us},
                 {"comm_us", f.comm_us},
                 {"nocompute_us", f.nocompute_us},
                 {"overhead_pct", (f.nocompute_us / f.comm_us - 1.0) * 100.0},
                 {"overlap_pct", (f.compute_us + f.comm_us - f.step_us) / f.comm_us * 100.0},
                 {"overlap_stat_pct", f.overlap_stat_pct}};
    rec.text = {{"backend", c.backend}, {"device", "cuda:0"}};
    if (no_peer) {
      rec.peers = {peer_result::missing("pytorch", *no_peer)};
    } else {
      rec.peers = {peer_from("pytorch", torch, {{"case", name}}, "p50_us")};
      if (const auto* line = torch.find({{"case", name}})) {
        rec.extra.emplace_back("peer_compute_us", line->number("compute_us"));
        rec.extra.emplace_back("peer_nocompute_us", line->number("nocompute_us"));
      }
    }
    ctx.report(std::move(rec));
  }
}

void run_gpu_suite(context& ctx) {
  const auto why = cc::nccl_group::unavailable_reason();
  if (!why.empty()) {
    fmt::print(ctx.table_out, "# gpu suite skipped: NCCL cannot run here: {}\n", why);
    std::fflush(ctx.table_out);
    return;
  }
  const int gpus = cc::cuda_stream::device_count();
  report_allreduce(ctx, gpus, ctx.quick);
  if (gpus >= 2) {
    report_p2p(ctx, ctx.quick);
    report_all_to_all(ctx, gpus, ctx.quick);
  } else {
    fmt::print(ctx.table_out, "# gpu: 1 GPU: the sendrecv_* and all_to_all_single_* rows need 2 GPUs or more "
                              "(a GPU per NCCL rank): skipped\n");
  }
  report_split(ctx, gpus, ctx.quick);
  report_reducer(ctx, ctx.quick);
}

const suite_registrar registrar("gpu", &run_gpu_suite, 58, 0);

} // namespace
} // namespace corodist::bench
