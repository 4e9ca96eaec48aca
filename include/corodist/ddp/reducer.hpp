#pragma once
/// \file
/// corodist::ddp::reducer: DDP's gradient reducer for plain C++ buffers — a
/// coroutine that awaits gradient-ready hooks and launches bucketed
/// allreduces in bucket order while the caller's backward computation goes on.

#include <corodist/core/config.hpp>

#include <corodist/collective/process_group.hpp>
#include <corodist/collective/tensor_view.hpp>
#include <corodist/ddp/bucket_layout.hpp>
#include <corodist/ddp/grad_bucket.hpp>
#include <corodist/ddp/iteration_stats.hpp>
#include <corodist/ddp/parameter.hpp>
#include <corodist/ddp/reducer_options.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

namespace corodist::ddp {

/// Keeps the gradients of a replicated model identical on every rank of a
/// process group (PyTorch's `Reducer` behind `DistributedDataParallel`).
///
/// Construction checks that every rank registered the same parameters
/// (count, sizes, dtypes, devices; `parameter_mismatch_error` otherwise),
/// broadcasts the values and buffers from rank 0 (coalesced), and lays the
/// gradients out in buckets (`layout()`). Then, each iteration:
///
///     red.prepare_for_backward();          // after the forward pass
///     ... backward: red.mark_grad_ready(i) as each gradient is final ...
///     red.finalize_sync();                 // or co_await red.finalize()
///
/// leaves every gradient averaged over the ranks. A bucket's allreduce is
/// launched as soon as all its gradients are ready, strictly in bucket order
/// on every rank whatever the order the gradients became ready in.
///
/// Threads: the reducer's state lives on one event loop (its own thread, or
/// the executor given). `mark_grad_ready` may be called from any thread;
/// `prepare_for_backward`, `finalize` and the rest from one thread at a time
/// (not concurrently with each other).
///
/// CUDA: parameters may live on CUDA devices (`device::cuda(i)`), alone or
/// beside host ones (one bucket set per device and dtype). Their buckets are
/// device memory; `mark_grad_ready(i)` records an event on
/// `reducer_options::stream` (the gradient's producer; the legacy default
/// stream unless given), the copy into the bucket runs on the reducer's own
/// stream after that event, the bucket's collective after the copies
/// (`call_options::stream`), and the copies back on the reducer's stream once
/// it completed; 16-bit gradients are divided by a kernel. finalize() returns
/// when the last bucket's collective has completed, with the work queued on
/// the caller's stream from then on ordered after the averaged gradients (no
/// host wait). The group must take the buckets' memory: an nccl_group of the
/// parameters' device, or a gloo_group (staged through host memory).
class reducer {
public:
  /// Blocks until construction's collectives are done, on a loop thread of
  /// the reducer's own. Throws `usage_error` for bad parameters or options,
  /// `parameter_mismatch_error` when the ranks' parameters differ, and the
  /// group's errors (construction waits for the other ranks up to the group's
  /// timeout, not `opts.timeout`). Must not be called on an event-loop thread.
  reducer(std::shared_ptr<collective::process_group> group, std::vector<parameter> params,
          reducer_options opts = {});

  /// As above, with the reducer's state on `ex` (an event loop the caller
  /// runs, which must not be the calling thread's).
  reducer(asio::any_io_executor ex, std::shared_ptr<collective::process_group> group, std::vector<parameter> params,
          reducer_options opts = {});

  /// The coroutine form of construction, for coroutines running on `ex`.
  /// Cancellation: terminal (the awaiting coroutine's, see docs/core.md) at
  /// its waits on the construction's collectives: ends with
  /// `operation_aborted` and no reducer; those collectives are not stopped
  /// (the other ranks' construction completes or times out with them): the
  /// memory of the reducer's own exchanges is held until they end, and a
  /// broadcast of rank 0's state already started still writes the
  /// parameters and buffers.
  /// (Name the options before the call: GCC 12 destroys a braced temporary inside `co_await` twice.)
  [[nodiscard]] static asio::awaitable<std::unique_ptr<reducer>>
  create(asio::any_io_executor ex, std::shared_ptr<collective::process_group> group, std::vector<parameter> params,
         reducer_options opts);

  /// With an iteration still in flight, aborts the group (the other ranks
  /// fail at once) and waits for the collectives already launched to end
  /// (they use the reducer's memory); then releases everything.
  ~reducer();

  reducer(const reducer&) = delete;
  reducer& operator=(const reducer&) = delete;

  /// Starts an iteration (call it after the forward pass). With
  /// find_unused_parameters, `used` lists the parameters the forward pass
  /// used (empty: all of them); the others are ready at once. Throws
  /// `usage_error` while the previous iteration is not finalized, or for an
  /// index out of range or `used` without find_unused_parameters.
  void prepare_for_backward(std::span<const std::size_t> used = {});

  /// The gradient hook: gradient `i` is final for this iteration. Callable
  /// from any thread; costs two atomic operations and, when the reducer's
  /// loop sleeps, one eventfd write (no allocation, no lock). Throws
  /// `usage_error` when `i` is out of range, no iteration was prepared, or
  /// `i` was already marked in this iteration (the mark is then ignored).
  /// Inside no_sync() it only checks. A CUDA gradient also records an event
  /// on `reducer_options::stream` (call it after the gradient's kernels were
  /// queued there); a CUDA failure then throws `cuda_error`.
  void mark_grad_ready(std::size_t i);

  /// Awaits the end of the iteration: every bucket reduced, the averaged
  /// gradients in place (copied back, or in the bucket views). Throws
  /// `missing_gradients_error` naming the gradients never marked (without
  /// find_unused_parameters; the group is then aborted), and rethrows the
  /// first failure of the iteration's collectives (`rank_lost_error` naming
  /// the rank when a rank died or its member key vanished, `collective_error`
  /// for other failures, `collective_timeout_error` at the deadline). After a
  /// failure the iteration is over all the same: its gradients are not to be
  /// used (some buckets may be half reduced), and the next
  /// prepare_for_backward() starts afresh, on a new group after set_group().
  /// Usable from a coroutine on any executor; resumes there.
  /// Cancellation: not cancellable: it runs to the end of the iteration's
  /// collectives, which use the reducer's memory (to stop them, abort the
  /// group: finalize then ends with the group's error); a cancellation of the
  /// awaiting coroutine takes effect at its next `co_await`.
  [[nodiscard]] asio::awaitable<void> finalize();

  /// Blocking form of finalize() for plain threads (throws `usage_error` on a loop thread).
  void finalize_sync();

  /// Scope of iterations that do not communicate: while a no_sync guard
  /// lives, iterations only check their marks and finalize() returns at
  /// once; the caller accumulates gradients, and the next synchronised
  /// iteration reduces the accumulated sum (PyTorch's `no_sync()`).
  class no_sync_guard {
  public:
    /// Turns synchronisation off for `r` until the guard is destroyed.
    explicit no_sync_guard(reducer& r) noexcept;
    /// Restores the previous setting (guards nest).
    ~no_sync_guard();
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;

  private:
    reducer* r_;
    bool previous_;
  };

  /// Returns a no_sync scope (`auto g = red.no_sync();`).
  [[nodiscard]] no_sync_guard no_sync() noexcept { return no_sync_guard(*this); }

  /// Replaces the reduction of each bucket by `hook` (before the first
  /// iteration only; `usage_error` after). Without a hook each bucket is
  /// allreduced with reduce_op::avg (16-bit floats: divided by the world
  /// size as gradients enter it, then summed).
  void register_comm_hook(comm_hook hook);

  /// Where gradient `i` lives: the registered gradient, or its view in bucket
  /// memory with gradient_as_bucket_view (which moves once, when the buckets
  /// are rebuilt after the first iteration: ask again then).
  collective::tensor_view gradient(std::size_t i) const;

  /// The current bucket layout.
  const bucket_layout& layout() const noexcept;

  /// Figures of the last finished iteration.
  const iteration_stats& last_stats() const noexcept;

  /// Parameters found unused by every rank in the last iteration (find_unused_parameters).
  const std::vector<std::size_t>& globally_unused() const noexcept;

  /// Iterations started so far (synchronised or not).
  std::uint64_t iterations() const noexcept;

  /// True once the buckets were rebuilt from the observed gradient order.
  bool rebuilt() const noexcept;

  /// The process group.
  collective::process_group& group() const noexcept;

  /// Continues on `g` from the next iteration on (a group re-formed over the
  /// survivors after a `rank_lost_error`): no collective runs now (the
  /// parameters are assumed equal on `g`'s ranks, as after a step every
  /// survivor discarded alike), the bucket layout stays, and gradients are
  /// averaged over `g->size()` ranks from then on (the default reduction, the
  /// 16-bit path and the built-in hooks all divide by the group's size). Call
  /// between iterations, from the thread that drives them; throws
  /// `usage_error` when `g` is null or inside an iteration (after
  /// prepare_for_backward(), before finalize() returned or threw).
  void set_group(std::shared_ptr<collective::process_group> g);

private:
  struct impl;
  struct create_tag {};
  reducer(create_tag, asio::any_io_executor ex, std::shared_ptr<collective::process_group> group,
          std::vector<parameter> params, reducer_options opts, bool own_loop);

  std::unique_ptr<impl> impl_;
};

} // namespace corodist::ddp
