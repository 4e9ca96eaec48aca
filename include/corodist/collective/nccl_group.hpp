#pragma once
/// \file
/// corodist::collective::nccl_group: the NCCL backend (CUDA device buffers),
/// its communicator found through a corodist store.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/collective/process_group.hpp>
#include <corodist/store/store.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace corodist::collective {

namespace detail {
class nccl_backend;
} // namespace detail

/// Settings of an nccl_group. Defaults are the named constants.
struct nccl_options {
  static constexpr std::chrono::milliseconds default_timeout = std::chrono::minutes(30);
  static constexpr const char* default_prefix = "corodist/nccl";
  static constexpr std::chrono::microseconds default_poll_interval{50};
  static constexpr std::chrono::microseconds default_max_poll_interval{1000};

  /// Key prefix of this group in the store (distinct per group sharing a store).
  std::string prefix = default_prefix;
  /// Time limit of creation, and the default one of each collective
  /// (`inherit()`: default_timeout). Must be a positive length (`never()` is
  /// refused: the watchdog needs one).
  corodist::timeout timeout = default_timeout;
  /// CUDA device of this rank; -1: `rank % device count`.
  int device = -1;
  /// Completion is polled on the loop's timer, first after this interval,
  /// doubling up to `max_poll_interval` while a collective runs.
  std::chrono::microseconds poll_interval = default_poll_interval;
  std::chrono::microseconds max_poll_interval = default_max_poll_interval;
};

/// A process group on NCCL, for buffers in CUDA device memory
/// (`device::cuda(i)`, the group's device).
///
/// Rendezvous: rank 0 creates the `ncclUniqueId` and publishes it in the
/// store under the group's prefix; every rank creates a non-blocking
/// communicator with it, polled on the loop until ready or the deadline.
/// Collectives are enqueued on the group's own CUDA stream, after the work
/// already queued on `call_options::stream` (the device's legacy default
/// stream unless given), and return at once. An event
/// recorded after each collective is polled on an Asio timer of the group's
/// executor (no thread spins); a completed work resumes its awaiting
/// coroutine on that coroutine's executor. The same poll is the watchdog: an
/// asynchronous NCCL error, or a collective past its deadline, aborts the
/// group and fails every pending collective (`collective_timeout_error` for
/// the late one, `collective_error` for the others). Aborting revokes the
/// communicator (`ncclCommRevoke`, NCCL 2.28: what is in flight stops) and
/// keeps it for `shrink` until the group goes (then `ncclCommAbort`); with an
/// older NCCL it calls `ncclCommAbort` at once. That NCCL call runs on a
/// thread of its own: `abort` returns at once, and the loop never waits on it.
/// Calls are not compared between ranks (no header exchange).
///
/// Point-to-point (`send`, `recv`, `batch_isend_irecv`) are `ncclSend` and
/// `ncclRecv` inside one `ncclGroupStart/End`, on the same stream as the
/// collectives in issue order, numbered apart from them (`work::seq()`
/// counts the point-to-point calls; `sequence_number()` does not). NCCL
/// matches them by order alone: tags are ignored (as PyTorch's
/// ProcessGroupNCCL), and `any_source` is refused with `usage_error` at the
/// call (`ncclRecv` names its peer). One left unmatched past its deadline
/// fails with `collective_timeout_error` naming both ranks, and aborts the
/// group. The first call with a peer connects to it inside `ncclGroupEnd`,
/// which returns once the peer posted its side: that call holds its thread
/// until then, or until its deadline. `all_to_all_single`, `all_to_all`,
/// `gather` and `scatter` are grouped `ncclSend`/`ncclRecv` (as
/// ProcessGroupNCCL; this rank's own block a device-to-device copy),
/// `reduce` is `ncclReduce` (every `reduce_op`, `avg` as `ncclAvg`),
/// `allgatherv` a grouped `ncclBroadcast` per rank.
/// `monitored_barrier` runs through the group's store beside the stream (it
/// does not wait for earlier collectives): every rank sets a key, rank 0
/// waits for them until the deadline and then releases the others with the
/// list of ranks that did not arrive; those that did fail with
/// `collective_timeout_error` naming them, and abort the group (the other
/// ranks wait for the release up to twice the time limit).
///
/// The CUDA and NCCL code lives in a plugin, `libcorodist-cuda.so`, built and
/// installed beside libcorodist when CUDA and NCCL are found, and loaded the
/// first time `unavailable_reason()` or `create` runs: a program that never
/// uses NCCL neither links nor loads the CUDA libraries.
class nccl_group final : public process_group {
public:
  /// True when this build has the NCCL backend (else `create` throws `usage_error`).
  static bool built() noexcept;

  /// "" when NCCL can run here (built, the plugin loads, and a CUDA device is
  /// usable), else the reason, e.g. "no CUDA device: CUDA driver version is
  /// insufficient ..." or "the CUDA plugin could not be loaded (...)".
  static std::string unavailable_reason();

  /// Creates rank `rank` of `size` ranks meeting in `store`, polling on `ex`.
  /// Throws `usage_error` (not built, bad arguments, prefix in use),
  /// `collective_error` (the plugin cannot be loaded, no usable CUDA device,
  /// NCCL failure), or
  /// `timeout_error` (not every rank joined within `opts.timeout`).
  /// (Name the options first; see gloo_group::create.)
  /// Cancellation: terminal (the awaiting coroutine's, see docs/core.md) at
  /// its store operations and between its polls of NCCL's initialisation:
  /// ends with `operation_aborted`, no group; keys it wrote stay in the store.
  [[nodiscard]] static asio::awaitable<std::shared_ptr<nccl_group>> create(asio::any_io_executor ex,
                                                                          std::shared_ptr<store::store> store,
                                                                          int rank, int size, nccl_options opts);

  /// As above with default options.
  [[nodiscard]] static asio::awaitable<std::shared_ptr<nccl_group>> create(asio::any_io_executor ex,
                                                                          std::shared_ptr<store::store> store,
                                                                          int rank, int size);

  /// Blocking `create` for plain threads (throws `usage_error` on a loop thread).
  static std::shared_ptr<nccl_group> create_sync(asio::any_io_executor ex, std::shared_ptr<store::store> store,
                                                 int rank, int size, nccl_options opts = {});

  /// Aborts the communicator if collectives are in flight (they fail), else
  /// destroys it when the last poll ends.
  ~nccl_group() override;

  std::string_view backend() const noexcept override { return "nccl"; }
  /// The group's CUDA device.
  device control_device() const noexcept override { return device::cuda(cuda_device()); }
  std::uint64_t sequence_number() const noexcept override;
  void abort(const std::string& reason) override;
  bool aborted() const noexcept override;

  /// Forms a new group of this group's ranks without `lost` (ranks of this
  /// group, e.g. those that died), with `ncclCommShrink`: no store, no new
  /// rendezvous. The remaining ranks keep their order and are renumbered
  /// from 0 (this rank becomes `rank() - (number of lost ranks below it)`).
  /// Every remaining rank calls it with the same `lost`; the lost ranks do
  /// not. When this group was aborted (a failure, `abort`), its revoked
  /// communicator (what was in flight stopped) is first let become quiescent
  /// and then shrunk (`NCCL_SHRINK_DEFAULT`); a communicator in error that no
  /// revoke settled is shrunk with `NCCL_SHRINK_ABORT` (NCCL stops its work
  /// first); a healthy group stays usable (await its collectives before).
  /// Non-blocking, polled on this group's executor like `create`, bounded by
  /// `opts.timeout`;
  /// `opts.prefix` only names the new group in errors and logs, the device
  /// stays this group's (`opts.device` must be -1 or `cuda_device()`), the
  /// timeout and poll intervals are the new group's.
  /// Throws `usage_error` (`lost` empty, out of range, with duplicates, or
  /// holding this rank; bad options; the NCCL of this build or of this run
  /// has no ncclCommShrink, i.e. is older than 2.27), `collective_error`
  /// (NCCL failure; the communicator is gone: aborted where NCCL cannot
  /// revoke, before 2.28), `timeout_error` (a remaining rank did not join in
  /// time). Any thread; resumes the caller on its own executor.
  /// Cancellation: as create, between its polls; this group is left as the
  /// shrink left it (check `shrink_unavailable_reason()`).
  [[nodiscard]] asio::awaitable<std::shared_ptr<nccl_group>> shrink(std::vector<int> lost, nccl_options opts);

  /// As above with this group's options (the prefix suffixed with "/shrunk").
  [[nodiscard]] asio::awaitable<std::shared_ptr<nccl_group>> shrink(std::vector<int> lost);

  /// Splits the group with `ncclCommSplit` (see process_group::split): every
  /// rank of this group calls it; the ranks with the same `color` (>= 0) form
  /// a new nccl_group ranked by (`key`, rank here), `no_color`
  /// (NCCL_SPLIT_NOCOLOR) gets null. The new group has a communicator of its
  /// own (not sharing this one's resources: aborting one leaves the other),
  /// on this group's device, with its own stream, poll and sequence numbers;
  /// its store keys live under this group's prefix, `opts.name` (empty:
  /// "split<n>", n counting this group's splits) and the color. Its timeout is
  /// `opts.timeout` (`inherit()`: this group's), also the limit of the split.
  /// Non-blocking, polled on this group's executor like `create`; await it
  /// before issuing more on this group (NCCL's communicator is busy with the
  /// split until then).
  /// Throws `usage_error` (a color below 0 other than `no_color`; a bad
  /// timeout), `collective_error` (this group was aborted; NCCL failed),
  /// `timeout_error` (not every rank called split in time: this group is
  /// then aborted, NCCL's split being left running on it). Any thread;
  /// resumes the caller on its own executor.
  /// Cancellation: terminal, between its polls: ends with
  /// `operation_aborted`, no group, and this group is aborted (the split
  /// still runs on its communicator).
  [[nodiscard]] asio::awaitable<std::shared_ptr<process_group>> split(int color, int key,
                                                                     split_options opts) override;
  using process_group::split;

  /// "" when `shrink` can run on this group, else why not (the NCCL of this
  /// build or run has no ncclCommShrink; the communicator was aborted and
  /// could not be kept). Thread-safe.
  std::string shrink_unavailable_reason() const;

  /// The CUDA device of this rank.
  int cuda_device() const noexcept;

  /// The group's CUDA stream (a `cudaStream_t`).
  void* stream() const noexcept;

protected:
  work submit(collective_call call) override;

private:
  nccl_group(int rank, int size, corodist::timeout timeout, std::shared_ptr<detail::nccl_backend> backend);

  std::shared_ptr<detail::nccl_backend> backend_;
};

} // namespace corodist::collective
