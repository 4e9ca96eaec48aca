// Data-parallel training of a small model with corodist's DDP reducer.
//
//   build/tools/corodist-run --nproc 4 -- build/examples/corodist-ddp-train [steps [hidden]]
//
// A two-layer perceptron (4 inputs, 8 tanh units unless `hidden` says, 1
// output; float64) learns a fixed function of its inputs from 64 samples by
// full-batch gradient descent. Each rank holds a quarter of the batch (any world size that
// divides 64), computes the mean-squared-error gradient of its shard with a
// hand-written backward pass, marking each parameter's gradient ready as
// soon as it is computed (last layer first), and the reducer averages them:
// the average of the shards' mean gradients is the full batch's gradient.
// Every rank also trains the same model alone on the full batch, and checks
// that both end at the same parameters (within 1e-6 relative); it exits 1
// otherwise. Rank 0 prints the loss and the reducer's figures.
#include "usage.hpp"

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/ddp/reducer.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <charconv>
#include <cstdio>
#include <string>
#include <string_view>
#include <cstdlib>
#include <exception>
#include <random>
#include <span>
#include <vector>

namespace {

constexpr std::size_t inputs = 4, samples = 64;
/// Tanh units (the second argument; a wide layer makes a backward long enough to overlap).
std::size_t hidden = 8;
constexpr double learning_rate = 0.1;

/// The model: W1 (hidden x inputs), b1 (hidden), W2 (hidden), b2 (1), in
/// registration order; gradients of the same shapes.
struct mlp {
  std::vector<double> w1 = std::vector<double>(hidden * inputs), b1 = std::vector<double>(hidden),
                      w2 = std::vector<double>(hidden), b2 = std::vector<double>(1);
  std::vector<std::vector<double>*> all() { return {&w1, &b1, &w2, &b2}; }

  void init(unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> d(0.0, 0.5);
    for (auto* p : all())
      for (auto& x : *p)
        x = d(rng);
  }
};

struct dataset {
  std::vector<double> x, y; // x: samples x inputs, y: samples
};

dataset make_data() {
  dataset d;
  std::mt19937 rng(2024);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (std::size_t s = 0; s < samples; ++s) {
    double t = 0;
    for (std::size_t i = 0; i < inputs; ++i) {
      const double v = u(rng);
      d.x.push_back(v);
      t += std::sin(static_cast<double>(i + 1) * v);
    }
    d.y.push_back(0.5 * t);
  }
  return d;
}

/// Forward and backward over samples [first, last): writes the gradient of
/// the mean squared error (over those samples) into g[0..3] (W1, b1, W2, b2),
/// calling ready(k) as each is complete. Returns the loss.
template <typename Ready>
double backward(const mlp& m, const dataset& d, std::size_t first, std::size_t last, std::span<double*, 4> g,
                Ready&& ready) {
  const double scale = 1.0 / static_cast<double>(last - first);
  std::vector<double> h((last - first) * hidden), err(last - first);
  double loss = 0;
  for (std::size_t s = first; s < last; ++s) {
    double out = m.b2[0];
    for (std::size_t j = 0; j < hidden; ++j) {
      double a = m.b1[j];
      for (std::size_t i = 0; i < inputs; ++i)
        a += m.w1[j * inputs + i] * d.x[s * inputs + i];
      h[(s - first) * hidden + j] = std::tanh(a);
      out += m.w2[j] * h[(s - first) * hidden + j];
    }
    err[s - first] = out - d.y[s];
    loss += 0.5 * err[s - first] * err[s - first] * scale;
  }
  // Last layer first, as a backward pass produces them: b2, W2, then b1, W1.
  g[3][0] = 0;
  for (std::size_t s = 0; s < last - first; ++s)
    g[3][0] += err[s] * scale;
  ready(3);
  for (std::size_t j = 0; j < hidden; ++j) {
    g[2][j] = 0;
    for (std::size_t s = 0; s < last - first; ++s)
      g[2][j] += err[s] * h[s * hidden + j] * scale;
  }
  ready(2);
  std::vector<double> delta((last - first) * hidden);
  for (std::size_t s = 0; s < last - first; ++s)
    for (std::size_t j = 0; j < hidden; ++j) {
      const double hv = h[s * hidden + j];
      delta[s * hidden + j] = err[s] * m.w2[j] * (1 - hv * hv) * scale;
    }
  for (std::size_t j = 0; j < hidden; ++j) {
    g[1][j] = 0;
    for (std::size_t s = 0; s < last - first; ++s)
      g[1][j] += delta[s * hidden + j];
  }
  ready(1);
  for (std::size_t j = 0; j < hidden; ++j)
    for (std::size_t i = 0; i < inputs; ++i) {
      double acc = 0;
      for (std::size_t s = 0; s < last - first; ++s)
        acc += delta[s * hidden + j] * d.x[(first + s) * inputs + i];
      g[0][j * inputs + i] = acc;
    }
  ready(0);
  return loss;
}

void sgd(mlp& m, std::span<double*, 4> g) {
  // A wider layer takes smaller steps (the output sums over its units): 0.1 at 8 units.
  const double rate = learning_rate * 8.0 / static_cast<double>(hidden);
  auto parts = m.all();
  for (std::size_t k = 0; k < 4; ++k)
    for (std::size_t e = 0; e < parts[k]->size(); ++e)
      (*parts[k])[e] -= rate * g[k][e];
}

} // namespace

int main(int argc, char** argv) {
  namespace cc = corodist::collective;
  namespace dd = corodist::ddp;
  constexpr const char* usage = "[STEPS [HIDDEN]]";
  constexpr const char* about = "Data-parallel training of a small model with the DDP reducer (STEPS: 50 unless given;\n"
                                "HIDDEN: its tanh units, 8 unless given).\n"
                                "Run it under corodist-run: corodist-run --nproc 4 -- corodist-ddp-train [STEPS [HIDDEN]]";
  int steps = 50;
  if (argc > 1 && examples::is_help(argv[1]))
    return examples::print_usage(argv[0], usage, about);
  if (argc > 3)
    return examples::print_usage(argv[0], usage, about, "too many arguments");
  for (int a = 1; a < argc; ++a) {
    const std::string_view text = argv[a];
    int value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || end != text.data() + text.size() || value < 1 || (a == 2 && value > (1 << 20))) {
      const std::string error = std::string(a == 1 ? "STEPS" : "HIDDEN (at most 1048576)") +
                                " must be a positive integer, not '" + std::string(text) + "'";
      return examples::print_usage(argv[0], usage, about, error.c_str());
    }
    if (a == 1)
      steps = value;
    else
      hidden = static_cast<std::size_t>(value);
  }
  try {
    corodist::event_loop loop;
    loop.start();
    // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from corodist-run (its launcher hosts the store).
    auto pg = cc::gloo_group::create_sync(loop, "env://");
    const int rank = pg->rank(), world = pg->size();
    if (samples % static_cast<std::size_t>(world) != 0) {
      std::fprintf(stderr, "the world size must divide %zu\n", samples);
      return 2;
    }
    const dataset data = make_data();

    // Every rank starts from its own random values: the reducer's
    // construction replaces them with rank 0's.
    mlp model;
    model.init(static_cast<unsigned>(rank + 1));
    std::vector<std::vector<double>> grads;
    std::vector<dd::parameter> params;
    const char* names[] = {"w1", "b1", "w2", "b2"};
    for (std::size_t k = 0; k < 4; ++k) {
      auto& values = *model.all()[k];
      grads.emplace_back(values.size());
      params.emplace_back(std::span<double>(values), std::span<double>(grads.back()), names[k]);
    }
    dd::reducer_options opts;
    opts.first_bucket_bytes = 64; // a tiny model: small buckets, so that there are several
    opts.bucket_cap_bytes = 256;
    dd::reducer red(pg, params, opts);

    const std::size_t shard = samples / static_cast<std::size_t>(world);
    const std::size_t first = shard * static_cast<std::size_t>(rank);
    double loss = 0;
    for (int step = 0; step < steps; ++step) {
      std::array<double*, 4> g{};
      for (std::size_t k = 0; k < 4; ++k)
        g[k] = static_cast<double*>(red.gradient(k).data());
      red.prepare_for_backward();
      loss = backward(model, data, first, first + shard, std::span<double*, 4>(g),
                      [&](std::size_t k) { red.mark_grad_ready(k); });
      red.finalize_sync(); // the gradients are now the full batch's
      sgd(model, std::span<double*, 4>(g));
    }

    // The same training in one process, on the whole batch.
    mlp alone;
    alone.init(1); // rank 0's start
    std::vector<std::vector<double>> ag;
    std::array<double*, 4> agp{};
    for (std::size_t k = 0; k < 4; ++k) {
      ag.emplace_back(alone.all()[k]->size());
      agp[k] = ag.back().data();
    }
    double alone_loss = 0;
    for (int step = 0; step < steps; ++step) {
      alone_loss = backward(alone, data, 0, samples, std::span<double*, 4>(agp), [](std::size_t) {});
      sgd(alone, std::span<double*, 4>(agp));
    }
    double diff = 0, scale = 0;
    for (std::size_t k = 0; k < 4; ++k)
      for (std::size_t e = 0; e < model.all()[k]->size(); ++e) {
        diff = std::max(diff, std::abs((*model.all()[k])[e] - (*alone.all()[k])[e]));
        scale = std::max(scale, std::abs((*alone.all()[k])[e]));
      }
    const double rel = diff / scale;
    const auto& s = red.last_stats();
    std::printf("rank %d: %d steps, shard loss %.6g, single-process full-batch loss %.6g, max_rel_diff %.3g\n", rank,
                steps, loss, alone_loss, rel);
    if (rank == 0)
      std::printf("rank 0: %zu buckets, last step: communication %.1f us, %.0f%% overlapped with the backward\n",
                  s.buckets.size(), s.communication.count() / 1e3, s.overlap_ratio() * 100);
    pg->barrier().get(); // every rank done before rank 0 (the store's host) leaves
    return rel <= 1e-6 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_train: %s\n", e.what());
    return 1;
  }
}
