#pragma once
/// \file
/// corodist::collective::process_group: the abstract group of ranks that
/// runs collectives (c10d's ProcessGroup). Backends: gloo_group (CPU, TCP),
/// nccl_group (CUDA), round_robin_group (spreads over several groups).

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/collective/reduce_op.hpp>
#include <corodist/collective/tensor_view.hpp>
#include <corodist/collective/work.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace corodist::collective {

/// Per-call settings of a collective.
struct call_options {
  /// Time limit of this collective, counted from the call (`inherit()`, the
  /// default: the group's timeout; `never()`: none).
  corodist::timeout timeout = corodist::timeout::inherit();
  /// CUDA buffers: the collective starts after the work queued so far on this
  /// stream (a `cudaStream_t` of the buffers' device, e.g. the one that
  /// produced them); null (the default): the device's legacy default stream,
  /// as PyTorch's current stream. Host buffers: ignored.
  void* stream = nullptr;
};

/// The collectives a group runs.
enum class collective_kind : std::uint8_t {
  allreduce,
  broadcast,
  allgather,
  reduce_scatter,
  barrier,
  allreduce_coalesced,
  broadcast_coalesced,
};

/// Returns the name of `k` ("allreduce", ...).
std::string_view to_string(collective_kind k) noexcept;

/// One validated collective as a backend receives it.
struct collective_call {
  collective_kind kind = collective_kind::barrier;
  /// In-place collectives: the buffers. allgather and reduce_scatter: {input, output}.
  std::vector<tensor_view> tensors;
  reduce_op op = reduce_op::sum;
  int root = 0;
  /// The call's time limit, resolved (never `inherit()`), for messages.
  corodist::timeout timeout = corodist::timeout::never();
  /// The deadline it made when it was issued.
  corodist::deadline by;
  /// call_options::stream.
  void* stream = nullptr;
};

/// A group of `size()` ranks, this process being `rank()`, that runs
/// collectives over caller buffers.
///
/// Every rank must issue the same collectives in the same order (the
/// sequence number counts them); each returns at once with a `work` that
/// completes when the collective has finished on this rank. Collectives
/// start in issue order (a backend may run some at once). With call checks
/// on (gloo_options::check_calls), a collective whose kind, dtype, size,
/// reduction or root differs between ranks fails on every rank with a
/// `collective_error` naming both calls. A failure other than a mismatch —
/// a timeout, a peer that died — aborts the group: pending and later
/// collectives fail with `collective_error`, and the group must be
/// recreated (as in PyTorch).
///
/// Buffers: see `tensor_view` (kept alive and untouched until the work
/// completes). Bad arguments (a wrong size, dtype or device, a root out of
/// range) throw `usage_error` at the call; nothing is issued then.
/// Thread-safe: any thread or coroutine may issue; issue order is call order.
class process_group : public std::enable_shared_from_this<process_group> {
public:
  virtual ~process_group();

  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;

  /// This process's rank in the group, in [0, size()).
  int rank() const noexcept { return rank_; }
  /// The number of ranks.
  int size() const noexcept { return size_; }
  /// The group's default time limit per collective (a positive length).
  corodist::timeout timeout() const noexcept { return timeout_; }
  /// The backend's name ("gloo", "nccl", "round_robin").
  virtual std::string_view backend() const noexcept = 0;

  /// Where buffers of every collective may live on this group: host memory
  /// for gloo (which also takes CUDA buffers, staged through host memory),
  /// the group's CUDA device for nccl. Callers put small control tensors
  /// (counts, flags) there.
  virtual device control_device() const noexcept { return device::cpu(); }

  /// Reduces `t` element-wise over all ranks with `op`; every rank gets the
  /// result in `t`.
  [[nodiscard]] work allreduce(tensor_view t, reduce_op op = reduce_op::sum, call_options opts = {});

  /// As allreduce over each of `ts` (same op), as one collective: the buffers
  /// travel together in few large messages (DDP's coalesced calls). Buffers
  /// may differ in dtype.
  [[nodiscard]] work allreduce_coalesced(std::vector<tensor_view> ts, reduce_op op = reduce_op::sum,
                                         call_options opts = {});

  /// Copies `t` of rank `root` into `t` of every other rank.
  [[nodiscard]] work broadcast(tensor_view t, int root, call_options opts = {});

  /// As broadcast of each of `ts` from `root`, as one collective (comm.h's
  /// broadcast_coalesced of a model's state).
  [[nodiscard]] work broadcast_coalesced(std::vector<tensor_view> ts, int root, call_options opts = {});

  /// Concatenates every rank's `input` in rank order into `output`, which
  /// holds `size() * input.count()` elements of the same dtype.
  [[nodiscard]] work allgather(tensor_view input, tensor_view output, call_options opts = {});

  /// Reduces `input` (`size() * output.count()` elements) element-wise over
  /// all ranks with `op`, and leaves chunk `rank()` of the result in `output`.
  [[nodiscard]] work reduce_scatter(tensor_view input, tensor_view output, reduce_op op = reduce_op::sum,
                                    call_options opts = {});

  /// Completes once every rank has reached its barrier, and after every
  /// collective this rank issued before it has completed.
  [[nodiscard]] work barrier(call_options opts = {});

  /// The number of collectives issued on this group so far (the sequence
  /// number the next one gets).
  virtual std::uint64_t sequence_number() const noexcept = 0;

  /// Aborts the group: collectives in flight and later ones fail with
  /// `collective_error` naming `reason`. Idempotent; thread-safe.
  virtual void abort(const std::string& reason) = 0;

  /// True once the group was aborted (by `abort` or by a failure).
  virtual bool aborted() const noexcept = 0;

protected:
  /// `timeout` is the default time limit per collective (must be a positive
  /// length: usage_error otherwise).
  process_group(int rank, int size, corodist::timeout timeout);

  /// `t` resolved against `fallback` where it is `inherit()`; throws
  /// `usage_error` naming `what` unless the result is a positive length.
  static corodist::timeout group_timeout(corodist::timeout t, corodist::timeout fallback, std::string_view what);

  /// Issues a validated collective. Backends may throw `usage_error` for
  /// buffers they cannot use (wrong device) before issuing anything.
  virtual work submit(collective_call call) = 0;

  /// Lets a group forward a call to another group (round_robin_group).
  static work submit_to(process_group& g, collective_call call) { return g.submit(std::move(call)); }

private:
  work issue(collective_call call, call_options opts);

  int rank_;
  int size_;
  corodist::timeout timeout_;
};

} // namespace corodist::collective
