// A mixture-of-experts layer across ranks: token dispatch and return with
// all_to_all_single and uneven splits.
//
//   build/tools/corodist-run --nproc 4 -- build/examples/moe_dispatch
//
// Rank r holds 12 + 5 r tokens (vectors of 8 float32, drawn from a seed and
// r) and expert r (y = A_r x + c_r, drawn from a seed and r). A router
// (the same linear scores on every rank, with a bias that favours the low
// experts) sends each token to its top-scoring expert and weighs the
// expert's answer with that score's softmax probability (top-1 gating). As
// MoE layers do, each rank then
//   1. counts its tokens per expert and exchanges the counts with an even
//      all_to_all_single (one int64 per rank each way), so that every rank
//      knows how many tokens it will receive from each rank;
//   2. sorts its tokens by expert and dispatches them with an uneven
//      all_to_all_single (its counts as input splits, the received counts as
//      output splits, times the dimension);
//   3. runs its expert over the tokens it received;
//   4. returns the answers with the inverse all_to_all_single (the splits
//      swapped), and puts them back in token order, weighted by the gate.
// Each rank checks the counts it received and every output against a
// single-process reference: the same router and experts applied to its
// tokens in one process (tolerance 1e-6, relative to the largest output). It
// prints what it sent, received and checked; rank 0 prints the verdict over
// all ranks (an allreduce); every rank exits 1 on a mismatch.
#include "usage.hpp"

#include <corodist/collective/gloo_group.hpp>
#include <corodist/core/event_loop.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

namespace cc = corodist::collective;

constexpr std::size_t dim = 8;
constexpr unsigned seed = 2024;
constexpr float tolerance = 1e-6f;

std::size_t tokens_on(int rank) { return 12 + 5 * static_cast<std::size_t>(rank); }

/// The tokens of `rank`: tokens_on(rank) rows of `dim`.
std::vector<float> tokens_of(int rank) {
  std::mt19937 rng(seed + 100 + static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(tokens_on(rank) * dim);
  for (auto& v : x)
    v = u(rng);
  return x;
}

/// Expert `e`: y = A x + c.
struct expert {
  std::vector<float> a = std::vector<float>(dim * dim), c = std::vector<float>(dim);

  explicit expert(int e) {
    std::mt19937 rng(seed + 200 + static_cast<unsigned>(e));
    std::normal_distribution<float> d(0.0f, 0.5f);
    for (auto& v : a)
      v = d(rng);
    for (auto& v : c)
      v = d(rng);
  }

  /// Writes A x + c for the row at `x` to the row at `y`.
  void apply(const float* x, float* y) const {
    for (std::size_t j = 0; j < dim; ++j) {
      float s = c[j];
      for (std::size_t i = 0; i < dim; ++i)
        s += a[j * dim + i] * x[i];
      y[j] = s;
    }
  }
};

/// The router over `experts` experts: scores W x + bias, top-1.
struct router {
  int experts;
  std::vector<float> w, bias;

  explicit router(int n) : experts(n), w(static_cast<std::size_t>(n) * dim), bias(static_cast<std::size_t>(n)) {
    std::mt19937 rng(seed + 300);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : w)
      v = d(rng);
    for (int e = 0; e < n; ++e)
      bias[static_cast<std::size_t>(e)] = -0.5f * static_cast<float>(e); // the low experts are busier
  }

  struct choice {
    int expert;
    float gate; // the chosen score's softmax probability
  };

  choice route(const float* x) const {
    std::vector<float> score(static_cast<std::size_t>(experts));
    for (std::size_t e = 0; e < score.size(); ++e) {
      score[e] = bias[e];
      for (std::size_t i = 0; i < dim; ++i)
        score[e] += w[e * dim + i] * x[i];
    }
    const auto best = static_cast<std::size_t>(std::max_element(score.begin(), score.end()) - score.begin());
    float norm = 0;
    for (float s : score)
      norm += std::exp(s - score[best]);
    return {static_cast<int>(best), 1.0f / norm};
  }
};

/// The layer's output for the tokens `x` computed in one process: every
/// token through its expert, weighed by its gate.
std::vector<float> reference(const std::vector<float>& x, const router& r, const std::vector<expert>& experts) {
  std::vector<float> y(x.size());
  for (std::size_t t = 0; t < x.size() / dim; ++t) {
    const auto [e, gate] = r.route(&x[t * dim]);
    experts[static_cast<std::size_t>(e)].apply(&x[t * dim], &y[t * dim]);
    for (std::size_t j = 0; j < dim; ++j)
      y[t * dim + j] *= gate;
  }
  return y;
}

/// "[a b c]".
std::string list(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0)
      s += ' ';
    s += std::to_string(v[i]);
  }
  s += ']';
  return s;
}

} // namespace

int main(int argc, char** argv) {
  if (auto status = examples::no_arguments(
          argc, argv,
          "A mixture-of-experts layer across ranks: one expert per rank, tokens dispatched and returned with\n"
          "all_to_all_single and uneven splits, checked against a single-process reference.\n"
          "Run it under corodist-run: corodist-run --nproc 4 -- moe_dispatch"))
    return *status;
  try {
    corodist::event_loop loop;
    loop.start();
    // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from corodist-run (its launcher hosts the store).
    auto pg = cc::gloo_group::create_sync(loop, "env://");
    const int rank = pg->rank(), world = pg->size();
    const auto n = static_cast<std::size_t>(world);
    const router route(world);
    const expert mine(rank);
    std::vector<float> x = tokens_of(rank);
    const std::size_t count = tokens_on(rank);

    // Route, count per expert, and sort the tokens by expert (stable).
    std::vector<router::choice> choices;
    std::vector<std::int64_t> send_counts(n, 0);
    for (std::size_t t = 0; t < count; ++t) {
      choices.push_back(route.route(&x[t * dim]));
      ++send_counts[static_cast<std::size_t>(choices.back().expert)];
    }
    std::vector<std::size_t> order(count); // order[k]: the token sent k-th
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return choices[a].expert < choices[b].expert; });
    std::vector<float> send(count * dim);
    for (std::size_t k = 0; k < count; ++k)
      std::copy_n(&x[order[k] * dim], dim, &send[k * dim]);

    // 1. The counts: an even all_to_all_single, one element to and from each rank.
    std::vector<std::int64_t> recv_counts(n);
    pg->all_to_all_single(send_counts, recv_counts).get();

    // 2. Dispatch: uneven splits, in elements.
    std::vector<std::size_t> in_splits(n), out_splits(n);
    for (std::size_t j = 0; j < n; ++j) {
      in_splits[j] = static_cast<std::size_t>(send_counts[j]) * dim;
      out_splits[j] = static_cast<std::size_t>(recv_counts[j]) * dim;
    }
    const std::size_t received = std::accumulate(out_splits.begin(), out_splits.end(), std::size_t{0}) / dim;
    std::vector<float> expert_in(received * dim);
    pg->all_to_all_single(send, expert_in, in_splits, out_splits).get();

    // 3. This rank's expert over every token it received.
    std::vector<float> expert_out(expert_in.size());
    for (std::size_t t = 0; t < received; ++t)
      mine.apply(&expert_in[t * dim], &expert_out[t * dim]);

    // 4. Back to the tokens' ranks: the inverse exchange (splits swapped), then token order and the gate.
    std::vector<float> back(send.size());
    pg->all_to_all_single(expert_out, back, out_splits, in_splits).get();
    std::vector<float> y(x.size());
    for (std::size_t k = 0; k < count; ++k)
      for (std::size_t j = 0; j < dim; ++j)
        y[order[k] * dim + j] = back[k * dim + j] * choices[order[k]].gate;

    // The check: every expert and every rank's tokens rebuilt in this process.
    std::vector<expert> experts;
    for (int e = 0; e < world; ++e)
      experts.emplace_back(e);
    std::vector<std::int64_t> want_counts(n, 0); // tokens of rank j routed to this rank's expert
    for (int j = 0; j < world; ++j) {
      const std::vector<float> theirs = tokens_of(j);
      for (std::size_t t = 0; t < tokens_on(j); ++t)
        if (route.route(&theirs[t * dim]).expert == rank)
          ++want_counts[static_cast<std::size_t>(j)];
    }
    const std::vector<float> want = reference(x, route, experts);
    float diff = 0, scale = 0;
    for (std::size_t e = 0; e < want.size(); ++e) {
      diff = std::max(diff, std::abs(y[e] - want[e]));
      scale = std::max(scale, std::abs(want[e]));
    }
    const bool counts_ok = recv_counts == want_counts;
    const bool ok = counts_ok && diff <= tolerance * scale;
    std::printf("rank %d: %zu tokens, sent %s to experts 0..%d, expert %d received %s from ranks 0..%d (%s); outputs "
                "%s the single-process reference (max difference %.3g, largest output %.3g)\n",
                rank, count, list(send_counts).c_str(), world - 1, rank, list(recv_counts).c_str(), world - 1,
                counts_ok ? "the counts expected" : "NOT the counts expected", ok ? "match" : "DIFFER from", diff,
                scale);
    std::fflush(stdout);

    // The verdict over the ranks; and whether the splits were uneven anywhere.
    const std::int64_t even = std::all_of(send_counts.begin(), send_counts.end(),
                                          [&](std::int64_t c) { return c == send_counts[0]; });
    std::vector<std::int64_t> verdict = {ok ? 0 : 1, even, static_cast<std::int64_t>(count)};
    pg->allreduce(verdict, cc::reduce_op::sum).get();
    if (rank == 0)
      std::printf("moe_dispatch: %lld tokens on %d ranks, %s splits: %s\n", static_cast<long long>(verdict[2]), world,
                  verdict[1] == world ? "even" : "uneven",
                  verdict[0] == 0 ? "every rank's outputs match the single-process reference"
                                  : "SOME RANK'S OUTPUTS DIFFER from the single-process reference");
    pg->barrier().get(); // every rank done before any leaves
    return verdict[0] == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe_dispatch: %s\n", e.what());
    return 1;
  }
}
