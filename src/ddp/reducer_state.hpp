#pragma once
// The reducer's state (reducer::impl), shared by the files that implement it:
// reducer_setup.cpp (construction and the rebuild), bucket_scheduler.cpp (an
// iteration on the loop) and gradient_marking.cpp (an iteration on the
// caller's side), each member function declared here with the file it is in.

#include <corodist/ddp/reducer.hpp>

#include <corodist/collective/cuda_event.hpp>
#include <corodist/collective/cuda_stream.hpp>
#include <corodist/collective/device_buffer.hpp>
#include <corodist/collective/process_group.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/flight_recorder.hpp>
#include <corodist/core/future.hpp>
#include <corodist/ddp/errors.hpp>

#include "ddp/wake_event.hpp"

#include <fmt/core.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace corodist::ddp {

namespace detail {

/// States of a parameter's mark in an iteration.
inline constexpr std::uint8_t unmarked = 0;
inline constexpr std::uint8_t marked = 1;
inline constexpr std::uint8_t declared_unused = 2;

/// "parameter i ('name')" (or "parameter i" when unnamed), for error texts.
inline std::string param_name(const parameter& p, std::size_t i) {
  return p.name.empty() ? fmt::format("parameter {}", i) : fmt::format("parameter {} ('{}')", i, p.name);
}

/// The reducer's work on one CUDA device: its own stream (bucket copies,
/// conversions; the buckets' collectives start after it), the caller's
/// stream (the gradients' producer, and the consumer of the averaged ones),
/// and the event that ends an iteration's work.
struct cuda_device_state {
  collective::cuda_stream stream;
  collective::cuda_stream producer;
  collective::cuda_event done;
};

/// A time interval of one collective of the iteration.
struct interval {
  std::chrono::steady_clock::time_point begin, end;
};

} // namespace detail

struct reducer::impl {
  using clock_type = std::chrono::steady_clock;

  // The reducer's own loop when none was given (destroyed last).
  std::unique_ptr<event_loop> own_loop;
  asio::any_io_executor ex;
  std::shared_ptr<collective::process_group> pg;
  std::vector<parameter> params;
  reducer_options opts;
  collective::call_options call;       // the iteration's collectives: the reducer's deadline
  collective::call_options setup_call; // construction's: the group's deadline (ranks arrive at their own pace)
  int world = 1;
  std::size_t n = 0;

  // Buckets.
  bucket_layout layout;
  std::vector<std::size_t> bucket_of, offset_of;
  std::vector<std::vector<std::uint64_t>> storage; // host buckets' memory (8-byte aligned)
  std::vector<collective::device_buffer> device_storage; // CUDA buckets' memory
  comm_hook hook;

  // CUDA parameters: per device, and each one's event recorded on the producer at its mark.
  std::map<int, detail::cuda_device_state> devices;
  std::vector<collective::cuda_event> produced;
  std::optional<collective::cuda_stream> control_stream; // control_collective's, on an nccl_group

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
  std::vector<detail::interval> comm;
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

  // Flight recorders (null: recording off): "reducer <k>" has an entry per
  // bucket and iteration, from the bucket's readiness to its reduction's end;
  // "reducer <k>/marks" the gradient marks (apart: they would evict the buckets).
  std::shared_ptr<flight_recorder> recorder, mark_recorder;
  std::vector<std::string> bucket_detail;              // "bucket 3 (12 params)", per layout
  std::vector<flight_recorder::handle> bucket_record;  // the iteration's entries (loop only; 0: none)

  // ---- construction and the rebuild (reducer_setup.cpp) ----------------------------

  /// Checks the options and parameters and sizes the marks (throws usage_error).
  impl(asio::any_io_executor e, std::unique_ptr<event_loop> loop, std::shared_ptr<collective::process_group> g,
       std::vector<parameter> ps, reducer_options o);
  /// The checks of construction that need no other rank (usage_error).
  void validate_locally() const;
  /// On the loop: verifies the ranks' parameters, takes rank 0's values and
  /// buffers, lays out the buckets.
  asio::awaitable<void> setup();
  /// parameter_mismatch_error unless every rank registered the same parameters.
  asio::awaitable<void> verify_across_ranks();
  /// Switches to `l`: bucket memory, each parameter's bucket and offset. With
  /// `keep_gradients` (a rebuild in view mode), the gradients move to the new buckets.
  void apply_layout(bucket_layout l, bool keep_gradients);
  /// Rebuilds the buckets from rank 0's observed gradient order; all ranks
  /// switch now (at the end of the first synchronised iteration).
  asio::awaitable<void> rebuild();

  /// Bucket b's memory (host or device).
  void* bucket_data(std::size_t b) {
    return layout.buckets[b].where.kind == collective::device::kind_type::cuda ? device_storage[b].data()
                                                                                 : storage[b].data();
  }

  /// Where parameter i's gradient lives in its bucket.
  void* slot(std::size_t i) {
    return static_cast<std::byte*>(bucket_data(bucket_of[i])) + offset_of[i] * collective::element_size(params[i].type);
  }

  /// Bucket b's memory as one tensor.
  collective::tensor_view bucket_view(std::size_t b) {
    const auto& k = layout.buckets[b];
    return collective::tensor_view(bucket_data(b), k.count, k.type, k.where);
  }

  /// The state of CUDA device `d` (one of the parameters' devices).
  detail::cuda_device_state& on_device(const collective::device& d) { return devices.at(d.index); }

  /// The iteration's per-call options for bucket b: on a CUDA device, its
  /// collectives start after the reducer's stream there.
  collective::call_options bucket_call(std::size_t b) {
    auto c = call;
    if (layout.buckets[b].where.kind == collective::device::kind_type::cuda)
      c.stream = on_device(layout.buckets[b].where).stream.native();
    return c;
  }

  /// Runs the collective `issue` makes over `host` (host memory), on copies
  /// in the group's control device's memory when that is a CUDA device (an
  /// nccl_group), the results copied back; the counts, flags and orders the
  /// reducer exchanges. Bounded by `c`'s deadline (the group's when zero).
  /// `keep` owns the memory `host` views: held until the collective ends,
  /// also when the await is cancelled (which does not stop the collective).
  asio::awaitable<void> control_collective(
      std::vector<collective::tensor_view> host,
      std::function<collective::work(std::vector<collective::tensor_view>, collective::call_options)> issue,
      collective::call_options c, std::shared_ptr<const void> keep);

  // ---- the iteration on the loop (bucket_scheduler.cpp) -----------------------------

  /// Keeps the iteration's first failure.
  void note_error(std::exception_ptr e);
  /// A collective of the iteration finished (on the loop).
  void finished(clock_type::time_point began, std::exception_ptr e);
  /// Runs `a` on the loop as one of the iteration's collectives; `then` runs on completion.
  template <typename Then>
  void track(asio::awaitable<void> a, Then then);
  /// Bucket b through the user's communication hook.
  asio::awaitable<void> run_hook(std::size_t b);
  /// The loop saw parameter i's mark: its gradient goes into (or is scaled in) its bucket.
  void process_ready(std::size_t i, bool used);
  /// Starts bucket b's reduction (the hook, else an allreduce).
  void launch(std::size_t b);
  /// Ends bucket b's entry of the iteration (completed, or failed with `e`).
  void end_bucket_record(std::size_t b, const std::exception_ptr& e);
  /// The averaged values of bucket b back into the registered gradients (copy
  /// mode), except those of globally unused parameters.
  void copy_back(std::size_t b);
  /// Orders the work queued on the callers' streams from now on after the
  /// work queued on the reducer's streams so far (throws cuda_error).
  void order_producers();
  /// The end of an iteration's device work: order_producers(), its failure noted.
  void end_device_work() noexcept;
  /// True when the next mark in mark order has been written (inline: the loop
  /// asks once per gradient).
  bool mark_available() const {
    return read_pos < n && slots[read_pos].load(std::memory_order_seq_cst) != 0;
  }
  /// One synchronised iteration, from prepare_for_backward to its last
  /// collective (or its abandonment); rethrows its first failure.
  asio::awaitable<void> run_iteration();

  // ---- the iteration on the caller's side (gradient_marking.cpp) --------------------

  /// Starts an iteration (prepare_for_backward).
  void prepare(std::span<const std::size_t> used);
  /// Marks gradient i ready (mark_grad_ready; any thread).
  void mark(std::size_t i);
  /// Checks for missing gradients; on them aborts the group and the loop's iteration.
  std::optional<missing_gradients_error> begin_finalize();
  /// After the iteration's end: stats, the caller may start another; then
  /// throws the missing gradients' error, else the iteration's failure.
  void end_finalize(const std::optional<missing_gradients_error>& missing, std::exception_ptr failure);
  /// After the iteration's end: its stats; the caller may start another.
  void end_finalize();
  /// Waits (blocking) for an iteration in flight, abandoning it.
  void shutdown() noexcept;
};

} // namespace corodist::ddp
