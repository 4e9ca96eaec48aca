// Pipeline-parallel training of a small model: each rank is one stage.
//
//   build/tools/corodist-run --nproc 4 -- build/examples/pipeline_train [--schedule 1f1b|gpipe]
//       [--micro-batches M] [--steps N]
//
// A perceptron of four dense layers (4 -> 16 -> 16 -> 16 -> 1, tanh after
// the first three; float64) learns a fixed function of its inputs by
// mini-batch SGD (32 samples a step, in turn from 256). Its layers are cut
// into as many stages as there are ranks (1 to 4; rank s holds layers
// [4s/S, 4(s+1)/S)), each initialised from a seed, so that no rank needs
// another's weights. Each mini-batch is split into M micro-batches (4 unless
// given) that flow through the stages: activations forward, gradients
// backward, each sent to the neighbouring stage with send/recv, or, where a
// stage sends to a neighbour and waits on it in the same moment, with one
// batch_isend_irecv. The schedule is 1F1B (one forward, one backward: stage s
// runs S-1-s forwards ahead, then alternates; the default) or GPipe (every
// forward, then every backward). Either runs the backwards in micro-batch
// order, so each stage adds up its gradients in the order one process would;
// after the last micro-batch, every stage takes its SGD step.
//
// Every rank also trains the whole model alone, on the same micro-batches in
// the same order, and compares its own layers' weights with that model's
// (tolerance 1e-12, relative to the largest weight), the last stage also
// every step's loss; the largest difference over the ranks decides (an
// allreduce). The last stage prints the losses and "pipeline matches the
// single-process model"; every rank exits 1 if it does not.
#include "usage.hpp"

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace cc = corodist::collective;

constexpr std::array<std::size_t, 5> widths = {4, 16, 16, 16, 1}; // layer k maps widths[k] to widths[k + 1]
constexpr std::size_t layer_count = widths.size() - 1;
constexpr std::size_t samples = 256, batch = 32;
constexpr double learning_rate = 0.05, tolerance = 1e-12;
constexpr unsigned seed = 2024;

/// A dense layer y = f(W x + b), f = tanh or the identity, with its gradients.
struct dense {
  std::size_t in, out;
  bool squash; // tanh
  std::vector<double> w, b, gw, gb;

  /// Layer `k` of the model, initialised from (seed, k) alone.
  explicit dense(std::size_t k)
      : in(widths[k]), out(widths[k + 1]), squash(k + 1 < layer_count), w(in * out), b(out), gw(in * out), gb(out) {
    std::mt19937 rng(seed + static_cast<unsigned>(k));
    std::normal_distribution<double> d(0.0, 1.0 / std::sqrt(static_cast<double>(in)));
    for (auto& x : w)
      x = d(rng);
    for (auto& x : b)
      x = 0.1 * d(rng);
  }

  /// `x` holds n rows of `in`; returns n rows of `out`.
  std::vector<double> forward(const std::vector<double>& x) const {
    const std::size_t n = x.size() / in;
    std::vector<double> y(n * out);
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t j = 0; j < out; ++j) {
        double a = b[j];
        for (std::size_t i = 0; i < in; ++i)
          a += w[j * in + i] * x[s * in + i];
        y[s * out + j] = squash ? std::tanh(a) : a;
      }
    return y;
  }

  /// Given the input `x` and output `y` of a forward and the loss's gradient
  /// `dy` with respect to `y`: adds the gradients of W and b to gw and gb,
  /// and returns the gradient with respect to `x`.
  std::vector<double> backward(const std::vector<double>& x, const std::vector<double>& y, std::vector<double> dy) {
    const std::size_t n = x.size() / in;
    if (squash)
      for (std::size_t e = 0; e < dy.size(); ++e)
        dy[e] *= 1 - y[e] * y[e];
    std::vector<double> dx(n * in);
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t j = 0; j < out; ++j) {
        const double g = dy[s * out + j];
        gb[j] += g;
        for (std::size_t i = 0; i < in; ++i) {
          gw[j * in + i] += g * x[s * in + i];
          dx[s * in + i] += g * w[j * in + i];
        }
      }
    return dx;
  }

  /// W -= rate * gW, b -= rate * gb; the gradients back to zero.
  void sgd() {
    for (std::size_t e = 0; e < w.size(); ++e)
      w[e] -= learning_rate * gw[e];
    for (std::size_t e = 0; e < b.size(); ++e)
      b[e] -= learning_rate * gb[e];
    std::fill(gw.begin(), gw.end(), 0.0);
    std::fill(gb.begin(), gb.end(), 0.0);
  }
};

/// Layers [first, last) of the model, with the activations of the
/// micro-batches whose backward is still to come.
struct stage {
  std::size_t first, last;
  std::vector<dense> layers;
  std::vector<std::vector<std::vector<double>>> saved; // per micro-batch: the input of each layer, then the output

  stage(std::size_t first_layer, std::size_t last_layer, std::size_t micro_batches)
      : first(first_layer), last(last_layer), saved(micro_batches) {
    for (std::size_t k = first; k < last; ++k)
      layers.emplace_back(k);
  }

  /// Runs micro-batch `mb` forward through the layers; keeps its activations.
  const std::vector<double>& forward(std::size_t mb, std::vector<double> x) {
    auto& acts = saved[mb];
    acts.clear();
    acts.push_back(std::move(x));
    for (const auto& l : layers)
      acts.push_back(l.forward(acts.back()));
    return acts.back();
  }

  /// Runs micro-batch `mb` backward from the gradient of its output; returns
  /// the gradient of its input and drops its activations.
  std::vector<double> backward(std::size_t mb, std::vector<double> dy) {
    auto& acts = saved[mb];
    for (std::size_t k = layers.size(); k-- > 0;)
      dy = layers[k].backward(acts[k], acts[k + 1], std::move(dy));
    acts.clear();
    return dy;
  }

  /// Every layer's SGD step (after the mini-batch's last backward).
  void sgd() {
    for (auto& l : layers)
      l.sgd();
  }
};

struct dataset {
  std::vector<double> x, y; // x: samples x widths[0], y: samples
};

dataset make_data() {
  dataset d;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (std::size_t s = 0; s < samples; ++s) {
    double t = 0;
    for (std::size_t i = 0; i < widths[0]; ++i) {
      const double v = u(rng);
      d.x.push_back(v);
      t += std::sin(static_cast<double>(i + 1) * v);
    }
    d.y.push_back(0.5 * t);
  }
  return d;
}

/// The samples of micro-batch `mb` of step `step`: [first, first + size).
struct micro_batch {
  std::size_t first, size;
};

micro_batch slice(int step, std::size_t mb, std::size_t micro_batches) {
  const std::size_t size = batch / micro_batches;
  return {(static_cast<std::size_t>(step) % (samples / batch)) * batch + mb * size, size};
}

std::vector<double> inputs_of(const dataset& d, micro_batch m) {
  return {d.x.begin() + static_cast<std::ptrdiff_t>(m.first * widths[0]),
          d.x.begin() + static_cast<std::ptrdiff_t>((m.first + m.size) * widths[0])};
}

/// Half the squared error of `out` against the targets of `m`, over the
/// mini-batch (so that the micro-batches' gradients add up to the
/// mini-batch's); writes its gradient into `dout`. Returns the loss.
double loss_of(const dataset& d, micro_batch m, const std::vector<double>& out, std::vector<double>& dout) {
  double loss = 0;
  dout.assign(out.size(), 0.0);
  for (std::size_t s = 0; s < m.size; ++s) {
    const double err = out[s] - d.y[m.first + s];
    loss += 0.5 * err * err / batch;
    dout[s] = err / batch;
  }
  return loss;
}

/// One rank's stage and its traffic with the neighbouring stages. The first
/// stage reads its inputs from the data, the last computes the loss: the
/// same calls on every stage, the ends talk to nobody on their open side.
class pipeline {
public:
  pipeline(cc::process_group& pg, const dataset& data, std::size_t micro_batches)
      : pg_(pg), data_(data), micro_batches_(micro_batches), rank_(pg.rank()), stages_(pg.size()),
        stage_(layer_count * static_cast<std::size_t>(rank_) / static_cast<std::size_t>(stages_),
               layer_count * static_cast<std::size_t>(rank_ + 1) / static_cast<std::size_t>(stages_), micro_batches),
        outputs_(micro_batches) {}

  stage& own() { return stage_; }
  bool first() const { return rank_ == 0; }
  bool last() const { return rank_ == stages_ - 1; }

  /// One mini-batch with the 1F1B schedule; returns its loss (last stage; 0 elsewhere).
  double step_1f1b(int step) {
    begin(step);
    const std::size_t m = micro_batches_;
    const std::size_t warmup = std::min(static_cast<std::size_t>(stages_ - 1 - rank_), m);
    for (std::size_t mb = 0; mb < warmup; ++mb)
      send_forward(mb, stage_.forward(mb, recv_forward(mb)));
    std::vector<double> x;
    if (warmup < m)
      x = recv_forward(warmup);
    for (std::size_t i = 0; i < m - warmup; ++i) { // steady: forward of warmup + i, backward of i
      const std::size_t fwd = warmup + i;
      std::vector<double> dx = stage_.backward(i, send_forward_recv_backward(fwd, i, stage_.forward(fwd, std::move(x))));
      if (fwd + 1 < m)
        x = send_backward_recv_forward(i, std::move(dx), fwd + 1);
      else
        send_backward(i, std::move(dx));
    }
    for (std::size_t mb = m - warmup; mb < m; ++mb) // cool-down: the backwards still due
      send_backward(mb, stage_.backward(mb, recv_backward(mb)));
    stage_.sgd();
    return loss_;
  }

  /// One mini-batch with the GPipe schedule (every forward, then every backward).
  double step_gpipe(int step) {
    begin(step);
    for (std::size_t mb = 0; mb < micro_batches_; ++mb)
      send_forward(mb, stage_.forward(mb, recv_forward(mb)));
    for (std::size_t mb = 0; mb < micro_batches_; ++mb)
      send_backward(mb, stage_.backward(mb, recv_backward(mb)));
    stage_.sgd();
    return loss_;
  }

private:
  // Tags: micro-batch mb's activations 2 mb, its gradients 2 mb + 1.
  static std::uint32_t activation_tag(std::size_t mb) { return static_cast<std::uint32_t>(2 * mb); }
  static std::uint32_t gradient_tag(std::size_t mb) { return static_cast<std::uint32_t>(2 * mb + 1); }
  std::size_t rows(std::size_t mb) const { return slice(step_, mb, micro_batches_).size; }

  void begin(int step) {
    step_ = step;
    loss_ = 0;
  }

  /// The input of micro-batch `mb`: the data (first stage) or the previous stage's activations.
  std::vector<double> recv_forward(std::size_t mb) {
    if (first())
      return inputs_of(data_, slice(step_, mb, micro_batches_));
    std::vector<double> x(rows(mb) * widths[stage_.first]);
    pg_.recv(x, rank_ - 1, activation_tag(mb)).get();
    return x;
  }

  /// Hands the output of `mb` on: to the next stage, or (last stage) to the loss.
  void send_forward(std::size_t mb, std::vector<double> y) {
    if (last())
      outputs_[mb] = std::move(y);
    else
      pg_.send(y, rank_ + 1, activation_tag(mb)).get();
  }

  /// The gradient of the output of `mb`: from the next stage, or the loss's.
  std::vector<double> recv_backward(std::size_t mb) {
    std::vector<double> dy(rows(mb) * widths[stage_.last]);
    if (last())
      loss_ += loss_of(data_, slice(step_, mb, micro_batches_), outputs_[mb], dy);
    else
      pg_.recv(dy, rank_ + 1, gradient_tag(mb)).get();
    return dy;
  }

  /// Hands the gradient of the input of `mb` to the previous stage (none on the first).
  void send_backward(std::size_t mb, std::vector<double> dx) {
    if (!first())
      pg_.send(dx, rank_ - 1, gradient_tag(mb)).get();
  }

  /// Sends the output of `fwd` to the next stage and receives the gradient of
  /// `bwd` from it, as one batch (each waits on the other).
  std::vector<double> send_forward_recv_backward(std::size_t fwd, std::size_t bwd, std::vector<double> y) {
    if (last()) {
      send_forward(fwd, std::move(y));
      return recv_backward(bwd);
    }
    std::vector<double> dy(rows(bwd) * widths[stage_.last]);
    pg_.batch_isend_irecv({cc::p2p_op::isend(y, rank_ + 1, activation_tag(fwd)),
                           cc::p2p_op::irecv(dy, rank_ + 1, gradient_tag(bwd))})
        .get();
    return dy;
  }

  /// Sends the gradient of `bwd` to the previous stage and receives the
  /// input of `fwd` from it, as one batch.
  std::vector<double> send_backward_recv_forward(std::size_t bwd, std::vector<double> dx, std::size_t fwd) {
    if (first()) {
      send_backward(bwd, std::move(dx));
      return recv_forward(fwd);
    }
    std::vector<double> x(rows(fwd) * widths[stage_.first]);
    pg_.batch_isend_irecv({cc::p2p_op::isend(dx, rank_ - 1, gradient_tag(bwd)),
                           cc::p2p_op::irecv(x, rank_ - 1, activation_tag(fwd))})
        .get();
    return x;
  }

  cc::process_group& pg_;
  const dataset& data_;
  std::size_t micro_batches_;
  int rank_, stages_;
  stage stage_;
  std::vector<std::vector<double>> outputs_; // last stage: the outputs awaiting their loss
  int step_ = 0;
  double loss_ = 0;
};

/// The whole model in one process, on the same micro-batches in the same
/// order; returns each step's loss.
std::vector<double> train_alone(stage& model, const dataset& data, int steps, std::size_t micro_batches) {
  std::vector<double> losses;
  std::vector<double> dout;
  for (int step = 0; step < steps; ++step) {
    double loss = 0;
    for (std::size_t mb = 0; mb < micro_batches; ++mb) {
      const micro_batch m = slice(step, mb, micro_batches);
      const std::vector<double>& out = model.forward(mb, inputs_of(data, m));
      loss += loss_of(data, m, out, dout);
      model.backward(mb, dout);
    }
    model.sgd();
    losses.push_back(loss);
  }
  return losses;
}

/// Parses a positive integer; false if `text` is not one.
bool parse_positive(std::string_view text, int& value) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  return ec == std::errc{} && end == text.data() + text.size() && value > 0;
}

} // namespace

int main(int argc, char** argv) {
  constexpr const char* usage = "[--schedule 1f1b|gpipe] [--micro-batches M] [--steps N]";
  constexpr const char* about =
      "Pipeline-parallel training of a 4-layer perceptron, one stage per rank (1 to 4 ranks), activations and\n"
      "gradients passed by send/recv; checked against the same model trained in one process.\n"
      "  --schedule       1f1b (the default) or gpipe\n"
      "  --micro-batches  micro-batches per mini-batch of 32 samples, a divisor of 32 (4 unless given)\n"
      "  --steps          SGD steps (40 unless given)\n"
      "Run it under corodist-run: corodist-run --nproc 4 -- pipeline_train";
  std::string schedule = "1f1b";
  int micro_batches = 4, steps = 40;
  for (int a = 1; a < argc; ++a) {
    const std::string_view arg = argv[a];
    if (examples::is_help(arg))
      return examples::print_usage(argv[0], usage, about);
    const bool takes_value = arg == "--schedule" || arg == "--micro-batches" || arg == "--steps";
    if (!takes_value) {
      const std::string error = "unknown argument '" + std::string(arg) + "'";
      return examples::print_usage(argv[0], usage, about, error.c_str());
    }
    if (a + 1 == argc) {
      const std::string error = std::string(arg) + " needs a value";
      return examples::print_usage(argv[0], usage, about, error.c_str());
    }
    const std::string_view value = argv[++a];
    if (arg == "--schedule") {
      if (value != "1f1b" && value != "gpipe") {
        const std::string error = "--schedule is 1f1b or gpipe, not '" + std::string(value) + "'";
        return examples::print_usage(argv[0], usage, about, error.c_str());
      }
      schedule = value;
    } else if (arg == "--micro-batches") {
      if (!parse_positive(value, micro_batches) || batch % static_cast<std::size_t>(micro_batches) != 0) {
        const std::string error = "--micro-batches must divide 32, not '" + std::string(value) + "'";
        return examples::print_usage(argv[0], usage, about, error.c_str());
      }
    } else if (!parse_positive(value, steps)) {
      const std::string error = "--steps must be a positive integer, not '" + std::string(value) + "'";
      return examples::print_usage(argv[0], usage, about, error.c_str());
    }
  }
  try {
    corodist::event_loop loop;
    loop.start();
    // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from corodist-run (its launcher hosts the store).
    auto pg = cc::gloo_group::create_sync(loop, "env://");
    const int rank = pg->rank(), world = pg->size();
    if (world > static_cast<int>(layer_count)) {
      std::fprintf(stderr, "pipeline_train: %d ranks, but the model has only %zu layers (one stage each at most)\n",
                   world, layer_count);
      return 2;
    }
    const dataset data = make_data();
    const auto m = static_cast<std::size_t>(micro_batches);

    pipeline pipe(*pg, data, m);
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step)
      losses.push_back(schedule == "1f1b" ? pipe.step_1f1b(step) : pipe.step_gpipe(step));

    // The same model, trained in one process.
    stage alone(0, layer_count, m);
    const std::vector<double> alone_losses = train_alone(alone, data, steps, m);
    double diff = 0, scale = 0;
    for (std::size_t k = pipe.own().first; k < pipe.own().last; ++k) {
      const dense& mine = pipe.own().layers[k - pipe.own().first];
      const dense& ref = alone.layers[k];
      for (std::size_t e = 0; e < ref.w.size(); ++e)
        diff = std::max(diff, std::abs(mine.w[e] - ref.w[e]));
      for (std::size_t e = 0; e < ref.b.size(); ++e)
        diff = std::max(diff, std::abs(mine.b[e] - ref.b[e]));
    }
    for (const dense& l : alone.layers)
      for (const auto* v : {&l.w, &l.b})
        for (double x : *v)
          scale = std::max(scale, std::abs(x));
    std::vector<double> worst = {diff / scale, 0.0}; // weights (relative), losses (relative)
    if (pipe.last())
      for (int step = 0; step < steps; ++step)
        worst[1] = std::max(worst[1], std::abs(losses[static_cast<std::size_t>(step)] -
                                               alone_losses[static_cast<std::size_t>(step)]) /
                                          alone_losses[static_cast<std::size_t>(step)]);
    const std::string layers = pipe.own().last - pipe.own().first == 1
                                   ? "layer " + std::to_string(pipe.own().first)
                                   : "layers " + std::to_string(pipe.own().first) + "-" +
                                         std::to_string(pipe.own().last - 1);
    std::printf("stage %d of %d (%s): max relative weight difference from the single-process model %.3g\n", rank,
                world, layers.c_str(), worst[0]);
    std::fflush(stdout);
    pg->allreduce(worst, cc::reduce_op::max).get(); // every rank decides on the largest difference
    const bool same = worst[0] <= tolerance && worst[1] <= tolerance;
    if (pipe.last()) {
      for (int step = 0; step < steps; ++step)
        if (step % 10 == 0 || step == steps - 1)
          std::printf("step %d: loss %.9f (single process %.9f)\n", step, losses[static_cast<std::size_t>(step)],
                      alone_losses[static_cast<std::size_t>(step)]);
      std::printf("%s schedule, %d stages, %d micro-batches of %zu samples, %d steps: %s (max relative difference: "
                  "weights %.3g, losses %.3g; tolerance %.0e)\n",
                  schedule.c_str(), world, micro_batches, batch / m, steps,
                  same ? "pipeline matches the single-process model" : "PIPELINE DIFFERS from the single-process model",
                  worst[0], worst[1], tolerance);
    }
    pg->barrier().get(); // every rank done before any leaves
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_train: %s\n", e.what());
    return 1;
  }
}
