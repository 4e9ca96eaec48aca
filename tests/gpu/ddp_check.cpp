// corodist-gpu-ddp-check: the DDP reducer on CUDA buffers trains a small model
// and ends where a single-process replay ends (check 3 of scripts/gpu_check.sh,
// with tests/gpu/ddp_equivalence.py comparing it with PyTorch DDP).
//
//   corodist-gpu-ddp-check [--out DIR] [--steps N]
//
// The model: one linear layer, y = W x + b (16 inputs, 4 outputs; float32),
// mean-squared-error loss over 64 fixed samples, plain SGD (lr 0.05). Each
// rank holds an equal shard of the batch, computes its shard's gradient on
// the host (hand-written, accumulated in double, rounded to float32), copies
// it into its device gradient (cuda_stream::copy on the backward's stream, the
// reducer's `stream`), marks it ready (bias first, as a backward produces
// them), finalizes, copies the averaged gradient back and steps on the host.
// Two configurations, ranks as threads on GPU 0: world size 1 on nccl_group,
// and world size 2 on gloo_group (CUDA buffers staged through pinned host
// memory). Ranks other than 0 start from other values: the reducer's
// construction broadcasts rank 0's, on device.
//
// Self-check: the same training replayed in one process without a reducer
// (every shard's gradient, averaged on the host in float32) must end at the
// same parameters (within 1e-6; bit-equal is expected, and printed). Exit 0
// when every configuration matches, 1 otherwise, 77 (skipped) when CUDA or
// NCCL cannot run here. With --out DIR it writes the data, the initial
// parameters and each configuration's final parameters as raw float32 files
// (x.f32, y.f32, w0.f32, b0.f32, <config>_w.f32, <config>_b.f32; meta.txt:
// "samples inputs outputs steps lr configs...") for PyTorch to replay.
#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/gloo_group.hpp>
#include <corodist/collective/nccl_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/ddp/reducer.hpp>
#include <corodist/store/hash_store.hpp>

#include "support/on_threads.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace cc = corodist::collective;
namespace dd = corodist::ddp;

constexpr std::size_t inputs = 16, outputs = 4, samples = 64;
constexpr float learning_rate = 0.05f;
constexpr double tolerance = 1e-6;

struct dataset {
  std::vector<float> x, y; // samples x inputs, samples x outputs
};

struct model {
  std::vector<float> w = std::vector<float>(outputs * inputs), b = std::vector<float>(outputs);
};

dataset make_data() {
  dataset d;
  std::mt19937 rng(22);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> truth(outputs * inputs);
  for (auto& t : truth)
    t = u(rng);
  for (std::size_t s = 0; s < samples; ++s) {
    for (std::size_t i = 0; i < inputs; ++i)
      d.x.push_back(u(rng));
    for (std::size_t o = 0; o < outputs; ++o) {
      double v = 0.1 * o;
      for (std::size_t i = 0; i < inputs; ++i)
        v += truth[o * inputs + i] * d.x[s * inputs + i];
      d.y.push_back(static_cast<float>(v + 0.05 * u(rng)));
    }
  }
  return d;
}

model initial_model(unsigned seed) {
  model m;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n(0.0f, 0.1f);
  for (auto& v : m.w)
    v = n(rng);
  for (auto& v : m.b)
    v = n(rng);
  return m;
}

/// The gradient of the mean squared error over samples [first, last) (mean
/// over samples and outputs, as torch.nn.functional.mse_loss): gw, gb.
void shard_gradient(const model& m, const dataset& d, std::size_t first, std::size_t last, std::vector<float>& gw,
                    std::vector<float>& gb) {
  const double scale = 2.0 / static_cast<double>((last - first) * outputs);
  std::vector<double> aw(outputs * inputs, 0.0), ab(outputs, 0.0);
  for (std::size_t s = first; s < last; ++s)
    for (std::size_t o = 0; o < outputs; ++o) {
      double pred = m.b[o];
      for (std::size_t i = 0; i < inputs; ++i)
        pred += static_cast<double>(m.w[o * inputs + i]) * d.x[s * inputs + i];
      const double err = (pred - d.y[s * outputs + o]) * scale;
      ab[o] += err;
      for (std::size_t i = 0; i < inputs; ++i)
        aw[o * inputs + i] += err * d.x[s * inputs + i];
    }
  gw.resize(aw.size());
  gb.resize(ab.size());
  std::transform(aw.begin(), aw.end(), gw.begin(), [](double v) { return static_cast<float>(v); });
  std::transform(ab.begin(), ab.end(), gb.begin(), [](double v) { return static_cast<float>(v); });
}

void sgd(model& m, const std::vector<float>& gw, const std::vector<float>& gb) {
  for (std::size_t e = 0; e < m.w.size(); ++e)
    m.w[e] -= learning_rate * gw[e];
  for (std::size_t e = 0; e < m.b.size(); ++e)
    m.b[e] -= learning_rate * gb[e];
}

/// The training without a reducer: every shard's gradient, averaged on the host.
model replay(const dataset& d, int world, int steps) {
  model m = initial_model(1);
  const std::size_t shard = samples / static_cast<std::size_t>(world);
  std::vector<float> gw, gb, sw, sb;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> tw(m.w.size(), 0.0f), tb(m.b.size(), 0.0f);
    for (int r = 0; r < world; ++r) {
      shard_gradient(m, d, shard * static_cast<std::size_t>(r), shard * static_cast<std::size_t>(r + 1), sw, sb);
      for (std::size_t e = 0; e < tw.size(); ++e)
        tw[e] += sw[e];
      for (std::size_t e = 0; e < tb.size(); ++e)
        tb[e] += sb[e];
    }
    for (auto& v : tw)
      v /= static_cast<float>(world);
    for (auto& v : tb)
      v /= static_cast<float>(world);
    sgd(m, tw, tb);
  }
  return m;
}


/// Trains with the reducer on CUDA buffers of GPU 0: `world` ranks (threads)
/// on `backend`; returns rank 0's final model.
model train(const std::string& backend, int world, const dataset& d, int steps) {
  corodist::event_loop store_loop;
  store_loop.start();
  auto store = std::make_shared<corodist::store::hash_store>(store_loop.get_executor());
  model result;
  corodist::test::run_on_threads_or_throw(world, [&](int r) {
    corodist::event_loop loop;
    loop.start();
    std::shared_ptr<cc::process_group> pg;
    if (backend == "nccl") {
      cc::nccl_options o;
      o.device = 0;
      o.timeout = std::chrono::seconds(60);
      o.prefix = "gpu-ddp-check/nccl";
      pg = cc::nccl_group::create_sync(loop.get_executor(), store, r, world, o);
    } else {
      cc::gloo_options o;
      o.host = "127.0.0.1";
      o.timeout = std::chrono::seconds(60);
      o.prefix = "gpu-ddp-check/gloo";
      pg = cc::gloo_group::create_sync(store, r, world, o);
    }
    const auto where = cc::device::cuda(0);
    auto stream = cc::cuda_stream::create(0); // the backward's stream
    constexpr std::size_t total = outputs * inputs + outputs;
    auto values = cc::device_buffer::allocate(where, total * sizeof(float));
    auto grads = cc::device_buffer::allocate(where, total * sizeof(float));
    auto* dv = static_cast<float*>(values.data());
    auto* dg = static_cast<float*>(grads.data());
    // Rank 0 starts from initial_model(1), the others elsewhere: construction broadcasts rank 0's.
    model m = initial_model(static_cast<unsigned>(r + 1));
    stream.copy(dv, m.w.data(), m.w.size() * sizeof(float));
    stream.copy(dv + m.w.size(), m.b.data(), m.b.size() * sizeof(float));
    stream.zero(dg, total * sizeof(float));
    stream.synchronize();
    std::vector<dd::parameter> params;
    params.emplace_back(dv, dg, m.w.size(), cc::dtype::float32, where, "weight");
    params.emplace_back(dv + m.w.size(), dg + m.w.size(), m.b.size(), cc::dtype::float32, where, "bias");
    dd::reducer_options ro;
    ro.stream = stream.native();
    ro.first_bucket_bytes = 16; // the bias alone, then the weight: two buckets
    ro.bucket_cap_bytes = 64;
    dd::reducer red(pg, params, ro);
    // The values rank 0 broadcast, read back (work after construction is ordered after it).
    stream.copy(m.w.data(), dv, m.w.size() * sizeof(float));
    stream.copy(m.b.data(), dv + m.w.size(), m.b.size() * sizeof(float));
    stream.synchronize();

    const std::size_t shard = samples / static_cast<std::size_t>(world);
    const std::size_t first = shard * static_cast<std::size_t>(r);
    std::vector<float> gw, gb;
    for (int step = 0; step < steps; ++step) {
      red.prepare_for_backward();
      shard_gradient(m, d, first, first + shard, gw, gb);
      stream.copy(dg + m.w.size(), gb.data(), gb.size() * sizeof(float)); // the bias's gradient first
      red.mark_grad_ready(1);
      stream.copy(dg, gw.data(), gw.size() * sizeof(float));
      red.mark_grad_ready(0);
      red.finalize_sync();
      stream.copy(gw.data(), dg, gw.size() * sizeof(float)); // ordered after the averaged gradients
      stream.copy(gb.data(), dg + m.w.size(), gb.size() * sizeof(float));
      stream.synchronize();
      sgd(m, gw, gb);
      stream.copy(dv, m.w.data(), m.w.size() * sizeof(float));
      stream.copy(dv + m.w.size(), m.b.data(), m.b.size() * sizeof(float));
    }
    stream.synchronize();
    pg->barrier().get();
    if (r == 0)
      result = m;
  });
  return result;
}

void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!f)
    throw std::runtime_error("cannot write " + path);
}

/// max |a - b| / max(1, |b|) over all parameters; `equal`: bit-equal.
double compare(const model& a, const model& b, bool& equal) {
  double worst = 0;
  equal = true;
  auto one = [&](const std::vector<float>& x, const std::vector<float>& y) {
    for (std::size_t e = 0; e < x.size(); ++e) {
      worst = std::max(worst, std::abs(static_cast<double>(x[e]) - y[e]) / std::max(1.0, std::abs(static_cast<double>(y[e]))));
      equal = equal && std::memcmp(&x[e], &y[e], sizeof(float)) == 0;
    }
  };
  one(a.w, b.w);
  one(a.b, b.b);
  return worst;
}

} // namespace

int main(int argc, char** argv) {
  std::string out;
  int steps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--out DIR] [--steps N]\n", argv[0]);
      return 2;
    }
  }
  if (const auto why = cc::nccl_group::unavailable_reason(); !why.empty()) {
    std::printf("skipped: NCCL cannot run here: %s\n", why.c_str());
    return 77;
  }
  struct config {
    const char* backend;
    int world;
  };
  std::vector<config> configs = {{"nccl", 1}};
  if (cc::gloo_group::built())
    configs.push_back({"gloo", 2});
  else
    std::printf("gloo world 2: not run: corodist was built without Gloo\n");
  int failures = 0;
  try {
    const dataset data = make_data();
    std::string meta = std::to_string(samples) + " " + std::to_string(inputs) + " " + std::to_string(outputs) + " " +
                       std::to_string(steps) + " " + std::to_string(learning_rate);
    if (!out.empty()) {
      const model m0 = initial_model(1);
      write_floats(out + "/x.f32", data.x);
      write_floats(out + "/y.f32", data.y);
      write_floats(out + "/w0.f32", m0.w);
      write_floats(out + "/b0.f32", m0.b);
    }
    for (const auto& c : configs) {
      const std::string name = std::string(c.backend) + "_r" + std::to_string(c.world);
      try {
        const model trained = train(c.backend, c.world, data, steps);
        const model expected = replay(data, c.world, steps);
        bool equal = false;
        const double diff = compare(trained, expected, equal);
        const bool ok = diff <= tolerance;
        std::printf("%s world %d: %d steps, max relative difference to the single-process replay %.3g (%s): %s\n",
                    c.backend, c.world, steps, diff, equal ? "bit-equal" : "not bit-equal", ok ? "OK" : "FAILED");
        failures += ok ? 0 : 1;
        if (!out.empty()) {
          write_floats(out + "/" + name + "_w.f32", trained.w);
          write_floats(out + "/" + name + "_b.f32", trained.b);
          meta += " " + name;
        }
      } catch (const std::exception& e) {
        std::printf("%s world %d: FAILED: %s\n", c.backend, c.world, e.what());
        ++failures;
      }
    }
    if (!out.empty()) {
      std::ofstream f(out + "/meta.txt");
      f << meta << "\n";
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "corodist-gpu-ddp-check: %s\n", e.what());
    return 1;
  }
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}
