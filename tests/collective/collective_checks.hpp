#pragma once
// Every collective on every dtype against results computed directly here,
// for one rank of a group. Used by the thread-ranked tests (Boost.Test in the
// main thread) and by the process-ranked ones (children, no Boost.Test):
// checks return a list of failures instead of asserting.

#include <corodist/collective/process_group.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace corodist::test {

namespace cc = corodist::collective;

inline const std::vector<cc::dtype> all_dtypes = {cc::dtype::float32, cc::dtype::float64, cc::dtype::float16,
                                                  cc::dtype::bfloat16, cc::dtype::int32, cc::dtype::int64,
                                                  cc::dtype::uint8};
inline const std::vector<cc::reduce_op> all_ops = {cc::reduce_op::sum, cc::reduce_op::avg, cc::reduce_op::min,
                                                   cc::reduce_op::max, cc::reduce_op::product};

/// A host buffer of `count` elements of `type`.
struct buffer {
  buffer(cc::dtype t, std::size_t n) : type(t), count(n), bytes(n * cc::element_size(t) + 1) {}
  cc::tensor_view view() { return {bytes.data(), count, type}; }

  void set(std::size_t i, double v) {
    void* p = bytes.data() + i * cc::element_size(type);
    switch (type) {
    case cc::dtype::float32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
    case cc::dtype::float64: std::memcpy(p, &v, 8); break;
    case cc::dtype::float16: { auto b = cc::float16::from_float(static_cast<float>(v)); std::memcpy(p, &b, 2); break; }
    case cc::dtype::bfloat16: { auto b = cc::bfloat16::from_float(static_cast<float>(v)); std::memcpy(p, &b, 2); break; }
    case cc::dtype::int32: { auto x = static_cast<std::int32_t>(v); std::memcpy(p, &x, 4); break; }
    case cc::dtype::int64: { auto x = static_cast<std::int64_t>(v); std::memcpy(p, &x, 8); break; }
    case cc::dtype::uint8: { auto x = static_cast<std::uint8_t>(v); std::memcpy(p, &x, 1); break; }
    }
  }

  double get(std::size_t i) const {
    const void* p = bytes.data() + i * cc::element_size(type);
    switch (type) {
    case cc::dtype::float32: { float x; std::memcpy(&x, p, 4); return x; }
    case cc::dtype::float64: { double x; std::memcpy(&x, p, 8); return x; }
    case cc::dtype::float16: { std::uint16_t b; std::memcpy(&b, p, 2); return cc::float16::to_float(b); }
    case cc::dtype::bfloat16: { std::uint16_t b; std::memcpy(&b, p, 2); return cc::bfloat16::to_float(b); }
    case cc::dtype::int32: { std::int32_t x; std::memcpy(&x, p, 4); return x; }
    case cc::dtype::int64: { std::int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
    case cc::dtype::uint8: { std::uint8_t x; std::memcpy(&x, p, 1); return x; }
    }
    return NAN;
  }

  cc::dtype type;
  std::size_t count;
  std::vector<std::byte> bytes; // one spare byte: a guard that must stay untouched
};

/// The value rank `r` contributes at element `i` for `op`: small integers
/// (exact in every dtype, sums and products included), negative ones only
/// for signed types.
inline double input_value(int r, std::size_t i, cc::dtype t, cc::reduce_op op) {
  const bool is_signed = t != cc::dtype::uint8;
  const auto k = static_cast<long>(i);
  switch (op) {
  case cc::reduce_op::product: {
    double v = (r + k) % 3 == 0 ? 2.0 : 1.0;
    return is_signed && k % 5 == 0 ? -v : v;
  }
  case cc::reduce_op::min:
  case cc::reduce_op::max: return static_cast<double>((r * 7 + k * 3) % 13) - (is_signed ? 6.0 : 0.0);
  default: return static_cast<double>(((r + 1) * 3 + k % 7) % 11) - (is_signed ? 5.0 : 0.0);
  }
}

/// The reduction of input_value over `n` ranks at element `i`, as the dtype stores it.
inline double expected_value(int n, std::size_t i, cc::dtype t, cc::reduce_op op) {
  double acc = input_value(0, i, t, op);
  for (int r = 1; r < n; ++r) {
    const double v = input_value(r, i, t, op);
    switch (op) {
    case cc::reduce_op::sum:
    case cc::reduce_op::avg: acc += v; break;
    case cc::reduce_op::product: acc *= v; break;
    case cc::reduce_op::min: acc = std::min(acc, v); break;
    case cc::reduce_op::max: acc = std::max(acc, v); break;
    }
  }
  if (op == cc::reduce_op::avg)
    acc = cc::is_floating(t) ? acc / n : std::trunc(acc / n);
  return acc;
}

/// Relative tolerance of `t` (the rounding of one division for avg).
inline double tolerance(cc::dtype t) {
  switch (t) {
  case cc::dtype::float32: return 1e-6;
  case cc::dtype::float64: return 1e-12;
  case cc::dtype::float16: return 1e-3;
  case cc::dtype::bfloat16: return 8e-3;
  default: return 0.0;
  }
}

/// Collects failures: a text per wrong element (the first few) or error.
struct failures {
  std::vector<std::string> list;
  int wrong_elements = 0;

  void fail(std::string what) {
    if (list.size() < 40)
      list.push_back(std::move(what));
  }
  bool ok() const { return list.empty(); }
  std::string text() const {
    std::string s;
    for (const auto& l : list)
      s += l + "\n";
    return s;
  }

  /// Compares `b[i]` against `want(i)` for every element, and the guard byte.
  void compare(const std::string& what, const buffer& b, const std::function<double(std::size_t)>& want) {
    for (std::size_t i = 0; i < b.count; ++i) {
      const double w = want(i);
      const double got = b.get(i);
      if (std::fabs(got - w) > tolerance(b.type) * std::max(1.0, std::fabs(w))) {
        if (++wrong_elements <= 5)
          fail(what + ": element " + std::to_string(i) + " is " + std::to_string(got) + ", expected " +
               std::to_string(w));
        return;
      }
    }
    if (b.bytes.back() != std::byte{0})
      fail(what + ": wrote past the end of the buffer");
  }

  /// Runs `w` to completion; records its error.
  bool run(const std::string& what, cc::work w) {
    try {
      w.get();
      return true;
    } catch (const std::exception& e) {
      fail(what + ": threw " + e.what());
      return false;
    }
  }
};

inline std::string name_of(cc::dtype t, cc::reduce_op op, std::size_t n) {
  return std::string(cc::to_string(t)) + "/" + std::string(cc::to_string(op)) + " x" + std::to_string(n);
}

/// Allreduce of `count` elements of `t` with `op` on `pg`, checked.
inline void check_allreduce(cc::process_group& pg, failures& f, cc::dtype t, cc::reduce_op op, std::size_t count) {
  buffer b(t, count);
  for (std::size_t i = 0; i < count; ++i)
    b.set(i, input_value(pg.rank(), i, t, op));
  const auto what = "allreduce " + name_of(t, op, count);
  if (f.run(what, pg.allreduce(b.view(), op)))
    f.compare(what, b, [&](std::size_t i) { return expected_value(pg.size(), i, t, op); });
}

/// Every op on every dtype (allreduce, reduce_scatter), broadcast from each
/// root, allgather, barrier, the coalesced forms; uneven sizes: 1 and a prime.
inline failures check_every_collective(cc::process_group& pg) {
  failures f;
  const int n = pg.size(), me = pg.rank();
  for (auto t : all_dtypes)
    for (auto op : all_ops)
      check_allreduce(pg, f, t, op, 1000);
  for (auto t : all_dtypes) {
    check_allreduce(pg, f, t, cc::reduce_op::sum, 1);
    check_allreduce(pg, f, t, cc::reduce_op::sum, 1009); // prime
  }
  for (auto t : all_dtypes)
    for (int root = 0; root < n; ++root) {
      buffer b(t, 257);
      for (std::size_t i = 0; i < b.count; ++i)
        b.set(i, me == root ? input_value(root, i, t, cc::reduce_op::min) : 0.0);
      const auto what = "broadcast " + std::string(cc::to_string(t)) + " from " + std::to_string(root);
      if (f.run(what, pg.broadcast(b.view(), root)))
        f.compare(what, b, [&](std::size_t i) { return input_value(root, i, t, cc::reduce_op::min); });
    }
  for (auto t : all_dtypes) {
    const std::size_t per = 33;
    buffer in(t, per), out(t, per * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < per; ++i)
      in.set(i, input_value(me, i, t, cc::reduce_op::min));
    const auto what = "allgather " + std::string(cc::to_string(t));
    if (f.run(what, pg.allgather(in.view(), out.view())))
      f.compare(what, out, [&](std::size_t i) { return input_value(static_cast<int>(i / per), i % per, t, cc::reduce_op::min); });
  }
  for (auto t : all_dtypes)
    for (auto op : all_ops) {
      const std::size_t per = 50;
      buffer in(t, per * static_cast<std::size_t>(n)), out(t, per);
      for (std::size_t i = 0; i < in.count; ++i)
        in.set(i, input_value(me, i, t, op));
      const auto what = "reduce_scatter " + name_of(t, op, in.count);
      if (f.run(what, pg.reduce_scatter(in.view(), out.view(), op)))
        f.compare(what, out, [&](std::size_t i) { return expected_value(n, static_cast<std::size_t>(me) * per + i, t, op); });
    }
  for (int i = 0; i < 3; ++i)
    f.run("barrier", pg.barrier());
  {
    // Mixed dtypes in one coalesced call.
    std::vector<buffer> bufs{{cc::dtype::float32, 100}, {cc::dtype::int64, 3}, {cc::dtype::float32, 1},
                             {cc::dtype::float16, 50}, {cc::dtype::uint8, 17}};
    for (auto op : {cc::reduce_op::sum, cc::reduce_op::avg, cc::reduce_op::max}) {
      std::vector<cc::tensor_view> views;
      for (auto& b : bufs) {
        for (std::size_t i = 0; i < b.count; ++i)
          b.set(i, input_value(me, i, b.type, op));
        views.push_back(b.view());
      }
      const auto what = "allreduce_coalesced " + std::string(cc::to_string(op));
      if (f.run(what, pg.allreduce_coalesced(views, op)))
        for (auto& b : bufs)
          f.compare(what + " " + std::string(cc::to_string(b.type)), b,
                    [&](std::size_t i) { return expected_value(n, i, b.type, op); });
    }
    for (int root = 0; root < n; ++root) {
      std::vector<cc::tensor_view> views;
      for (auto& b : bufs) {
        for (std::size_t i = 0; i < b.count; ++i)
          b.set(i, me == root ? input_value(root, i, b.type, cc::reduce_op::min) : 0.0);
        views.push_back(b.view());
      }
      const auto what = "broadcast_coalesced from " + std::to_string(root);
      if (f.run(what, pg.broadcast_coalesced(views, root)))
        for (auto& b : bufs)
          f.compare(what + " " + std::string(cc::to_string(b.type)), b,
                    [&](std::size_t i) { return input_value(root, i, b.type, cc::reduce_op::min); });
    }
  }
  return f;
}

} // namespace corodist::test
