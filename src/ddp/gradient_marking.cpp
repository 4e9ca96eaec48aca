// The reducer's iteration on the caller's side: prepare_for_backward, the
// gradient marks from any thread (two atomic operations and, when the loop
// sleeps, one eventfd write), finalize with its checks and statistics, and
// no_sync.
#include "ddp/reducer_state.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/metrics/reducer_metrics.hpp>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <charconv>
#include <utility>

namespace corodist::ddp {

namespace cc = corodist::collective;
using clock_type = std::chrono::steady_clock;
using detail::declared_unused;
using detail::interval;
using detail::marked;
using detail::param_name;
using detail::unmarked;

namespace {

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

void reducer::impl::prepare(std::span<const std::size_t> used) {
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

void reducer::impl::mark(std::size_t i) {
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
  if (mark_recorder) { // an instant: recorded ended
    char text[24];
    const auto end = std::to_chars(text, text + sizeof text, i).ptr;
    mark_recorder->complete(
        mark_recorder->record({.seq = iterations, .op = "mark", .detail = std::string_view(text, end - text)}));
  }
  if (local_iteration)
    return;
  if (params[i].where.kind == cc::device::kind_type::cuda) // the gradient's producer so far: the copy waits for it
    on_device(params[i].where).producer.record(produced[i]);
  const auto k = write_pos.fetch_add(1, std::memory_order_relaxed);
  slots[k].store(static_cast<std::uint32_t>(i + 1), std::memory_order_seq_cst);
  wake->notify();
}

std::optional<missing_gradients_error> reducer::impl::begin_finalize() {
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

void reducer::impl::end_finalize(const std::optional<missing_gradients_error>& missing, std::exception_ptr failure) {
  end_finalize();
  if (missing)
    throw *missing;
  if (failure)
    std::rethrow_exception(failure);
}

void reducer::impl::end_finalize() {
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
    if (metrics::counting()) {
      std::vector<std::chrono::nanoseconds> ready_to_done;
      ready_to_done.reserve(s.buckets.size());
      for (const auto& k : s.buckets)
        ready_to_done.push_back(k.ready_to_reduced);
      metrics::note_reducer_iteration({ready_to_done, s.communication, s.overlapped, s.finalize_wait});
    }
  }
  stats = std::move(s);
  done.reset();
  in_iteration = false;
}

void reducer::impl::shutdown() noexcept {
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

// ---- the public calls of an iteration ---------------------------------------------------

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
    // Not cancellable (an unconnected slot): the iteration's collectives use
    // the reducer's memory until they end, so it may not end before them.
    co_await d.done->async_get(asio::bind_cancellation_slot(asio::cancellation_slot(), asio::use_awaitable));
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

} // namespace corodist::ddp
