#pragma once
// Fixtures of the DDP reducer's multi-process tests (rank processes: checks
// throw, no Boost.Test there), shared with the hosts suite: a model of plain
// vectors, the gradients every rank computes and their exact mean.

#include <corodist/collective/float16.hpp>
#include <corodist/collective/process_group.hpp>
#include <corodist/ddp/parameter.hpp>
#include <corodist/ddp/reducer.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <stdexcept>
#include <vector>

/// Thrown by a rank's checks; the rank prints it and exits 1.
#define CHECK(cond, ...)                                                                                              \
  do {                                                                                                                \
    if (!(cond))                                                                                                      \
      throw std::runtime_error(fmt::format("{}:{}: failed: {} ", __FILE__, __LINE__, #cond) +                         \
                               fmt::format(__VA_ARGS__));                                                             \
  } while (0)


namespace corodist::test::reducer_fixtures {


/// A model of plain vectors: parameter k has sizes[k] elements.
template <typename T>
struct model {
  explicit model(std::vector<std::size_t> sizes) {
    for (auto s : sizes) {
      values.emplace_back(s, T(0));
      grads.emplace_back(s, T(0));
    }
  }
  std::vector<corodist::ddp::parameter> parameters(bool with_grads = true) {
    std::vector<corodist::ddp::parameter> ps;
    for (std::size_t k = 0; k < values.size(); ++k)
      ps.emplace_back(std::span<T>(values[k]), with_grads ? std::span<T>(grads[k]) : std::span<T>(),
                      fmt::format("p{}", k));
    return ps;
  }
  std::vector<std::vector<T>> values, grads;
};

/// The gradient rank r computes for element j of parameter k at iteration it:
/// small multiples of 1/8 (exact in float, so that sums are exact).
inline double grad_value(int r, int it, std::size_t k, std::size_t j) {
  return static_cast<double>(static_cast<int>((r + 1) * 3 + it * 5 + static_cast<int>(k) * 7 + static_cast<int>(j % 13)) % 29 - 14) /
         8.0;
}

/// The mean over `size` ranks of grad_value.
inline double mean_grad(int size, int it, std::size_t k, std::size_t j) {
  double s = 0;
  for (int r = 0; r < size; ++r)
    s += grad_value(r, it, k, j);
  return s / size;
}

/// Writes rank r's gradients of iteration `it` into `red.gradient(k)`.
template <typename T>
inline void fill_grad(corodist::ddp::reducer& red, int r, int it, std::size_t k) {
  auto g = red.gradient(k);
  auto* p = static_cast<T*>(g.data());
  for (std::size_t j = 0; j < g.count(); ++j)
    p[j] = static_cast<T>(grad_value(r, it, k, j));
}

/// `v` as a double (float16 through float).
template <typename T>
inline double as_double(T v) {
  if constexpr (std::is_same_v<T, corodist::collective::float16>)
    return static_cast<double>(static_cast<float>(v));
  else
    return static_cast<double>(v);
}

template <typename T>
inline void check_mean(corodist::ddp::reducer& red, int size, int it, std::size_t k, double tol = 1e-6) {
  auto g = red.gradient(k);
  const auto* p = static_cast<const T*>(g.data());
  for (std::size_t j = 0; j < g.count(); ++j) {
    const double want = mean_grad(size, it, k, j);
    CHECK(std::abs(as_double(p[j]) - want) <= tol * std::max(1.0, std::abs(want)),
          "iteration {} parameter {} element {}: {} != {}", it, k, j, as_double(p[j]), want);
  }
}

/// True when every rank's `v` has the same bytes as rank 0's.
template <typename T>
inline bool same_on_all_ranks(corodist::collective::process_group& pg, std::vector<T>& v) {
  std::vector<T> all(v.size() * static_cast<std::size_t>(pg.size()));
  pg.allgather(v, all).get();
  for (int r = 1; r < pg.size(); ++r)
    if (std::memcmp(all.data(), all.data() + static_cast<std::size_t>(r) * v.size(), v.size() * sizeof(T)) != 0)
      return false;
  return true;
}

} // namespace corodist::test::reducer_fixtures
