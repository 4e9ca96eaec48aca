#include <corodist/ddp/reducer.hpp>

#include <corodist/collective/errors.hpp>
#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/future.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/ddp/errors.hpp>

#include "ddp/grad_ops.hpp"
#include "ddp/wake_event.hpp"

#include <asio/co_spawn.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

namespace corodist::ddp {

namespace cc = corodist::collective;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr std::uint8_t unmarked = 0;
constexpr std::uint8_t marked = 1;
constexpr std::uint8_t declared_unused = 2;

std::string param_name(const parameter& p, std::size_t i) {
  return p.name.empty() ? fmt::format("parameter {}", i) : fmt::format("parameter {} ('{}')", i, p.name);
}

std::string describe(std::int64_t count, std::int64_t type, std::int64_t dev) {
  const auto t = static_cast<cc::dtype>(type);
  const cc::device d{dev >= 1000 ? cc::device::kind_type::cuda : cc::device::kind_type::cpu,
                     static_cast<int>(dev % 1000)};
  return fmt::format("{} x {} on {}", cc::to_string(t), count, d.to_string());
}

/// A time interval of one collective of the iteration.
struct interval {
  clock_type::time_point begin, end;
};

/// Length of the union of `v`, and of its part before `until`.
std::pair<std::chrono::nanoseconds, std::chrono::nanoseconds> union_length(std::vector<interval> v,
                                                                            clock_type::time_point until) {
  std::sort(v.begin(), v.end(), [](const interval& a, const interval& b) { return a.begin < b.begin; });
  std::chrono::nanoseconds total{0}, before{0};
  std::optional<interval> cur;
  auto flush = [&] {
    if (!cur)
      return;
    total += cur->end - cur->begin;
    if (cur->begin < until)
      before += std::min(cur->end, until) - cur->begin;
  };
  for (const auto& i : v) {
    if (cur && i.begin <= cur->end) {
      cur->end = std::max(cur->end, i.end);
    } else {
      flush();
      cur = i;
    }
  }
  flush();
  return {total, before};
}

} // namespace

struct reducer::impl {
  // The reducer's own loop when none was given (destroyed last).
  std::unique_ptr<event_loop> own_loop;
  asio::any_io_executor ex;
  std::shared_ptr<cc::process_group> pg;
  std::vector<parameter> params;
  reducer_options opts;
  cc::call_options call;       // the iteration's collectives: the reducer's deadline
  cc::call_options setup_call; // construction's: the group's deadline (ranks arrive at their own pace)
  int world = 1;
  std::size_t n = 0;

  // Buckets.
  bucket_layout layout;
  std::vector<std::size_t> bucket_of, offset_of;
  std::vector<std::vector<std::uint64_t>> storage; // bucket memory (8-byte aligned)
  comm_hook hook;

  // Marks: written by any thread, read by the loop.
  std::unique_ptr<std::atomic<std::uint8_t>[]> marks;
  std::unique_ptr<std::atomic<std::uint32_t>[]> slots; // parameter + 1 in mark order; 0: not yet written
  std::atomic<std::uint32_t> write_pos{0};
  std::atomic<bool> abandon{false};
  std::optional<detail::wake_event> wake;

  // The caller's side of the iteration.
  std::atomic<bool> sync{true};
  bool in_iteration = false;
  bool local_iteration = false;
  std::uint64_t iterations = 0;
  std::uint64_t synced_iterations = 0;
  std::optional<future<void>> done;
  clock_type::time_point prepared_at, finalize_at;
  std::size_t declared_used_count = 0;

  // The loop's side of the iteration (touched only there until `done` is ready).
  std::uint32_t read_pos = 0;
  std::vector<std::size_t> pending; // gradients still missing per bucket
  std::vector<clock_type::time_point> ready_at, launched_at, reduced_at;
  std::vector<std::size_t> ready_order; // parameters in the order the loop saw them
  std::vector<std::int32_t> used_map;   // 1: used here (the bitmap allreduced)
  std::vector<interval> comm;
  std::size_t next_launch = 0;
  std::size_t completed = 0;
  std::size_t in_flight = 0; // collectives of this iteration not yet finished
  bool signalled = false;    // a completion arrived (for the loop's own wait)
  std::exception_ptr first_error;
  std::size_t copied = 0;
  bool rebuilt = false;
  bool rebuilt_now = false;
  std::vector<std::size_t> globally_unused;
  iteration_stats stats;

  impl(asio::any_io_executor e, std::unique_ptr<event_loop> loop, std::shared_ptr<cc::process_group> g,
       std::vector<parameter> ps, reducer_options o)
      : own_loop(std::move(loop)), ex(std::move(e)), pg(std::move(g)), params(std::move(ps)), opts(std::move(o)) {
    if (!pg)
      throw usage_error("ddp::reducer: no process group");
    world = pg->size();
    n = params.size();
    call.timeout = opts.timeout;
    validate_locally();
    marks = std::make_unique<std::atomic<std::uint8_t>[]>(n);
    slots = std::make_unique<std::atomic<std::uint32_t>[]>(n);
    for (std::size_t i = 0; i < n; ++i) {
      marks[i].store(unmarked, std::memory_order_relaxed);
      slots[i].store(0, std::memory_order_relaxed);
    }
    ready_order.reserve(n);
    used_map.assign(n, 0);
    wake.emplace(ex);
  }

  void validate_locally() const {
    if (n == 0)
      throw usage_error("ddp::reducer: no parameters registered");
    if (n >= std::numeric_limits<std::uint32_t>::max())
      throw usage_error("ddp::reducer: too many parameters");
    if (opts.bucket_cap_bytes == 0 || opts.first_bucket_bytes == 0)
      throw usage_error("ddp::reducer: bucket_cap_bytes and first_bucket_bytes must be positive");
    for (std::size_t i = 0; i < n; ++i) {
      const auto& p = params[i];
      if (p.count == 0)
        throw usage_error("ddp::reducer: " + param_name(p, i) +
                          " has no elements (or a gradient of another size than its values)");
      if (p.values == nullptr)
        throw usage_error("ddp::reducer: " + param_name(p, i) + " has no values (null pointer)");
      if (!opts.gradient_as_bucket_view && p.grad == nullptr)
        throw usage_error("ddp::reducer: " + param_name(p, i) +
                          " has no gradient (null pointer; only gradient_as_bucket_view keeps gradients in buckets)");
      if (!cc::is_floating(p.type))
        throw usage_error("ddp::reducer: " + param_name(p, i) + " has dtype " + std::string(cc::to_string(p.type)) +
                          ": gradients must be floating (float32, float64, float16, bfloat16)");
      if (p.where != cc::device::cpu())
        throw usage_error("ddp::reducer: " + param_name(p, i) + " lives on " + p.where.to_string() +
                          ": this reducer handles host memory only");
    }
    for (const auto& b : opts.buffers)
      if (b.data() == nullptr && b.count() > 0)
        throw usage_error("ddp::reducer: a registered buffer has a null pointer");
  }

  // ---- construction (on the loop) -------------------------------------------------

  asio::awaitable<void> setup() {
    co_await verify_across_ranks();
    // Initial state from rank 0, coalesced (comm.h's broadcast_coalesced of the state dict).
    std::vector<cc::tensor_view> state;
    for (const auto& p : params)
      state.emplace_back(p.values, p.count, p.type, p.where);
    for (const auto& b : opts.buffers)
      if (b.count() > 0)
        state.push_back(b);
    co_await pg->broadcast_coalesced(std::move(state), 0, setup_call);
    apply_layout(bucket_layout::compute(params, {}, opts.first_bucket_bytes, opts.bucket_cap_bytes), false);
  }

  asio::awaitable<void> verify_across_ranks() {
    std::int64_t count = static_cast<std::int64_t>(n);
    std::vector<std::int64_t> counts(static_cast<std::size_t>(world));
    co_await pg->allgather(cc::tensor_view(&count, 1, cc::dtype::int64),
                           cc::tensor_view(counts.data(), counts.size(), cc::dtype::int64), setup_call);
    for (int r = 1; r < world; ++r)
      if (counts[static_cast<std::size_t>(r)] != counts[0]) {
        std::string ranks;
        for (int q = 1; q < world; ++q)
          if (counts[static_cast<std::size_t>(q)] != counts[0])
            ranks += fmt::format(", rank {} has {}", q, counts[static_cast<std::size_t>(q)]);
        throw parameter_mismatch_error(
            fmt::format("ddp::reducer: the ranks registered different numbers of parameters: rank 0 has {}{}",
                        counts[0], ranks),
            static_cast<std::size_t>(std::min(counts[0], count)));
      }
    std::vector<std::int64_t> mine(3 * n), all(3 * n * static_cast<std::size_t>(world));
    for (std::size_t i = 0; i < n; ++i) {
      mine[3 * i] = static_cast<std::int64_t>(params[i].count);
      mine[3 * i + 1] = static_cast<std::int64_t>(params[i].type);
      mine[3 * i + 2] = (params[i].where.kind == cc::device::kind_type::cuda ? 1000 : 0) + params[i].where.index;
    }
    co_await pg->allgather(cc::tensor_view(mine.data(), mine.size(), cc::dtype::int64),
                           cc::tensor_view(all.data(), all.size(), cc::dtype::int64), setup_call);
    for (std::size_t i = 0; i < n; ++i) {
      auto at = [&](int r, std::size_t k) { return all[static_cast<std::size_t>(r) * 3 * n + 3 * i + k]; };
      std::string differ;
      for (int r = 1; r < world; ++r)
        if (at(r, 0) != at(0, 0) || at(r, 1) != at(0, 1) || at(r, 2) != at(0, 2))
          differ += fmt::format(", rank {} has {}", r, describe(at(r, 0), at(r, 1), at(r, 2)));
      if (!differ.empty())
        throw parameter_mismatch_error(fmt::format("ddp::reducer: {} differs between ranks: rank 0 has {}{}",
                                                   param_name(params[i], i), describe(at(0, 0), at(0, 1), at(0, 2)),
                                                   differ),
                                       i);
    }
  }

  /// Switches to `l`: bucket memory, each parameter's bucket and offset. With
  /// `keep_gradients` (a rebuild in view mode), the gradients move to the new buckets.
  void apply_layout(bucket_layout l, bool keep_gradients) {
    std::vector<std::vector<std::uint64_t>> mem(l.buckets.size());
    for (std::size_t b = 0; b < l.buckets.size(); ++b)
      mem[b].assign((l.buckets[b].bytes() + 7) / 8, 0);
    std::vector<std::size_t> bof = l.bucket_of(n), off(n, 0);
    for (const auto& b : l.buckets)
      for (std::size_t k = 0; k < b.parameters.size(); ++k)
        off[b.parameters[k]] = b.offsets[k];
    if (keep_gradients && !storage.empty())
      for (std::size_t i = 0; i < n; ++i) {
        const auto es = cc::element_size(params[i].type);
        std::memcpy(reinterpret_cast<std::byte*>(mem[bof[i]].data()) + off[i] * es, slot(i), params[i].count * es);
      }
    layout = std::move(l);
    storage = std::move(mem);
    bucket_of = std::move(bof);
    offset_of = std::move(off);
    pending.assign(layout.buckets.size(), 0);
  }

  void* slot(std::size_t i) {
    return reinterpret_cast<std::byte*>(storage[bucket_of[i]].data()) +
           offset_of[i] * cc::element_size(params[i].type);
  }

  cc::tensor_view bucket_view(std::size_t b) {
    const auto& k = layout.buckets[b];
    return cc::tensor_view(storage[b].data(), k.count, k.type, k.where);
  }

  // ---- the iteration (on the loop) ------------------------------------------------

  void note_error(std::exception_ptr e) {
    if (e && !first_error)
      first_error = e;
  }

  /// A collective of the iteration finished (on the loop).
  void finished(clock_type::time_point began, std::exception_ptr e) {
    comm.push_back({began, clock_type::now()});
    note_error(e);
    --in_flight;
    signalled = true;
    wake->notify();
  }

  /// Runs `a` on the loop as one of the iteration's collectives; `then` runs on completion.
  template <typename Then>
  void track(asio::awaitable<void> a, Then then) {
    ++in_flight;
    const auto began = clock_type::now();
    asio::co_spawn(ex, std::move(a), [this, began, then = std::move(then)](std::exception_ptr e) mutable {
      then(e);
      finished(began, e);
    });
  }

  static asio::awaitable<void> await_work(cc::work w) { co_await std::move(w); }

  asio::awaitable<void> run_hook(std::size_t b) {
    grad_bucket gb(b, layout.buckets.size(), bucket_view(b), layout.buckets[b].parameters, *pg, call);
    co_await hook(gb);
  }

  /// The loop saw parameter i's mark: its gradient goes into (or is scaled in) its bucket.
  void process_ready(std::size_t i, bool used) {
    const auto& p = params[i];
    void* dst = slot(i);
    const int divisor = !hook && detail::divide_before_sum(p.type) ? world : 1;
    if (!used) {
      std::memset(dst, 0, p.bytes());
    } else if (opts.gradient_as_bucket_view) {
      detail::copy_divided(dst, dst, p.count, p.type, divisor);
      ready_order.push_back(i);
    } else {
      if (divisor == 1)
        detail::copy_gradient(dst, p.grad, p.bytes());
      else
        detail::copy_divided(dst, p.grad, p.count, p.type, divisor);
      copied += p.bytes();
      ready_order.push_back(i);
    }
    const auto b = bucket_of[i];
    if (--pending[b] == 0)
      ready_at[b] = clock_type::now();
  }

  void launch(std::size_t b) {
    launched_at[b] = clock_type::now();
    auto on_done = [this, b](std::exception_ptr e) {
      reduced_at[b] = clock_type::now();
      ++completed;
      if (!e && !opts.find_unused_parameters && !opts.gradient_as_bucket_view)
        copy_back(b);
    };
    if (hook) {
      track(run_hook(b), on_done);
      return;
    }
    try {
      const auto op = detail::divide_before_sum(layout.buckets[b].type) ? cc::reduce_op::sum : cc::reduce_op::avg;
      track(await_work(pg->allreduce(bucket_view(b), op, call)), on_done);
    } catch (...) {
      note_error(std::current_exception());
      reduced_at[b] = clock_type::now();
      ++completed;
    }
  }

  /// The averaged values of bucket b back into the registered gradients (copy
  /// mode), except those of globally unused parameters.
  void copy_back(std::size_t b) {
    const auto& k = layout.buckets[b];
    for (auto i : k.parameters) {
      if (opts.find_unused_parameters && std::binary_search(globally_unused.begin(), globally_unused.end(), i))
        continue;
      detail::copy_gradient(params[i].grad, slot(i), params[i].bytes());
      copied += params[i].bytes();
    }
  }

  bool mark_available() const {
    return read_pos < n && slots[read_pos].load(std::memory_order_seq_cst) != 0;
  }

  asio::awaitable<void> run_iteration() {
    const std::size_t nb = layout.buckets.size();
    read_pos = 0;
    next_launch = 0;
    completed = 0;
    in_flight = 0;
    first_error = nullptr;
    copied = 0;
    rebuilt_now = false;
    comm.clear();
    ready_order.clear();
    globally_unused.clear();
    ready_at.assign(nb, {});
    launched_at.assign(nb, {});
    reduced_at.assign(nb, {});
    for (std::size_t b = 0; b < nb; ++b)
      pending[b] = layout.buckets[b].parameters.size();

    if (opts.broadcast_buffers && !opts.buffers.empty()) {
      try {
        track(await_work(pg->broadcast_coalesced(opts.buffers, 0, call)), [](std::exception_ptr) {});
      } catch (...) {
        note_error(std::current_exception());
      }
    }
    // Parameters declared unused are ready at once (a zero share).
    for (std::size_t i = 0; i < n; ++i) {
      const bool unused = marks[i].load(std::memory_order_acquire) == declared_unused;
      used_map[i] = unused ? 0 : 1;
      if (unused)
        process_ready(i, false);
    }
    bool bitmap_issued = false;
    const std::size_t expected = declared_used_count;
    std::size_t seen = 0;
    for (;;) {
      signalled = false;
      // Each bucket is launched as soon as it is complete (before the next marks are processed).
      const auto launch_ready = [&] {
        while (next_launch < nb && pending[next_launch] == 0)
          launch(next_launch++);
      };
      while (mark_available()) {
        const std::size_t i = slots[read_pos++].load(std::memory_order_acquire) - 1;
        process_ready(i, true);
        ++seen;
        if (!abandon.load(std::memory_order_relaxed))
          launch_ready();
      }
      const bool stop = abandon.load(std::memory_order_seq_cst);
      if (!stop) {
        launch_ready();
        if (next_launch == nb && opts.find_unused_parameters && !bitmap_issued) {
          bitmap_issued = true;
          // Every rank learns which parameters some rank used (DDP's local_used_map allreduce).
          try {
            track(await_work(pg->allreduce(cc::tensor_view(used_map.data(), n, cc::dtype::int32), cc::reduce_op::max,
                                           call)),
                  [this](std::exception_ptr e) {
                    if (e)
                      return;
                    for (std::size_t i = 0; i < n; ++i)
                      if (used_map[i] == 0)
                        globally_unused.push_back(i);
                  });
          } catch (...) {
            note_error(std::current_exception());
          }
        }
      }
      const bool all_launched = stop || (next_launch == nb && (!opts.find_unused_parameters || bitmap_issued));
      if (all_launched && in_flight == 0 && (stop || seen == expected))
        break;
      // Sleep until a mark, a completion, or (once) the abandonment; never
      // spin: completions run on this very loop.
      co_await wake->wait(
          [this, stop] { return signalled || mark_available() || (!stop && abandon.load(std::memory_order_seq_cst)); });
    }
    if (abandon.load())
      co_return;
    if (opts.find_unused_parameters && !opts.gradient_as_bucket_view && !first_error)
      for (std::size_t b = 0; b < nb; ++b)
        copy_back(b);
    if (first_error)
      std::rethrow_exception(first_error);
    if (opts.rebuild_buckets && !rebuilt && synced_iterations == 1)
      co_await rebuild();
  }

  /// Rebuilds the buckets from rank 0's observed gradient order; all ranks
  /// switch now (at the end of the first synchronised iteration).
  asio::awaitable<void> rebuild() {
    std::vector<std::int64_t> order;
    order.reserve(n);
    std::vector<char> seen(n, 0);
    for (auto i : ready_order) {
      order.push_back(static_cast<std::int64_t>(i));
      seen[i] = 1;
    }
    for (std::size_t i = n; i-- > 0;)
      if (!seen[i])
        order.push_back(static_cast<std::int64_t>(i));
    const auto began = clock_type::now();
    co_await pg->broadcast(cc::tensor_view(order.data(), n, cc::dtype::int64), 0, call);
    comm.push_back({began, clock_type::now()});
    std::vector<std::size_t> o(n);
    for (std::size_t k = 0; k < n; ++k) {
      const auto v = order[k];
      if (v < 0 || static_cast<std::size_t>(v) >= n)
        throw error("ddp::reducer: rank 0 sent a bad bucket order");
      o[k] = static_cast<std::size_t>(v);
    }
    apply_layout(bucket_layout::compute(params, o, opts.first_bucket_bytes, opts.bucket_cap_bytes),
                 opts.gradient_as_bucket_view);
    rebuilt = true;
    rebuilt_now = true;
  }

  // ---- the caller's side ------------------------------------------------------------

  void prepare(std::span<const std::size_t> used) {
    if (in_iteration)
      throw usage_error("ddp::reducer: prepare_for_backward() while the previous iteration is not finalized");
    if (!used.empty() && !opts.find_unused_parameters)
      throw usage_error("ddp::reducer: a used-parameter list needs find_unused_parameters");
    for (auto i : used)
      if (i >= n)
        throw usage_error(fmt::format("ddp::reducer: used parameter {} out of range ({} parameters)", i, n));
    const bool declare = opts.find_unused_parameters && !used.empty();
    for (std::size_t i = 0; i < n; ++i) {
      marks[i].store(declare ? declared_unused : unmarked, std::memory_order_relaxed);
      slots[i].store(0, std::memory_order_relaxed);
    }
    declared_used_count = n;
    if (declare) {
      declared_used_count = 0;
      for (auto i : used)
        if (marks[i].exchange(unmarked, std::memory_order_relaxed) == declared_unused)
          ++declared_used_count;
    }
    write_pos.store(0, std::memory_order_relaxed);
    abandon.store(false, std::memory_order_relaxed);
    prepared_at = clock_type::now();
    in_iteration = true;
    ++iterations;
    local_iteration = !sync.load(std::memory_order_acquire);
    if (local_iteration) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      return;
    }
    ++synced_iterations;
    promise<void> p;
    done = p.get_future();
    asio::co_spawn(ex, run_iteration(), [p = std::move(p)](std::exception_ptr e) mutable {
      if (e)
        p.set_exception(e);
      else
        p.set_value();
    });
  }

  void mark(std::size_t i) {
    if (i >= n)
      throw usage_error(fmt::format("ddp::reducer: mark_grad_ready({}) out of range ({} parameters)", i, n));
    if (!in_iteration)
      throw usage_error("ddp::reducer: mark_grad_ready() outside an iteration (call prepare_for_backward() first)");
    const auto before = marks[i].exchange(marked, std::memory_order_acq_rel);
    if (before != unmarked) {
      if (before == declared_unused)
        marks[i].store(declared_unused, std::memory_order_release);
      throw usage_error(fmt::format("ddp::reducer: {} marked ready twice in one iteration{}", param_name(params[i], i),
                                    before == declared_unused ? " (it was declared unused in prepare_for_backward)"
                                                              : ""));
    }
    if (local_iteration)
      return;
    const auto k = write_pos.fetch_add(1, std::memory_order_relaxed);
    slots[k].store(static_cast<std::uint32_t>(i + 1), std::memory_order_seq_cst);
    wake->notify();
  }

  /// Checks for missing gradients; on them aborts the group and the loop's iteration.
  std::optional<missing_gradients_error> begin_finalize() {
    if (!in_iteration)
      throw usage_error("ddp::reducer: finalize() without prepare_for_backward()");
    finalize_at = clock_type::now();
    if (local_iteration)
      return std::nullopt;
    std::vector<std::size_t> missing;
    for (std::size_t i = 0; i < n; ++i)
      if (marks[i].load(std::memory_order_acquire) == unmarked)
        missing.push_back(i);
    if (missing.empty())
      return std::nullopt;
    std::string names;
    for (std::size_t k = 0; k < missing.size() && k < 10; ++k)
      names += (k ? ", " : "") + param_name(params[missing[k]], missing[k]);
    if (missing.size() > 10)
      names += fmt::format(" and {} more", missing.size() - 10);
    const auto count = missing.size();
    auto err = missing_gradients_error(
        fmt::format("ddp::reducer: finalize() on rank {} with {} gradient(s) never marked ready: {} (mark every "
                    "gradient, or use find_unused_parameters); the process group is aborted",
                    pg->rank(), count, names),
        std::move(missing));
    pg->abort(err.what());
    abandon.store(true, std::memory_order_seq_cst);
    wake->notify();
    return err;
  }

  /// After the iteration's end: stats, the caller may start another; then
  /// throws the missing gradients' error, else the iteration's failure.
  void end_finalize(const std::optional<missing_gradients_error>& missing, std::exception_ptr failure) {
    end_finalize();
    if (missing)
      throw *missing;
    if (failure)
      std::rethrow_exception(failure);
  }

  void end_finalize() {
    const auto now = clock_type::now();
    iteration_stats s;
    s.iteration = iterations - 1;
    s.synchronized = !local_iteration;
    s.backward = finalize_at - prepared_at;
    s.finalize_wait = now - finalize_at;
    if (!local_iteration) {
      for (std::size_t b = 0; b < ready_at.size(); ++b) {
        iteration_stats::bucket k;
        k.bytes = b < layout.buckets.size() ? layout.buckets[b].bytes() : 0;
        if (reduced_at[b] != clock_type::time_point{} && ready_at[b] != clock_type::time_point{})
          k.ready_to_reduced = reduced_at[b] - ready_at[b];
        if (reduced_at[b] != clock_type::time_point{} && launched_at[b] != clock_type::time_point{})
          k.communication = reduced_at[b] - launched_at[b];
        s.buckets.push_back(k);
      }
      auto [total, before] = union_length(comm, finalize_at);
      s.communication = total;
      s.overlapped = before;
      s.copied_bytes = copied;
      s.globally_unused = globally_unused.size();
      s.rebuilt = rebuilt_now;
    }
    stats = std::move(s);
    done.reset();
    in_iteration = false;
  }

  /// Waits (blocking) for an iteration in flight, abandoning it.
  void shutdown() noexcept {
    if (!done || done->is_ready())
      return;
    try {
      pg->abort("ddp::reducer destroyed in the middle of an iteration");
      abandon.store(true, std::memory_order_seq_cst);
      wake->notify();
      if (!corodist::detail::on_loop_thread())
        done->wait();
    } catch (...) {
    }
  }
};

// ---- reducer ----------------------------------------------------------------------------

reducer::reducer(create_tag, asio::any_io_executor ex, std::shared_ptr<cc::process_group> group,
                 std::vector<parameter> params, reducer_options opts, bool own_loop) {
  std::unique_ptr<event_loop> loop;
  if (own_loop) {
    loop = std::make_unique<event_loop>();
    loop->start();
    ex = loop->get_executor();
  }
  impl_ = std::make_unique<impl>(std::move(ex), std::move(loop), std::move(group), std::move(params), std::move(opts));
}

reducer::reducer(std::shared_ptr<cc::process_group> group, std::vector<parameter> params, reducer_options opts)
    : reducer(create_tag{}, {}, std::move(group), std::move(params), std::move(opts), true) {
  run_blocking(impl_->ex, impl_->setup(), "ddp::reducer construction");
}

reducer::reducer(asio::any_io_executor ex, std::shared_ptr<cc::process_group> group, std::vector<parameter> params,
                 reducer_options opts)
    : reducer(create_tag{}, std::move(ex), std::move(group), std::move(params), std::move(opts), false) {
  run_blocking(impl_->ex, impl_->setup(), "ddp::reducer construction");
}

asio::awaitable<std::unique_ptr<reducer>> reducer::create(asio::any_io_executor ex,
                                                          std::shared_ptr<cc::process_group> group,
                                                          std::vector<parameter> params, reducer_options opts) {
  std::unique_ptr<reducer> r(
      new reducer(create_tag{}, std::move(ex), std::move(group), std::move(params), std::move(opts), false));
  co_await r->impl_->setup();
  co_return r;
}

reducer::~reducer() {
  if (impl_)
    impl_->shutdown();
}

void reducer::prepare_for_backward(std::span<const std::size_t> used) { impl_->prepare(used); }

void reducer::mark_grad_ready(std::size_t i) { impl_->mark(i); }

asio::awaitable<void> reducer::finalize() {
  auto& d = *impl_;
  auto missing = d.begin_finalize();
  if (d.local_iteration) {
    d.end_finalize();
    co_return;
  }
  std::exception_ptr failure;
  try {
    co_await d.done->async_get();
  } catch (...) {
    failure = std::current_exception();
  }
  d.end_finalize(missing, failure);
}

void reducer::finalize_sync() {
  auto& d = *impl_;
  if (corodist::detail::on_loop_thread() && d.in_iteration && !d.local_iteration && !(d.done && d.done->is_ready()))
    corodist::detail::throw_blocking_on_loop("ddp::reducer::finalize_sync()");
  auto missing = d.begin_finalize();
  if (d.local_iteration) {
    d.end_finalize();
    return;
  }
  std::exception_ptr failure;
  try {
    d.done->get();
  } catch (...) {
    failure = std::current_exception();
  }
  d.end_finalize(missing, failure);
}

reducer::no_sync_guard::no_sync_guard(reducer& r) noexcept
    : r_(&r), previous_(r.impl_->sync.exchange(false, std::memory_order_acq_rel)) {}

reducer::no_sync_guard::~no_sync_guard() { r_->impl_->sync.store(previous_, std::memory_order_release); }

void reducer::register_comm_hook(comm_hook hook) {
  if (impl_->iterations > 0)
    throw usage_error("ddp::reducer: register_comm_hook() after the first iteration");
  if (impl_->hook)
    throw usage_error("ddp::reducer: a communication hook is already registered");
  if (!hook)
    throw usage_error("ddp::reducer: register_comm_hook() with an empty hook");
  impl_->hook = std::move(hook);
}

cc::tensor_view reducer::gradient(std::size_t i) const {
  auto& d = *impl_;
  if (i >= d.n)
    throw usage_error(fmt::format("ddp::reducer: gradient({}) out of range ({} parameters)", i, d.n));
  const auto& p = d.params[i];
  if (d.opts.gradient_as_bucket_view)
    return cc::tensor_view(d.slot(i), p.count, p.type, p.where);
  return cc::tensor_view(p.grad, p.count, p.type, p.where);
}

const bucket_layout& reducer::layout() const noexcept { return impl_->layout; }

const iteration_stats& reducer::last_stats() const noexcept { return impl_->stats; }

const std::vector<std::size_t>& reducer::globally_unused() const noexcept { return impl_->globally_unused; }

std::uint64_t reducer::iterations() const noexcept { return impl_->iterations; }

bool reducer::rebuilt() const noexcept { return impl_->rebuilt; }

cc::process_group& reducer::group() const noexcept { return *impl_->pg; }

} // namespace corodist::ddp
