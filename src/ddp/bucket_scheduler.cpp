// The reducer's iteration on its loop: the gradients marked ready go into
// their buckets in mark order, and each bucket's reduction is launched as soon
// as it is complete, strictly in bucket order; then the copies back.
#include "ddp/reducer_state.hpp"

#include <corodist/collective/errors.hpp>
#include <corodist/core/error.hpp>

#include "ddp/grad_ops.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <cstring>
#include <utility>

namespace corodist::ddp {

namespace cc = corodist::collective;
using detail::declared_unused;

namespace {

asio::awaitable<void> await_work(cc::work w) { co_await std::move(w); }

/// Awaits `w` through a coroutine of its own that holds `keep` (the memory the
/// collective uses) until the collective ends: a cancelled await ends at once
/// while the collective goes on with valid memory.
asio::awaitable<void> await_keeping(cc::work w, std::shared_ptr<const void> keep) {
  promise<void> p;
  auto ended = p.get_future();
  asio::co_spawn(
      co_await asio::this_coro::executor,
      [](cc::work w, std::shared_ptr<const void>, promise<void> p) -> asio::awaitable<void> {
        try {
          co_await std::move(w);
          p.set_value();
        } catch (...) {
          p.set_exception(std::current_exception());
        }
      }(std::move(w), std::move(keep), std::move(p)),
      asio::detached);
  co_await ended.async_get();
}

} // namespace

void reducer::impl::note_error(std::exception_ptr e) {
  if (e && !first_error)
    first_error = e;
}

void reducer::impl::finished(clock_type::time_point began, std::exception_ptr e) {
  comm.push_back({began, clock_type::now()});
  note_error(e);
  --in_flight;
  signalled = true;
  wake->notify();
}

template <typename Then>
void reducer::impl::track(asio::awaitable<void> a, Then then) {
  ++in_flight;
  const auto began = clock_type::now();
  asio::co_spawn(ex, std::move(a), [this, began, then = std::move(then)](std::exception_ptr e) mutable {
    then(e);
    finished(began, e);
  });
}

asio::awaitable<void> reducer::impl::run_hook(std::size_t b) {
  grad_bucket gb(b, layout.buckets.size(), bucket_view(b), layout.buckets[b].parameters, *pg, bucket_call(b));
  co_await hook(gb);
}

void reducer::impl::process_ready(std::size_t i, bool used) {
  const auto& p = params[i];
  void* dst = slot(i);
  const int divisor = !hook && detail::divide_before_sum(p.type) ? world : 1;
  if (p.where.kind == cc::device::kind_type::cuda) {
    // On the reducer's stream, after the gradient's producer (the event of its mark).
    const auto& s = on_device(p.where).stream;
    const cc::tensor_view into(dst, p.count, p.type, p.where);
    if (!used) {
      s.zero(dst, p.bytes());
    } else {
      s.wait(produced[i]);
      if (opts.gradient_as_bucket_view) {
        if (divisor != 1)
          s.convert(into, into, divisor);
      } else {
        if (divisor == 1)
          s.copy(dst, p.grad, p.bytes());
        else
          s.convert(cc::tensor_view(p.grad, p.count, p.type, p.where), into, divisor);
        copied += p.bytes();
      }
      ready_order.push_back(i);
    }
  } else if (!used) {
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
  if (--pending[b] == 0) {
    ready_at[b] = clock_type::now();
    if (recorder)
      bucket_record[b] = recorder->record({.seq = b, .op = "bucket", .detail = bucket_detail[b],
                                           .bytes = layout.buckets[b].bytes()});
  }
}

void reducer::impl::end_bucket_record(std::size_t b, const std::exception_ptr& e) {
  const auto h = std::exchange(bucket_record[b], 0);
  if (h == 0)
    return;
  if (!e) {
    recorder->complete(h);
    return;
  }
  try {
    std::rethrow_exception(e);
  } catch (const timeout_error& x) {
    recorder->fail(h, x.what(), "timeout");
  } catch (const std::exception& x) {
    recorder->fail(h, x.what(), "collective");
  } catch (...) {
    recorder->fail(h, "unknown exception", "collective");
  }
}

void reducer::impl::launch(std::size_t b) {
  launched_at[b] = clock_type::now();
  auto on_done = [this, b](std::exception_ptr e) {
    reduced_at[b] = clock_type::now();
    end_bucket_record(b, e);
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
    track(await_work(pg->allreduce(bucket_view(b), op, bucket_call(b))), on_done);
  } catch (...) {
    note_error(std::current_exception());
    reduced_at[b] = clock_type::now();
    end_bucket_record(b, std::current_exception());
    ++completed;
  }
}

void reducer::impl::copy_back(std::size_t b) {
  const auto& k = layout.buckets[b];
  const bool on_cuda = k.where.kind == cc::device::kind_type::cuda;
  for (auto i : k.parameters) {
    if (opts.find_unused_parameters && std::binary_search(globally_unused.begin(), globally_unused.end(), i))
      continue;
    if (on_cuda) // the bucket's collective has completed: queued on the reducer's stream, no wait
      on_device(k.where).stream.copy(params[i].grad, slot(i), params[i].bytes());
    else
      detail::copy_gradient(params[i].grad, slot(i), params[i].bytes());
    copied += params[i].bytes();
  }
}

void reducer::impl::order_producers() {
  for (auto& [dev, d] : devices) {
    d.stream.record(d.done);
    d.producer.wait(d.done);
  }
}

void reducer::impl::end_device_work() noexcept {
  try {
    order_producers();
  } catch (...) {
    note_error(std::current_exception());
  }
}

asio::awaitable<void> reducer::impl::control_collective(
    std::vector<cc::tensor_view> host, std::function<cc::work(std::vector<cc::tensor_view>, cc::call_options)> issue,
    cc::call_options c, std::shared_ptr<const void> keep) {
  const auto where = pg->control_device();
  if (where.kind != cc::device::kind_type::cuda) {
    co_await await_keeping(issue(std::move(host), c), std::move(keep));
    co_return;
  }
  // Through device memory, on a stream of the reducer's that waits for no one
  // else's work: copied there, the collective after the copies, copied back.
  if (!control_stream || control_stream->device() != where.index)
    control_stream = cc::cuda_stream::create(where.index);
  const auto s = *control_stream;
  std::vector<cc::device_buffer> mem;
  std::vector<cc::tensor_view> dev;
  for (const auto& t : host) {
    mem.push_back(cc::device_buffer::allocate_async(s, t.bytes()));
    s.copy(mem.back().data(), t.data(), t.bytes());
    dev.emplace_back(mem.back().data(), t.count(), t.type(), where);
  }
  c.stream = s.native();
  std::exception_ptr failed;
  try {
    co_await await_keeping(issue(dev, c), keep);
  } catch (...) {
    failed = std::current_exception();
  }
  if (failed) {
    for (auto& m : mem) // a collective that failed or whose await was cancelled may still write them
      m.leak();
    std::rethrow_exception(failed);
  }
  for (std::size_t k = 0; k < host.size(); ++k)
    s.copy(host[k].data(), dev[k].data(), host[k].bytes());
  co_await s.record().wait(c.timeout.or_else(pg->timeout()));
}

asio::awaitable<void> reducer::impl::run_iteration() {
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
  bucket_record.assign(nb, 0);
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
          std::vector<cc::tensor_view> flags{cc::tensor_view(used_map.data(), n, cc::dtype::int32)};
          auto allreduce_max = [this](std::vector<cc::tensor_view> t, cc::call_options c) {
            return pg->allreduce(t[0], cc::reduce_op::max, c);
          };
          // (used_map is the reducer's: it outlives the iteration's collectives)
          track(control_collective(std::move(flags), allreduce_max, call, nullptr),
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
  if (abandon.load()) {
    for (std::size_t b = next_launch; b < nb; ++b) // ready, never launched
      if (bucket_record[b] != 0)
        recorder->fail(std::exchange(bucket_record[b], 0), "the iteration was abandoned", "abandoned");
    end_device_work();
    co_return;
  }
  if (opts.find_unused_parameters && !opts.gradient_as_bucket_view && !first_error)
    for (std::size_t b = 0; b < nb; ++b)
      copy_back(b);
  if (!first_error && opts.rebuild_buckets && !rebuilt && synced_iterations == 1) {
    try {
      co_await rebuild();
    } catch (...) {
      note_error(std::current_exception());
    }
  }
  end_device_work(); // after the copies back and a rebuild's moves
  if (first_error)
    std::rethrow_exception(first_error);
}

} // namespace corodist::ddp
