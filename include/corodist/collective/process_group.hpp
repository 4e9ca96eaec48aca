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

#include <asio/awaitable.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
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
  /// The caller's source line: kept in the group's flight recorder and, with
  /// gloo_options::check_calls, compared between the ranks (a rank that
  /// reaches a collective from another line is out of step). The default
  /// captures the line of the call when the options are defaulted or braced
  /// (`g->allreduce(t)`, `g->allreduce(t, sum, {.timeout = 5s})`); options
  /// made beforehand (`call_options o; ... g->allreduce(t, sum, o)`) carry the
  /// line where `o` was made (set `o.where` to the call's if that matters).
  std::source_location where = std::source_location::current();
};

/// Settings of a group made by `process_group::split` or `new_group`.
struct split_options {
  /// Time limit of creation, and the new group's default per collective
  /// (`inherit()`: the parent's).
  corodist::timeout timeout = corodist::timeout::inherit();
  /// A name for the new group, unique among the parent's subgroups (its
  /// store keys live under the parent's prefix and this name). Empty: the
  /// parent counts its splits ("split<n>/<color>").
  std::string name;
};

/// `color` of a rank that joins no group in `process_group::split`.
inline constexpr int no_color = -1;

/// The collectives a group runs.
enum class collective_kind : std::uint8_t {
  allreduce,
  broadcast,
  allgather,
  reduce_scatter,
  barrier,
  allreduce_coalesced,
  broadcast_coalesced,
  send,              ///< point-to-point: p2p[0] to its peer
  recv,              ///< point-to-point: p2p[0] from its peer (or from any rank)
  batch_isend_irecv, ///< point-to-point: every entry of p2p, issued together
  all_to_all_single,
  all_to_all,
  gather,
  scatter,
  reduce,
  allgatherv,
  monitored_barrier,
};

/// Returns the name of `k` ("allreduce", ...).
std::string_view to_string(collective_kind k) noexcept;

/// A receive from whichever rank sends first (`recv` with this source).
inline constexpr int any_source = -1;

/// Returns true for the point-to-point kinds (send, recv, batch_isend_irecv):
/// they involve only their peers, are not numbered with the collectives, and
/// never pass a call check.
constexpr bool is_point_to_point(collective_kind k) noexcept {
  return k == collective_kind::send || k == collective_kind::recv || k == collective_kind::batch_isend_irecv;
}

/// One send or receive of a point-to-point call (an entry of
/// `batch_isend_irecv`, PyTorch's `P2POp`).
struct p2p_op {
  enum class direction : std::uint8_t { send, recv };
  direction dir = direction::send;
  /// The buffer sent, or received into.
  tensor_view tensor;
  /// The destination (send) or source (recv) rank in the group; `any_source`
  /// for a receive from any rank (single `recv` on Gloo only).
  int peer = 0;
  /// Matches a send with a receive of the same tag (PyTorch's `tag`).
  std::uint32_t tag = 0;

  /// A send of `t` to `dst`.
  static p2p_op isend(tensor_view t, int dst, std::uint32_t tag = 0) { return {direction::send, t, dst, tag}; }
  /// A receive into `t` from `src`.
  static p2p_op irecv(tensor_view t, int src, std::uint32_t tag = 0) { return {direction::recv, t, src, tag}; }
};

/// One validated collective as a backend receives it.
struct collective_call {
  collective_kind kind = collective_kind::barrier;
  /// In-place collectives: the buffers. allgather, reduce_scatter,
  /// all_to_all_single, gather, scatter, allgatherv: {input, output}.
  /// all_to_all: the size() inputs, then the size() outputs. Point-to-point: empty.
  std::vector<tensor_view> tensors;
  reduce_op op = reduce_op::sum;
  int root = 0;
  /// all_to_all_single: elements sent to each rank (empty: even); allgatherv:
  /// each rank's element count.
  std::vector<std::size_t> in_splits;
  /// all_to_all_single: elements received from each rank (empty: even).
  std::vector<std::size_t> out_splits;
  /// Point-to-point kinds: the sends and receives (one for send and recv).
  std::vector<p2p_op> p2p;
  /// The call's time limit, resolved (never `inherit()`), for messages.
  corodist::timeout timeout = corodist::timeout::never();
  /// The deadline it made when it was issued.
  corodist::deadline by;
  /// call_options::stream.
  void* stream = nullptr;
  /// call_options::where (line 0: unknown).
  std::source_location where{};
};

/// A group of `size()` ranks, this process being `rank()`, that runs
/// collectives over caller buffers.
///
/// Every rank must issue the same collectives in the same order (the
/// sequence number counts them); each returns at once with a `work` that
/// completes when the collective has finished on this rank. Collectives
/// start in issue order (a backend may run some at once). With call checks
/// on (gloo_options::check_calls), a collective whose kind, dtype, size,
/// reduction, root or call site (`call_options::where`) differs between
/// ranks fails on every rank with a `collective_error` naming both calls.
/// Every group records its calls in a flight recorder
/// (corodist/core/flight_recorder.hpp, docs/collective.md). A failure other than a mismatch —
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

  // ---- point-to-point ----
  //
  // Sends and receives involve only their two ranks: they are not numbered
  // with the collectives (sequence_number() does not count them), may run
  // beside them, and match by (peer, tag) in issue order; on Gloo a send and
  // a receive also match only when dtype and element count agree (ones that
  // differ never exchange data). A send completes once its data has left for
  // the receiver, a receive once the data is in its buffer. The works of a
  // group's point-to-point calls complete in the order they were issued. A
  // call still pending at its deadline fails with `collective_timeout_error`
  // naming both ranks, and aborts the group (its buffers may still be in
  // Gloo's or NCCL's hands); a lost peer fails it with `rank_lost_error`.
  // NCCL ignores tags (ordering alone matches, as PyTorch's ProcessGroupNCCL).

  /// Sends `t` to rank `dst` (not this rank) with `tag`.
  [[nodiscard]] work send(tensor_view t, int dst, std::uint32_t tag = 0, call_options opts = {});

  /// Receives into `t` from rank `src` (not this rank) with `tag`; `src` may
  /// be `any_source` (Gloo only): `work::source_rank()` then says who sent.
  [[nodiscard]] work recv(tensor_view t, int src, std::uint32_t tag = 0, call_options opts = {});

  /// Issues every send and receive of `ops` together (PyTorch's
  /// `batch_isend_irecv`; NCCL group calls), so that exchanges with several
  /// peers complete whatever order each rank lists them in; the work
  /// completes when all have. No `any_source` entries.
  [[nodiscard]] work batch_isend_irecv(std::vector<p2p_op> ops, call_options opts = {});

  // ---- collectives with a root, all-to-all, uneven ----

  /// Every rank sends block j of `input` to rank j, and receives rank j's
  /// block for it into block j of `output` (PyTorch's `all_to_all_single`).
  /// Even (both split lists empty): `input` and `output` hold the same
  /// number of elements, a multiple of size(). Uneven: `in_splits[j]`
  /// elements go to rank j (they add up to input.count()), `out_splits[j]`
  /// come from rank j (they add up to output.count()); rank i's
  /// `in_splits[j]` must equal rank j's `out_splits[i]`. An empty list means
  /// even blocks on that side.
  [[nodiscard]] work all_to_all_single(tensor_view input, tensor_view output, std::vector<std::size_t> in_splits = {},
                                       std::vector<std::size_t> out_splits = {}, call_options opts = {});

  /// As all_to_all_single over lists: `inputs[j]` goes to rank j, rank j's
  /// buffer for this rank arrives in `outputs[j]` (size() of each, any
  /// element counts that match pairwise, one dtype).
  [[nodiscard]] work all_to_all(std::vector<tensor_view> inputs, std::vector<tensor_view> outputs,
                                call_options opts = {});

  /// Concatenates every rank's `input` in rank order into `output` on rank
  /// `root` (size() x input.count() elements there; ignored elsewhere, may be empty).
  [[nodiscard]] work gather(tensor_view input, tensor_view output, int root, call_options opts = {});

  /// Sends block j of `input` on rank `root` (size() x output.count()
  /// elements there; ignored elsewhere, may be empty) to `output` of rank j.
  [[nodiscard]] work scatter(tensor_view input, tensor_view output, int root, call_options opts = {});

  /// Reduces `t` element-wise over all ranks with `op` into `t` of rank
  /// `root`; the other ranks' `t` is left unspecified (used as scratch).
  [[nodiscard]] work reduce(tensor_view t, int root, reduce_op op = reduce_op::sum, call_options opts = {});

  /// Allgather with a count per rank: rank j contributes `counts[j]`
  /// elements (`input` holds counts[rank()]), and `output` receives them all
  /// in rank order (the sum of counts). `counts` is the same on every rank.
  [[nodiscard]] work allgatherv(tensor_view input, tensor_view output, std::vector<std::size_t> counts,
                                call_options opts = {});

  /// A barrier that, on failure, says who is missing (PyTorch's
  /// `monitored_barrier`): rank 0 waits for every other rank until the
  /// deadline, then releases them. If some rank has not arrived by then, the
  /// work fails on rank 0 and on every rank that arrived with a
  /// `collective_timeout_error` naming every rank that did not, and the
  /// group is aborted. Unlike `barrier`, it does not wait for earlier
  /// collectives (Gloo's communication threads may run it beside them).
  [[nodiscard]] work monitored_barrier(call_options opts = {});

  // ---- subgroups ----

  /// Splits the group (MPI_Comm_split's contract; `ncclCommSplit` on NCCL):
  /// every rank of this group calls it, in the same order relative to its
  /// collectives; the ranks that pass the same `color` (>= 0) form a new
  /// group, ranked by (`key`, rank in this group). A rank that passes
  /// `no_color` gets null. The new group is independent of this one (its own
  /// sequence numbers, abort and deadlines) and shares its store.
  /// Throws `usage_error` where the backend cannot split; otherwise as the
  /// backend's `create`.
  /// Cancellation: as the backend's `create`.
  [[nodiscard]] virtual asio::awaitable<std::shared_ptr<process_group>> split(int color, int key,
                                                                             split_options opts);

  /// As above with default options. (An overload, not a default argument:
  /// GCC 12 destroys a defaulted `split_options{}` inside `co_await` twice.)
  [[nodiscard]] asio::awaitable<std::shared_ptr<process_group>> split(int color, int key) {
    return split(color, key, split_options{});
  }

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

  /// The parent's side of `split`: the (color, key) of every rank, exchanged
  /// over this group with an allgather (a backend that splits without that
  /// exchange, as NCCL, need not call it). Entry i is rank i's.
  [[nodiscard]] asio::awaitable<std::vector<std::pair<int, int>>> exchange_colors(int color, int key,
                                                                                  corodist::timeout limit);

  /// Lets a group forward a call to another group (round_robin_group).
  static work submit_to(process_group& g, collective_call call) { return g.submit(std::move(call)); }

private:
  work issue(collective_call call, call_options opts);

  int rank_;
  int size_;
  corodist::timeout timeout_;
};

} // namespace corodist::collective
