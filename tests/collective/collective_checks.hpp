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

/// The value rank `src` sends rank `dst` at element `i` of an all-to-all or
/// point-to-point exchange (exact in every dtype).
inline double pair_value(int src, int dst, std::size_t i) {
  return static_cast<double>((src * 17 + dst * 5 + static_cast<int>(i % 23)) % 61);
}

/// The elements rank `src` sends rank `dst` in the skewed all-to-all: 0 for
/// some pairs, up to 12 for others.
inline std::size_t skewed_count(int src, int dst) { return static_cast<std::size_t>((src * 7 + dst * 3) % 13); }

/// The operations beyond the classic collectives, every dtype where it
/// matters: gather, scatter and reduce from each root (every op), all_to_all_single
/// even and skewed, all_to_all over lists, allgatherv, send/recv around a
/// ring (batched, in opposite orders on odd and even ranks) and monitored_barrier.
inline failures check_every_new_operation(cc::process_group& pg) {
  failures f;
  const int n = pg.size(), me = pg.rank();
  const auto un = static_cast<std::size_t>(n);
  for (auto t : all_dtypes)
    for (int root = 0; root < n; ++root) {
      const std::size_t per = 21;
      buffer in(t, per), out(t, me == root ? per * un : 0);
      for (std::size_t i = 0; i < per; ++i)
        in.set(i, pair_value(me, root, i));
      const auto what = "gather " + std::string(cc::to_string(t)) + " to " + std::to_string(root);
      if (f.run(what, pg.gather(in.view(), out.view(), root)) && me == root)
        f.compare(what, out, [&](std::size_t i) { return pair_value(static_cast<int>(i / per), root, i % per); });
      buffer whole(t, me == root ? per * un : 0), mine(t, per);
      for (std::size_t i = 0; i < whole.count; ++i)
        whole.set(i, pair_value(root, static_cast<int>(i / per), i % per));
      const auto swhat = "scatter " + std::string(cc::to_string(t)) + " from " + std::to_string(root);
      if (f.run(swhat, pg.scatter(whole.view(), mine.view(), root)))
        f.compare(swhat, mine, [&](std::size_t i) { return pair_value(root, me, i); });
    }
  for (auto t : all_dtypes)
    for (auto op : all_ops)
      for (int root = 0; root < n; ++root) {
        buffer b(t, 77);
        for (std::size_t i = 0; i < b.count; ++i)
          b.set(i, input_value(me, i, t, op));
        const auto what = "reduce " + name_of(t, op, b.count) + " to " + std::to_string(root);
        if (f.run(what, pg.reduce(b.view(), root, op)) && me == root)
          f.compare(what, b, [&](std::size_t i) { return expected_value(n, i, t, op); });
      }
  for (auto t : {cc::dtype::float32, cc::dtype::int64, cc::dtype::uint8, cc::dtype::float16}) {
    const std::size_t per = 9;
    buffer in(t, per * un), out(t, per * un);
    for (std::size_t i = 0; i < in.count; ++i)
      in.set(i, pair_value(me, static_cast<int>(i / per), i % per));
    const auto what = "all_to_all_single even " + std::string(cc::to_string(t));
    if (f.run(what, pg.all_to_all_single(in.view(), out.view())))
      f.compare(what, out, [&](std::size_t i) { return pair_value(static_cast<int>(i / per), me, i % per); });
    // Skewed: rank src sends skewed_count(src, dst) elements to dst.
    std::vector<std::size_t> ins, outs, out_at;
    std::size_t in_total = 0, out_total = 0;
    for (int p = 0; p < n; ++p) {
      ins.push_back(skewed_count(me, p));
      outs.push_back(skewed_count(p, me));
      out_at.push_back(out_total);
      in_total += ins.back();
      out_total += outs.back();
    }
    buffer sin(t, in_total), sout(t, out_total);
    for (std::size_t at = 0, p = 0; p < un; at += ins[p], ++p)
      for (std::size_t i = 0; i < ins[p]; ++i)
        sin.set(at + i, pair_value(me, static_cast<int>(p), i));
    const auto swhat = "all_to_all_single skewed " + std::string(cc::to_string(t));
    if (f.run(swhat, pg.all_to_all_single(sin.view(), sout.view(), ins, outs)))
      f.compare(swhat, sout, [&](std::size_t i) {
        std::size_t p = un - 1;
        while (out_at[p] > i)
          --p;
        return pair_value(static_cast<int>(p), me, i - out_at[p]);
      });
    // Lists: the same skewed counts, one buffer per rank.
    std::vector<buffer> lin, lout;
    std::vector<cc::tensor_view> vin, vout;
    for (int p = 0; p < n; ++p) {
      lin.emplace_back(t, skewed_count(me, p));
      lout.emplace_back(t, skewed_count(p, me));
    }
    for (int p = 0; p < n; ++p) {
      for (std::size_t i = 0; i < lin[static_cast<std::size_t>(p)].count; ++i)
        lin[static_cast<std::size_t>(p)].set(i, pair_value(me, p, i));
      vin.push_back(lin[static_cast<std::size_t>(p)].view());
      vout.push_back(lout[static_cast<std::size_t>(p)].view());
    }
    const auto lwhat = "all_to_all lists " + std::string(cc::to_string(t));
    if (f.run(lwhat, pg.all_to_all(vin, vout)))
      for (int p = 0; p < n; ++p)
        f.compare(lwhat + " from " + std::to_string(p), lout[static_cast<std::size_t>(p)],
                  [&](std::size_t i) { return pair_value(p, me, i); });
    // allgatherv: rank r contributes skewed_count(r, 0) + 1 elements.
    std::vector<std::size_t> counts, at;
    std::size_t total = 0;
    for (int p = 0; p < n; ++p) {
      counts.push_back(skewed_count(p, 0) + 1);
      at.push_back(total);
      total += counts.back();
    }
    buffer gin(t, counts[static_cast<std::size_t>(me)]), gout(t, total);
    for (std::size_t i = 0; i < gin.count; ++i)
      gin.set(i, pair_value(me, 0, i));
    const auto gwhat = "allgatherv " + std::string(cc::to_string(t));
    if (f.run(gwhat, pg.allgatherv(gin.view(), gout.view(), counts)))
      f.compare(gwhat, gout, [&](std::size_t i) {
        std::size_t p = un - 1;
        while (at[p] > i)
          --p;
        return pair_value(static_cast<int>(p), 0, i - at[p]);
      });
  }
  if (n > 1) {
    // A ring: each rank sends to the next and receives from the previous, in
    // one batch listed receive-first on even ranks and send-first on odd ones.
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    for (auto t : all_dtypes) {
      buffer out(t, 1000), in(t, 1000);
      for (std::size_t i = 0; i < out.count; ++i)
        out.set(i, pair_value(me, next, i));
      std::vector<cc::p2p_op> ops{cc::p2p_op::isend(out.view(), next, 3), cc::p2p_op::irecv(in.view(), prev, 3)};
      if (me % 2 == 0)
        std::swap(ops[0], ops[1]);
      const auto what = "batch_isend_irecv ring " + std::string(cc::to_string(t));
      if (f.run(what, pg.batch_isend_irecv(ops)))
        f.compare(what, in, [&](std::size_t i) { return pair_value(prev, me, i); });
    }
    // Single sends and receives: every rank sends rank 0 a buffer; rank 0
    // receives them from any rank, one at a time, and checks who sent which.
    if (me != 0) {
      buffer one(cc::dtype::int64, 5);
      for (std::size_t i = 0; i < one.count; ++i)
        one.set(i, pair_value(me, 0, i));
      f.run("send to 0", pg.send(one.view(), 0, 11));
    } else {
      std::vector<int> seen(un, 0);
      for (int k = 1; k < n; ++k) {
        buffer got(cc::dtype::int64, 5);
        cc::work w = pg.recv(got.view(), cc::any_source, 11);
        try {
          w.get();
          const int src = w.source_rank();
          if (src < 1 || src >= n || seen[static_cast<std::size_t>(src)]++ != 0) {
            f.fail("recv from any rank: source_rank() is " + std::to_string(src));
            continue;
          }
          f.compare("recv from any rank (" + std::to_string(src) + ")", got,
                    [&](std::size_t i) { return pair_value(src, 0, i); });
        } catch (const std::exception& e) {
          f.fail(std::string("recv from any rank: threw ") + e.what());
        }
      }
    }
    // A receive from a named rank reports it as the source too.
    buffer b(cc::dtype::float32, 3);
    for (std::size_t i = 0; i < b.count; ++i)
      b.set(i, pair_value(me, next, i));
    cc::work s = pg.send(b.view(), next, 12);
    buffer got(cc::dtype::float32, 3);
    cc::work r = pg.recv(got.view(), prev, 12);
    try {
      s.get();
      r.get();
      if (r.source_rank() != prev)
        f.fail("recv from " + std::to_string(prev) + ": source_rank() is " + std::to_string(r.source_rank()));
      f.compare("send/recv around the ring", got, [&](std::size_t i) { return pair_value(prev, me, i); });
    } catch (const std::exception& e) {
      f.fail(std::string("send/recv around the ring: threw ") + e.what());
    }
  }
  f.run("monitored_barrier", pg.monitored_barrier());
  return f;
}

} // namespace corodist::test
