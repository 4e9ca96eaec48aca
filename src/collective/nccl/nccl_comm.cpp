// An NCCL communicator, the heart of libcorodist-cuda (the plugin that holds
// the CUDA and NCCL calls): rendezvous through the store, collectives on the
// group's stream, completion and deadlines polled on an Asio timer.
#include <corodist/collective/errors.hpp>
#include <corodist/core/error.hpp>
#include <corodist/store/prefix_store.hpp>

#include "collective/cuda/cuda_plugin.hpp"
#include "collective/describe.hpp"
#include "collective/record_call.hpp"
#include "collective/work_state.hpp"
#include "core/log.hpp"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <system_error>
#include <thread>

// ncclCommShrink (NCCL 2.27) and ncclCommRevoke (2.28) are bound weakly: the
// plugin still loads where the libnccl found at run time is older than the
// nccl.h it was built with; shrink then says what is missing.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 0)
#define CORODIST_NCCL_SHRINK 1
#pragma weak ncclCommShrink
#else
#define CORODIST_NCCL_SHRINK 0
#endif
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define CORODIST_NCCL_REVOKE 1
#pragma weak ncclCommRevoke
#else
#define CORODIST_NCCL_REVOKE 0
#endif

namespace corodist::collective {

namespace {

using clock = std::chrono::steady_clock;
using detail::work_state;

std::string cuda_text(cudaError_t e) { return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e)); }

ncclDataType_t nccl_type(dtype t) {
  switch (t) {
  case dtype::float32: return ncclFloat32;
  case dtype::float64: return ncclFloat64;
  case dtype::float16: return ncclFloat16;
  case dtype::bfloat16: return ncclBfloat16;
  case dtype::int32: return ncclInt32;
  case dtype::int64: return ncclInt64;
  case dtype::uint8: return ncclUint8;
  }
  throw usage_error("nccl: invalid dtype");
}

ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
  case reduce_op::sum: return ncclSum;
  case reduce_op::avg: return ncclAvg;
  case reduce_op::min: return ncclMin;
  case reduce_op::max: return ncclMax;
  case reduce_op::product: return ncclProd;
  }
  throw usage_error("nccl: invalid reduce_op");
}

// "2.28.9" from an NCCL version code (NCCL_VERSION_CODE, ncclGetVersion).
std::string version_text(int code) {
  if (code < 10000) // before 2.9: X * 1000 + Y * 100 + Z
    return fmt::format("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100);
  return fmt::format("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
}

std::string runtime_version() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? version_text(v) : std::string("unknown version");
}

// Whether the weakly bound function `f` is present in the libnccl loaded.
template <class F>
bool present(F* f) noexcept {
  return reinterpret_cast<void*>(f) != nullptr;
}

std::string ranks_text(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ",")); }

// The blocks of one side of an all_to_all_single: block j is `counts[j]`
// elements from element `at[j]` (the split list, or total / n each when it is
// empty: even).
struct blocks {
  std::vector<std::size_t> counts;
  std::vector<std::size_t> at;

  blocks() = default;
  blocks(const std::vector<std::size_t>& splits, std::size_t total, int n)
      : counts(splits.empty() ? std::vector<std::size_t>(static_cast<std::size_t>(n),
                                                         total / static_cast<std::size_t>(n))
                              : splits),
        at(counts.size()) {
    std::size_t offset = 0;
    for (std::size_t j = 0; j < counts.size(); ++j) {
      at[j] = offset;
      offset += counts[j];
    }
  }

  /// Block `j` of `t`.
  tensor_view of(const tensor_view& t, int j) const {
    const auto q = static_cast<std::size_t>(j);
    return t.slice(at[q], counts[q]);
  }
};

// The ranks a point-to-point call waits on, for its timeout text: "rank 1", "ranks 1, 3".
std::string peers_text(const std::vector<p2p_op>& ops) {
  std::vector<int> peers;
  for (const auto& o : ops)
    if (std::find(peers.begin(), peers.end(), o.peer) == peers.end())
      peers.push_back(o.peer);
  std::sort(peers.begin(), peers.end());
  return fmt::format("rank{} {}", peers.size() == 1 ? "" : "s", fmt::join(peers, ", "));
}

// Where NCCL writes the communicator of a split or shrink: NCCL's own thread
// stores it when the new communicator is made (or failed). Freed once that
// is known to have happened; else (a deadline or a cancellation while NCCL
// still works on it) left allocated on purpose, since NCCL may still write it.
struct child_slot {
  ncclComm_t* comm = new ncclComm_t(nullptr);
  bool settled = false;
  child_slot() = default;
  child_slot(const child_slot&) = delete;
  child_slot& operator=(const child_slot&) = delete;
  ~child_slot() {
    if (settled)
      delete comm;
  }
  ncclComm_t load() const noexcept { return std::atomic_ref<ncclComm_t>(*comm).load(std::memory_order_acquire); }
};

struct pending_op {
  /// The collective's sequence number, or a point-to-point call's own (they are counted apart).
  std::uint64_t seq = 0;
  collective_call call;
  clock::time_point deadline;
  cudaEvent_t done = nullptr;
  std::shared_ptr<work_state> state;
};

class nccl_comm final : public detail::nccl_backend, public std::enable_shared_from_this<nccl_comm> {
public:
  /// Rendezvous and communicator creation; see nccl_group::create.
  static asio::awaitable<std::shared_ptr<detail::nccl_backend>> create(asio::any_io_executor ex,
                                                                       std::shared_ptr<store::store> store, int rank,
                                                                       int size, nccl_options opts);

  /// Waits on the loop's timer until the communicator being made (its call
  /// returned `r`) is ready or failed; ncclInProgress when `deadline` passed.
  static asio::awaitable<ncclResult_t> settle_init(nccl_comm& st, ncclResult_t r, clock::time_point deadline);

  /// Calls `done` on the loop's timer, the wait doubling from
  /// opts.poll_interval to opts.max_poll_interval, until it returns true;
  /// timeout_error "`what` within N ms" once `deadline` passed.
  asio::awaitable<void> poll_until(const nccl_options& opts, clock::time_point deadline,
                                   std::function<bool()> done, std::string what) {
    asio::steady_timer timer(ex_);
    auto interval = opts.poll_interval;
    while (!done()) {
      if (clock::now() >= deadline)
        throw timeout_error(fmt::format("{} within {} ms", what, opts.timeout.length().count()));
      timer.expires_after(interval);
      co_await timer.async_wait(asio::use_awaitable);
      interval = std::min(interval * 2, opts.max_poll_interval);
    }
  }

  /// The stream, events and scratch buffer of a communicator just made.
  void finish_setup(const std::string& what, const char* op);

  /// Keys of this communicator (monitored_barrier's) go to `base` under `prefix`.
  void attach_store(std::shared_ptr<store::store> base, std::string prefix) {
    store_ = std::make_shared<store::prefix_store>(prefix, base);
    base_store_ = std::move(base);
    store_prefix_ = std::move(prefix);
    // The group's flight recorder, named by its prefix (the same on every rank).
    recorder_ = flight_recorder::create("collective", store_prefix_);
    peers_ = detail::group_peers(size_);
  }

  /// Polls a split or shrink of `parent` (NCCL makes the new communicator on
  /// a thread of its own, tracked by the parent's asynchronous state, and
  /// stores it in `slot` when done) on the loop's timer until it ended or
  /// `deadline` passed. Returns ncclSuccess (`slot` holds the new
  /// communicator; null where `expect_child` is false: a rank of no color),
  /// NCCL's error, or ncclInProgress at the deadline (NCCL still works).
  asio::awaitable<ncclResult_t> settle_child(ncclComm_t parent, child_slot& slot, bool expect_child,
                                             clock::time_point deadline, const nccl_options& o) {
    asio::steady_timer timer(ex_);
    auto interval = o.poll_interval;
    for (;;) {
      ncclResult_t ps = ncclSuccess;
      ncclCommGetAsyncError(parent, &ps);
      if (ps != ncclInProgress) { // NCCL's job ended: it stored the new communicator (or null) before
        if (const ncclComm_t child = slot.load()) {
          ncclResult_t cs = ncclSuccess;
          ncclCommGetAsyncError(child, &cs);
          if (cs != ncclInProgress) {
            slot.settled = true;
            co_return cs != ncclSuccess ? cs : ps;
          }
        } else if (!expect_child || ps != ncclSuccess) {
          slot.settled = true;
          co_return ps;
        }
      }
      if (clock::now() >= deadline)
        co_return ncclInProgress;
      timer.expires_after(interval);
      co_await timer.async_wait(asio::use_awaitable);
      interval = std::min(interval * 2, o.max_poll_interval);
    }
  }

  nccl_comm(asio::any_io_executor e, int r, int n, nccl_options o)
      : ex_(std::move(e)), rank_(r), size_(n), opts_(std::move(o)) {
    label_ = fmt::format("nccl group '{}'", opts_.prefix);
  }

  ~nccl_comm() override {
    if (comm_) {
      if (aborted_ || !inflight_.empty())
        ncclCommAbort(comm_);
      else
        ncclCommDestroy(comm_);
    }
    cudaSetDevice(device_);
    for (auto& op : inflight_)
      if (op->done)
        cudaEventDestroy(op->done);
    if (ready_)
      cudaEventDestroy(ready_);
    if (stream_)
      cudaStreamDestroy(stream_);
    if (scratch_)
      cudaFree(scratch_);
  }

  std::string where(const pending_op& op) const { return detail::where(op.call, op.seq, rank_, size_, label_); }

  collective_error error_of(const pending_op& op, const std::string& what) const {
    return detail::error_at({op.call, op.seq, rank_, size_, label_}, what);
  }

  // Waits (yielding the thread) while a non-blocking communicator reports
  // ncclInProgress for the call just made; bounded by `deadline`, and by an
  // abort asked for meanwhile (ncclInProgress then too).
  ncclResult_t settle(ncclResult_t r, clock::time_point deadline) {
    while (r == ncclInProgress) {
      if (clock::now() >= deadline || abort_requested_.load(std::memory_order_acquire))
        return ncclInProgress;
      std::this_thread::yield();
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      r = state;
    }
    return r;
  }

  // Checks of a call that only this backend makes (before anything is
  // issued): buffers on the group's device, no receive from any rank.
  void check_call(const collective_call& call) const {
    auto on_device = [&](const tensor_view& t) {
      // Empty buffers are never touched (a non-root's ignored side of gather and scatter).
      if (t.count() > 0 && t.where() != device::cuda(device_))
        throw usage_error(fmt::format("{}: the nccl group of rank {} takes buffers on cuda:{}, not {}",
                                      to_string(call.kind), rank_, device_, t.where().to_string()));
    };
    for (const auto& t : call.tensors)
      on_device(t);
    for (const auto& o : call.p2p) {
      if (o.dir == p2p_op::direction::recv && o.peer == any_source)
        throw usage_error(fmt::format("{}: NCCL cannot receive from any rank (ncclRecv names its peer); name the "
                                      "source rank, or use a gloo group for any_source",
                                      to_string(call.kind)));
      on_device(o.tensor);
    }
  }

  // Enqueues `op` on the group's stream: NCCL calls inside one
  // ncclGroupStart/End (the point-to-point ones, gather, scatter and the
  // all-to-alls as grouped ncclSend/ncclRecv, as ProcessGroupNCCL does), a
  // rank's block for itself as a device-to-device copy before them.
  void enqueue(const pending_op& op) {
    const auto& call = op.call;
    const auto deadline = op.deadline;
    auto check = [&](ncclResult_t r, const char* what) {
      r = settle(r, deadline);
      if (r == ncclInProgress && abort_requested_.load(std::memory_order_acquire))
        throw error_of(op, fmt::format("the group was aborted while {} waited", what));
      // Still in progress at the deadline: NCCL waits on a peer (the first
      // point-to-point call with a rank connects to it, and waits for its side).
      if (r == ncclInProgress)
        throw detail::timeout_at({call, op.seq, rank_, size_, label_},
                                 fmt::format("{} did not return: {}; the group is aborted", what, timeout_text(op)));
      if (r != ncclSuccess)
        throw collective_error(fmt::format("{}: {} failed: {} ({})", label_, what, ncclGetErrorString(r),
                                           ncclGetLastError(comm_)),
                               std::string(to_string(call.kind)), rank_, op.seq);
    };
    auto copy = [&](const tensor_view& dst, const tensor_view& src) {
      if (dst.bytes() == 0 || dst.data() == src.data())
        return;
      if (auto e = cudaMemcpyAsync(dst.data(), src.data(), dst.bytes(), cudaMemcpyDeviceToDevice, stream_);
          e != cudaSuccess)
        throw error_of(op, "cudaMemcpyAsync: " + cuda_text(e));
    };
    // Blocks of collectives: empty ones are skipped (the peer's matching one is empty too).
    auto send = [&](const tensor_view& x, int peer) {
      if (x.count() > 0)
        check(ncclSend(x.data(), x.count(), nccl_type(x.type()), peer, comm_, stream_), "ncclSend");
    };
    auto recv = [&](const tensor_view& x, int peer) {
      if (x.count() > 0)
        check(ncclRecv(x.data(), x.count(), nccl_type(x.type()), peer, comm_, stream_), "ncclRecv");
    };
    const auto& t = call.tensors;
    const auto me = static_cast<std::size_t>(rank_);
    blocks in, out; // all_to_all_single's
    if (call.kind == collective_kind::all_to_all_single) {
      in = blocks(call.in_splits, t[0].count(), size_);
      out = blocks(call.out_splits, t[1].count(), size_);
    }
    // This rank's own block: a copy on the stream, before the group.
    switch (call.kind) {
    case collective_kind::all_to_all_single:
      copy(out.of(t[1], rank_), in.of(t[0], rank_));
      break;
    case collective_kind::all_to_all:
      copy(t[t.size() / 2 + me], t[me]);
      break;
    case collective_kind::gather:
      if (rank_ == call.root)
        copy(t[1].slice(me * t[0].count(), t[0].count()), t[0]);
      break;
    case collective_kind::scatter:
      if (rank_ == call.root)
        copy(t[1], t[0].slice(me * t[1].count(), t[1].count()));
      break;
    default:
      break;
    }
    check(ncclGroupStart(), "ncclGroupStart");
    try {
      enqueue_grouped(op, in, out, check, send, recv);
    } catch (...) {
      ncclGroupEnd(); // leaves no group open on this thread; the caller aborts the communicator
      throw;
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

  // The NCCL calls of `op` inside its group (see enqueue); `in` and `out`:
  // the blocks of an all_to_all_single.
  template <class Check, class Send, class Recv>
  void enqueue_grouped(const pending_op& op, const blocks& in, const blocks& out, Check& check, Send& send,
                       Recv& recv) {
    const auto& call = op.call;
    const auto& t = call.tensors;
    switch (call.kind) {
    case collective_kind::allreduce:
      check(ncclAllReduce(t[0].data(), t[0].data(), t[0].count(), nccl_type(t[0].type()), nccl_op(call.op), comm_,
                          stream_),
            "ncclAllReduce");
      break;
    case collective_kind::broadcast:
      check(ncclBroadcast(t[0].data(), t[0].data(), t[0].count(), nccl_type(t[0].type()), call.root, comm_, stream_),
            "ncclBroadcast");
      break;
    case collective_kind::allgather:
      check(ncclAllGather(t[0].data(), t[1].data(), t[0].count(), nccl_type(t[0].type()), comm_, stream_),
            "ncclAllGather");
      break;
    case collective_kind::reduce_scatter:
      check(ncclReduceScatter(t[0].data(), t[1].data(), t[1].count(), nccl_type(t[0].type()), nccl_op(call.op), comm_,
                              stream_),
            "ncclReduceScatter");
      break;
    case collective_kind::barrier:
      check(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
      break;
    case collective_kind::allreduce_coalesced:
      for (const auto& x : t)
        if (x.count() > 0)
          check(ncclAllReduce(x.data(), x.data(), x.count(), nccl_type(x.type()), nccl_op(call.op), comm_, stream_),
                "ncclAllReduce");
      break;
    case collective_kind::broadcast_coalesced:
      for (const auto& x : t)
        if (x.count() > 0)
          check(ncclBroadcast(x.data(), x.data(), x.count(), nccl_type(x.type()), call.root, comm_, stream_),
                "ncclBroadcast");
      break;
    case collective_kind::send:
    case collective_kind::recv:
    case collective_kind::batch_isend_irecv:
      // Every entry, empty ones too (a zero-byte message still pairs with its peer's).
      for (const auto& o : call.p2p) {
        void* data = o.tensor.data() ? o.tensor.data() : scratch_;
        if (o.dir == p2p_op::direction::send)
          check(ncclSend(data, o.tensor.count(), nccl_type(o.tensor.type()), o.peer, comm_, stream_), "ncclSend");
        else
          check(ncclRecv(data, o.tensor.count(), nccl_type(o.tensor.type()), o.peer, comm_, stream_), "ncclRecv");
      }
      break;
    case collective_kind::all_to_all_single:
      for (int j = 0; j < size_; ++j) {
        if (j == rank_)
          continue;
        send(in.of(t[0], j), j);
        recv(out.of(t[1], j), j);
      }
      break;
    case collective_kind::all_to_all: {
      const auto n = t.size() / 2;
      for (int j = 0; j < size_; ++j) {
        if (j == rank_)
          continue;
        send(t[static_cast<std::size_t>(j)], j);
        recv(t[n + static_cast<std::size_t>(j)], j);
      }
      break;
    }
    case collective_kind::gather:
    case collective_kind::scatter: {
      // Gather: every block to the root; scatter: the root's blocks out.
      const bool to_root = call.kind == collective_kind::gather;
      const auto& block = to_root ? t[0] : t[1];
      const auto& whole = to_root ? t[1] : t[0];
      if (rank_ != call.root) {
        to_root ? send(block, call.root) : recv(block, call.root);
        break;
      }
      for (int j = 0; j < size_; ++j) {
        if (j == rank_)
          continue;
        const auto part = whole.slice(static_cast<std::size_t>(j) * block.count(), block.count());
        to_root ? recv(part, j) : send(part, j);
      }
      break;
    }
    case collective_kind::reduce:
      check(ncclReduce(t[0].data(), t[0].data(), t[0].count(), nccl_type(t[0].type()), nccl_op(call.op), call.root,
                       comm_, stream_),
            "ncclReduce");
      break;
    case collective_kind::allgatherv: {
      // A broadcast per rank of its block, from its input into its place in the output.
      std::size_t at = 0;
      for (int j = 0; j < size_; ++j) {
        const auto c = call.in_splits[static_cast<std::size_t>(j)];
        const auto dst = t[1].slice(at, c);
        at += c;
        if (c == 0)
          continue;
        const void* src = j == rank_ ? t[0].data() : dst.data();
        check(ncclBroadcast(src, dst.data(), c, nccl_type(t[0].type()), j, comm_, stream_), "ncclBroadcast (allgatherv)");
      }
      break;
    }
    case collective_kind::monitored_barrier: // runs through the store, never here
      throw usage_error(fmt::format("{}: monitored_barrier is not enqueued on the stream", label_));
    }
  }

  work submit(collective_call call) override {
    check_call(call);
    const bool p2p = is_point_to_point(call.kind);
    std::unique_lock lk(mutex_);
    auto op = std::make_shared<pending_op>();
    op->seq = p2p ? next_p2p_seq_++ : next_seq_++;
    op->deadline = call.by.at();
    op->state = std::make_shared<work_state>(std::string(to_string(call.kind)), op->seq);
    detail::record_call(*op->state, recorder_, call, op->seq, peers_);
    op->call = std::move(call);
    work w(op->state);
    if (aborted_) {
      auto why = abort_reason_;
      lk.unlock();
      op->state->complete(std::make_exception_ptr(error_of(*op, "the group was aborted: " + why)));
      return w;
    }
    if (op->call.kind == collective_kind::monitored_barrier) {
      lk.unlock();
      op->state->mark_started();
      asio::co_spawn(ex_, monitored_barrier(shared_from_this(), op), asio::detached);
      return w;
    }
    try {
      cudaSetDevice(device_);
      // After the work already queued on the caller's stream (the legacy default stream unless given).
      auto* after = op->call.stream ? static_cast<cudaStream_t>(op->call.stream) : cudaStreamLegacy;
      if (auto e = cudaEventRecord(ready_, after); e != cudaSuccess)
        throw error_of(*op, "cudaEventRecord: " + cuda_text(e));
      if (auto e = cudaStreamWaitEvent(stream_, ready_, 0); e != cudaSuccess)
        throw error_of(*op, "cudaStreamWaitEvent: " + cuda_text(e));
      op->state->mark_started();
      enqueue(*op);
      if (auto e = cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming); e != cudaSuccess)
        throw error_of(*op, "cudaEventCreate: " + cuda_text(e));
      if (auto e = cudaEventRecord(op->done, stream_); e != cudaSuccess)
        throw error_of(*op, "cudaEventRecord: " + cuda_text(e));
    } catch (const std::exception& e) {
      const std::string why = e.what();
      lk.unlock();
      if (!abort_requested_.load(std::memory_order_acquire)) // else the abort asked for names its own reason
        abort_now(why);
      op->state->complete(std::current_exception());
      return w;
    }
    inflight_.push_back(op);
    const bool start = !polling_;
    polling_ = true;
    lk.unlock();
    if (start)
      asio::co_spawn(ex_, poll(shared_from_this()), asio::detached);
    return w;
  }

  // monitored_barrier through the group's store, beside the stream (it does
  // not wait for the collectives before it): every other rank sets
  // "<base>arrived/<rank>" and waits for "<base>release"; rank 0 waits for
  // each arrival until the deadline, then writes the release: "ok", or the
  // ranks that did not arrive. On a failure, rank 0 and every rank that
  // arrived fail with collective_timeout_error naming those ranks, and abort
  // the group. A rank that finds no release within twice the time limit says
  // that rank 0 did not answer.
  static asio::awaitable<void> monitored_barrier(std::shared_ptr<nccl_comm> self, std::shared_ptr<pending_op> op) {
    const auto base = fmt::format("monitored_barrier/{}/", op->seq);
    const corodist::deadline by(op->deadline);
    const detail::call_site site{op->call, op->seq, self->rank_, self->size_, self->label_};
    auto late = [&](const std::vector<int>& missing) { // the words of the Gloo backend's
      return detail::timeout_at(site, fmt::format("rank{} {} did not reach monitored_barrier within {} ms (of {} ranks, "
                                                  "{} arrived); the group is aborted",
                                                  missing.size() == 1 ? "" : "s", fmt::join(missing, ", "),
                                                  op->call.timeout.length().count(), self->size_,
                                                  self->size_ - static_cast<int>(missing.size())));
    };
    std::exception_ptr failure;
    std::string abort_why;
    try {
      auto& store = *self->store_;
      if (self->rank_ == 0) {
        std::vector<int> missing;
        for (int r = 1; r < self->size_; ++r) {
          std::string key = base + "arrived/" + std::to_string(r);
          bool here = false;
          if (by.expired()) {
            std::vector<std::string> keys{key};
            here = co_await store.check(std::move(keys));
          } else {
            try {
              const corodist::timeout left = by.left();
              co_await store.get(std::move(key), left);
              here = true;
            } catch (const timeout_error&) {
            }
          }
          if (!here)
            missing.push_back(r);
        }
        std::string release_key = base + "release";
        std::string release = missing.empty() ? std::string("ok") : "missing:" + ranks_text(missing);
        co_await store.set(std::move(release_key), std::move(release));
        if (!missing.empty()) {
          const auto e = late(missing);
          abort_why = e.what();
          failure = std::make_exception_ptr(e);
        }
      } else {
        std::string arrived_key = base + "arrived/" + std::to_string(self->rank_);
        std::string one = "1";
        co_await store.set(std::move(arrived_key), std::move(one));
        // Rank 0 writes the release once its own deadline passed: the others
        // wait for it up to twice the time limit from their call.
        const auto answer_by = by.is_never() ? by : corodist::deadline(by.at() + op->call.timeout.length());
        std::string release;
        bool answered = true;
        try {
          std::string release_key = base + "release";
          const corodist::timeout left = answer_by.left();
          release = co_await store.get(std::move(release_key), left);
        } catch (const timeout_error&) {
          answered = false;
        }
        if (!answered) {
          const auto e = detail::timeout_at(
              site, fmt::format("rank 0, which monitors the barrier, did not answer within {} ms; the group is aborted",
                                2 * op->call.timeout.length().count()));
          abort_why = e.what();
          failure = std::make_exception_ptr(e);
        } else if (release != "ok") {
          std::vector<int> missing;
          const auto list = release.substr(release.find(':') + 1);
          for (std::size_t at = 0; at < list.size();) {
            const auto comma = std::min(list.find(',', at), list.size());
            missing.push_back(std::stoi(list.substr(at, comma - at)));
            at = comma + 1;
          }
          const auto e = late(missing);
          abort_why = e.what();
          failure = std::make_exception_ptr(e);
        }
      }
    } catch (const std::exception& e) { // the store failed: a collective error, the group aborted
      const auto err = detail::error_at(site, std::string("the store failed: ") + e.what() + "; the group is aborted");
      abort_why = err.what();
      failure = std::make_exception_ptr(err);
    }
    if (failure)
      self->abort_now(abort_why);
    op->state->complete(failure);
  }

  // The poller and watchdog: completes finished collectives in order, and
  // aborts on an asynchronous NCCL error or a passed deadline. Runs while
  // collectives are in flight.
  static asio::awaitable<void> poll(std::shared_ptr<nccl_comm> self) {
    asio::steady_timer timer(self->ex_);
    auto interval = self->opts_.poll_interval;
    for (;;) {
      std::shared_ptr<pending_op> front;
      std::string aborted_why;
      {
        std::lock_guard lk(self->mutex_);
        if (self->inflight_.empty()) {
          self->polling_ = false;
          co_return;
        }
        front = self->inflight_.front();
        if (self->aborted_)
          aborted_why = self->abort_reason_;
      }
      if (!aborted_why.empty()) { // aborted elsewhere (abort(), destruction): fail what is left
        self->fail_all(aborted_why, false);
        continue;
      }
      cudaSetDevice(self->device_);
      const auto q = cudaEventQuery(front->done);
      if (q == cudaSuccess) {
        self->pop_front();
        if (front->call.kind == collective_kind::recv)
          front->state->set_source(front->call.p2p[0].peer);
        front->state->complete(nullptr);
        interval = self->opts_.poll_interval;
        continue;
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(self->comm_, &async);
      if (q != cudaErrorNotReady || (async != ncclSuccess && async != ncclInProgress)) {
        const auto why = q != cudaErrorNotReady ? "CUDA error: " + cuda_text(q)
                                                : fmt::format("NCCL error: {} ({})", ncclGetErrorString(async),
                                                              ncclGetLastError(self->comm_));
        self->fail_all(self->where(*front) + ": " + why + "; the group is aborted", false);
        continue;
      }
      if (clock::now() >= front->deadline) {
        self->fail_all(self->where(*front) + ": " + self->timeout_text(*front) + "; the group is aborted", true);
        continue;
      }
      timer.expires_after(interval);
      co_await timer.async_wait(asio::use_awaitable);
      interval = std::min(interval * 2, self->opts_.max_poll_interval);
    }
  }

  // Why `op` is late: "timed out after 200 ms (allreduce(...))"; for a
  // point-to-point call, both ends: "rank 0's send(... to rank 1, ...) was
  // not matched by rank 1 within 200 ms (no matching receive posted, or posted late)".
  std::string timeout_text(const pending_op& op) const {
    const auto ms = op.call.timeout.length().count();
    if (!is_point_to_point(op.call.kind))
      return fmt::format("timed out after {} ms ({})", ms, detail::describe(op.call));
    const bool sends = std::all_of(op.call.p2p.begin(), op.call.p2p.end(),
                                   [](const p2p_op& o) { return o.dir == p2p_op::direction::send; });
    const bool recvs = std::all_of(op.call.p2p.begin(), op.call.p2p.end(),
                                   [](const p2p_op& o) { return o.dir == p2p_op::direction::recv; });
    const char* missing = sends   ? "no matching receive posted, or posted late"
                          : recvs ? "no matching send posted, or posted late"
                                  : "a matching send or receive not posted, or posted late";
    return fmt::format("rank {}'s {} was not matched by {} within {} ms ({}; NCCL matches by order, not tag)", rank_,
                       detail::describe(op.call), peers_text(op.call.p2p), ms, missing);
  }

  void pop_front() {
    std::lock_guard lk(mutex_);
    if (!inflight_.empty()) {
      cudaEventDestroy(inflight_.front()->done);
      inflight_.pop_front();
    }
  }

  // Aborts the communicator and fails every collective in flight; the first
  // with a timeout error when `timed_out`.
  void fail_all(const std::string& why, bool timed_out) {
    abort_now(why);
    std::deque<std::shared_ptr<pending_op>> ops;
    {
      std::lock_guard lk(mutex_);
      ops.swap(inflight_);
    }
    bool first = true;
    for (auto& op : ops) {
      cudaEventDestroy(op->done);
      op->done = nullptr;
      if (first && timed_out)
        op->state->complete(std::make_exception_ptr(
            collective_timeout_error(why, std::string(to_string(op->call.kind)), rank_, op->seq)));
      else
        op->state->complete(std::make_exception_ptr(error_of(*op, "the group was aborted: " + why)));
      first = false;
    }
  }

  // Where NCCL can revoke a communicator (2.28), the communicator is revoked
  // (what is in flight stops) and kept, so that `shrink` can still re-form
  // the group from it (NCCL_SHRINK_ABORT); it is aborted when the backend
  // goes. Elsewhere it is aborted at once. Neither the caller nor the loop
  // waits for NCCL: its revoke and abort can block until the work queued
  // before them on the streams has run (NCCL 2.28.3 on an H200: a revoke
  // waited as long as a collective was held behind the caller's stream), so
  // a thread of its own settles the communicator, holding the backend.
  void abort_now(const std::string& why) {
    ncclComm_t comm = nullptr;
    abort_requested_.store(true, std::memory_order_release); // ends a submit's settle, which holds mutex_
    {
      std::lock_guard lk(mutex_);
      if (aborted_)
        return;
      aborted_ = true;
      abort_reason_ = why;
      comm = comm_;
      settling_ = comm != nullptr;
    }
    CORODIST_LOG_WARN("{} (rank {} of {}) aborted: {}", label_, rank_, size_, why);
    if (!comm)
      return;
    if (auto self = weak_from_this().lock()) {
      try {
        std::thread([self, comm] { self->settle_abort(comm); }).detach();
        return;
      } catch (const std::system_error& e) {
        CORODIST_LOG_WARN("{}: no thread for the abort ({}); aborting on this one", label_, e.what());
      }
    }
    settle_abort(comm);
  }

  // Revokes (NCCL 2.28) or aborts `comm` (comm_, marked aborted), then says so.
  void settle_abort(ncclComm_t comm) noexcept {
    cudaSetDevice(device_);
    bool revoked = false;
#if CORODIST_NCCL_REVOKE
    if (present(&ncclCommRevoke)) {
      const auto r = ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
      revoked = r == ncclSuccess || r == ncclInProgress;
      if (!revoked)
        CORODIST_LOG_WARN("{}: ncclCommRevoke failed ({}); aborting the communicator", label_, ncclGetErrorString(r));
    }
#endif
    if (!revoked)
      ncclCommAbort(comm);
    std::lock_guard lk(mutex_);
    if (revoked)
      revoked_ = true;
    else
      comm_ = nullptr;
    settling_ = false;
  }

  std::uint64_t sequence_number() const noexcept override {
    std::lock_guard lk(mutex_);
    return next_seq_;
  }

  // The poller fails what is in flight when it next looks.
  void abort(const std::string& reason) override { abort_now("aborted by the user: " + reason); }

  bool aborted() const noexcept override {
    std::lock_guard lk(mutex_);
    return aborted_;
  }

  int cuda_device() const noexcept override { return device_; }
  void* stream() const noexcept override { return stream_; }
  const nccl_options& options() const noexcept override { return opts_; }

  std::string shrink_unavailable_reason() const override {
#if CORODIST_NCCL_SHRINK
    if (!present(&ncclCommShrink))
      return fmt::format("the NCCL loaded at run time ({}) has no ncclCommShrink (NCCL 2.27 or later has it)",
                         runtime_version());
    std::lock_guard lk(mutex_);
    if (!comm_)
      return fmt::format("the communicator was aborted{} ({})",
                         CORODIST_NCCL_REVOKE ? "" : " (NCCL before 2.28 cannot revoke and keep it)", abort_reason_);
    return {};
#else
    return fmt::format("the NCCL this corodist was built with ({}) has no ncclCommShrink (NCCL 2.27 or later has it)",
                       version_text(NCCL_VERSION_CODE));
#endif
  }

  asio::awaitable<std::shared_ptr<detail::nccl_backend>> shrink(std::vector<int> excluded,
                                                                nccl_options opts) override;

  asio::awaitable<std::shared_ptr<detail::nccl_backend>> split(int color, int key, corodist::timeout timeout,
                                                               std::string name) override;

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }

  void group_destroyed() noexcept override {
    bool in_flight = false;
    {
      std::lock_guard lk(mutex_);
      in_flight = !inflight_.empty() && !aborted_;
    }
    // The poller fails them once it sees the abort; the communicator goes with the last reference.
    if (in_flight) {
      try {
        abort_now("the group was destroyed with collectives in flight");
      } catch (...) { // a log line or a string that could not be made: the destructor aborts the communicator
      }
    }
  }

private:
  asio::any_io_executor ex_;
  const int rank_;
  const int size_;
  const nccl_options opts_;
  std::string label_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* scratch_ = nullptr;

  // The user's store and this communicator's prefix in it (monitored_barrier's keys; children's prefixes).
  std::shared_ptr<store::store> base_store_;
  std::string store_prefix_;
  std::shared_ptr<store::store> store_;
  std::shared_ptr<flight_recorder> recorder_; // null: recording off
  std::string peers_;                         // "ranks 0-3", as recorded

  mutable std::mutex mutex_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t next_p2p_seq_ = 0; // point-to-point calls, numbered apart from the collectives
  std::uint64_t splits_ = 0;       // split calls so far (names a child without one)
  std::uint64_t shrinks_ = 0;      // shrink calls so far (names the shrunk group's store prefix)
  bool aborted_ = false;
  std::atomic<bool> abort_requested_{false}; // set before abort_now takes mutex_
  bool revoked_ = false;  // aborted by ncclCommRevoke: comm_ is kept for a shrink
  bool settling_ = false; // the revoke or abort of abort_now still runs on its thread
  std::string abort_reason_;
  bool polling_ = false;
  std::deque<std::shared_ptr<pending_op>> inflight_;
};

std::string unavailable_reason() {
  int n = 0;
  if (auto e = cudaGetDeviceCount(&n); e != cudaSuccess)
    return "no CUDA device: " + cuda_text(e);
  if (n == 0)
    return "no CUDA device: cudaGetDeviceCount found none";
  return {};
}

// The rendezvous: rank 0 publishes the ncclUniqueId under the group's prefix,
// every rank creates a non-blocking communicator, polled until ready or the deadline.
asio::awaitable<std::shared_ptr<detail::nccl_backend>> nccl_comm::create(asio::any_io_executor ex,
                                                                         std::shared_ptr<store::store> store,
                                                                         int rank, int size, nccl_options opts) {
  const auto what = fmt::format("nccl_group create (prefix '{}', rank {} of {})", opts.prefix, rank, size);
  if (auto why = unavailable_reason(); !why.empty())
    throw collective_error(what + ": " + why, "create", rank, 0);
  int count = 0;
  cudaGetDeviceCount(&count);
  auto st = std::make_shared<nccl_comm>(ex, rank, size, opts);
  st->device_ = opts.device >= 0 ? opts.device : rank % count;
  if (st->device_ >= count)
    throw usage_error(fmt::format("{}: CUDA device {} does not exist ({} found)", what, st->device_, count));
  st->attach_store(store, opts.prefix);
  auto group_store = st->store_;
  {
    std::random_device rd;
    const auto token = fmt::format("{:08x}{:08x}", rd(), rd());
    if (co_await group_store->compare_set("claimed/" + std::to_string(rank), "", token) != token)
      throw usage_error(what + ": the prefix is already used by another group on this store");
  }
  ncclUniqueId id{};
  if (rank == 0) {
    if (auto r = ncclGetUniqueId(&id); r != ncclSuccess)
      throw collective_error(what + ": ncclGetUniqueId: " + ncclGetErrorString(r), "create", rank, 0);
    co_await group_store->set("nccl_id", std::string(id.internal, sizeof id.internal));
  } else {
    auto bytes = co_await group_store->get("nccl_id", opts.timeout);
    if (bytes.size() != sizeof id.internal)
      throw collective_error(what + ": the published ncclUniqueId has the wrong size", "create", rank, 0);
    std::memcpy(id.internal, bytes.data(), sizeof id.internal);
  }
  cudaSetDevice(st->device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  auto r = ncclCommInitRankConfig(&st->comm_, size, id, rank, &config);
  r = co_await settle_init(*st, r, clock::now() + opts.timeout.length());
  if (r == ncclInProgress) {
    ncclCommAbort(st->comm_);
    st->comm_ = nullptr;
    throw timeout_error(fmt::format("{}: not every rank joined the NCCL communicator within {} ms", what,
                                    opts.timeout.length().count()));
  }
  if (r != ncclSuccess)
    throw collective_error(what + ": ncclCommInitRankConfig: " + ncclGetErrorString(r), "create", rank, 0);
  st->finish_setup(what, "create");
  co_return st;
}

asio::awaitable<ncclResult_t> nccl_comm::settle_init(nccl_comm& st, ncclResult_t r, clock::time_point deadline) {
  asio::steady_timer timer(st.ex_);
  auto interval = st.opts_.poll_interval;
  while (r == ncclInProgress) {
    if (clock::now() >= deadline)
      co_return ncclInProgress;
    timer.expires_after(interval);
    co_await timer.async_wait(asio::use_awaitable);
    interval = std::min(interval * 2, st.opts_.max_poll_interval);
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(st.comm_, &state);
    r = state;
  }
  co_return r;
}

void nccl_comm::finish_setup(const std::string& what, const char* op) {
  if (auto e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess)
    throw collective_error(what + ": cudaStreamCreate: " + cuda_text(e), op, rank_, 0);
  if (auto e = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming); e != cudaSuccess)
    throw collective_error(what + ": cudaEventCreate: " + cuda_text(e), op, rank_, 0);
  if (auto e = cudaMalloc(&scratch_, sizeof(std::int32_t)); e != cudaSuccess)
    throw collective_error(what + ": cudaMalloc: " + cuda_text(e), op, rank_, 0);
  cudaMemset(scratch_, 0, sizeof(std::int32_t));
}

// ncclCommShrink of this communicator, non-blocking and polled as create's
// initialisation. Every surviving rank calls it with the same `excluded`; the
// excluded ranks do not. The flag follows NCCL's guide: NCCL_SHRINK_DEFAULT
// for a healthy parent or one that a revoke has quiesced (aborted groups are
// revoked, and waited for here), NCCL_SHRINK_ABORT (stop the parent's work
// first) for a parent in error that no revoke settled.
asio::awaitable<std::shared_ptr<detail::nccl_backend>> nccl_comm::shrink(std::vector<int> excluded,
                                                                         nccl_options opts) {
  const auto what = fmt::format("nccl_group shrink ({} -> '{}', rank {} of {}, without ranks {})", label_,
                                opts.prefix, rank_, size_, ranks_text(excluded));
#if CORODIST_NCCL_SHRINK
  if (!present(&ncclCommShrink))
    throw usage_error(what + ": " + shrink_unavailable_reason());
  ncclComm_t parent = nullptr;
  bool failed = false;
  bool revoked = false;
  bool settling = false;
  std::uint64_t seq = 0;
  const auto deadline = clock::now() + opts.timeout.length();
  auto look = [&] {
    std::lock_guard lk(mutex_);
    parent = comm_;
    failed = aborted_;
    revoked = revoked_;
    settling = settling_;
    seq = next_seq_;
  };
  look();
  // An abort's revoke still running on its thread: the parent is used once it returned.
  co_await poll_until(opts, deadline, [&] { return look(), !settling; },
                      what + ": the abort of the communicator did not finish");
  if (!parent)
    throw collective_error(what + ": " + shrink_unavailable_reason(), "shrink", rank_, seq);
  const auto below = std::count_if(excluded.begin(), excluded.end(), [&](int x) { return x < rank_; });
  auto st = std::make_shared<nccl_comm>(ex_, rank_ - static_cast<int>(below),
                                        size_ - static_cast<int>(excluded.size()), opts);
  st->device_ = device_;
  ncclResult_t state = ncclSuccess;
  ncclCommGetAsyncError(parent, &state);
  if (revoked) // a revoked communicator reports ncclInProgress until it is quiescent
    co_await poll_until(opts, deadline, [&] { return ncclCommGetAsyncError(parent, &state), state != ncclInProgress; },
                        what + ": the revoked communicator did not become quiescent");
  cudaSetDevice(device_);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const bool in_error = state != ncclSuccess && state != ncclInProgress;
  const int flags = (failed && !revoked) || in_error ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
  child_slot slot;
  ncclResult_t r = ncclSuccess;
  {
    std::lock_guard lk(mutex_); // NCCL calls on the parent, one at a time (submit's)
    r = ncclCommShrink(parent, excluded.data(), static_cast<int>(excluded.size()), slot.comm, &config, flags);
  }
  if (r == ncclSuccess || r == ncclInProgress)
    r = co_await settle_child(parent, slot, true, deadline, opts);
  else
    slot.settled = true; // refused at the call: NCCL started nothing
  if (r != ncclSuccess) {
    const auto child = slot.settled ? slot.load() : nullptr;
    const std::string last = child ? ncclGetLastError(child) : ncclGetLastError(parent);
    if (child)
      ncclCommAbort(child);
    if (r == ncclInProgress)
      throw timeout_error(fmt::format("{}: not every surviving rank joined the shrink within {} ms", what,
                                      opts.timeout.length().count()));
    throw collective_error(fmt::format("{}: ncclCommShrink ({}): {} ({})", what,
                                       flags == NCCL_SHRINK_ABORT ? "NCCL_SHRINK_ABORT" : "NCCL_SHRINK_DEFAULT",
                                       ncclGetErrorString(r),
                                       last),
                           "shrink", rank_, seq);
  }
  st->comm_ = slot.load();
  {
    std::lock_guard lk(mutex_);
    st->attach_store(base_store_, fmt::format("{}/shrink{}", store_prefix_, shrinks_++));
  }
  st->finish_setup(what, "shrink");
  CORODIST_LOG_DEBUG("{}: rank {} of {} now", what, st->rank_, st->size_);
  co_return st;
#else
  throw usage_error(what + ": " + shrink_unavailable_reason());
  co_return nullptr;
#endif
}

// ncclCommSplit of this communicator, non-blocking and polled on the loop as
// create's initialisation; every rank of this group calls it. The child is a
// communicator of its own (splitShare off: its abort leaves the parent alone),
// on this rank's device, with its own stream and poll; its store keys live
// under this group's prefix, the split's name (or "split<n>") and the color.
asio::awaitable<std::shared_ptr<detail::nccl_backend>> nccl_comm::split(int color, int key, corodist::timeout timeout,
                                                                        std::string name) {
  ncclComm_t parent = nullptr;
  bool failed = false;
  std::string why;
  std::uint64_t n = 0;
  std::uint64_t seq = 0;
  {
    std::lock_guard lk(mutex_);
    parent = comm_;
    failed = aborted_;
    why = abort_reason_;
    n = splits_++;
    seq = next_seq_;
  }
  const auto child_prefix =
      fmt::format("{}/{}/{}", store_prefix_, name.empty() ? fmt::format("split{}", n) : name, color);
  const auto what = color == no_color
                        ? fmt::format("nccl_group split ({}, rank {} of {}, no color)", label_, rank_, size_)
                        : fmt::format("nccl_group split ({} -> '{}', rank {} of {}, color {}, key {})", label_,
                                      child_prefix, rank_, size_, color, key);
  if (failed || !parent)
    throw collective_error(what + ": the group was aborted: " + why, "split", rank_, seq);
  auto opts = opts_;
  opts.prefix = child_prefix;
  opts.timeout = timeout;
  opts.device = device_;
  const auto deadline = clock::now() + timeout.length();
  child_slot slot;
  ncclResult_t r = ncclSuccess;
  {
    std::lock_guard lk(mutex_); // NCCL calls on the parent, one at a time (submit's)
    cudaSetDevice(device_);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.splitShare = 0;
    r = ncclCommSplit(parent, color == no_color ? NCCL_SPLIT_NOCOLOR : color, key, slot.comm, &config);
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    slot.settled = true; // refused at the call: NCCL started nothing
    throw collective_error(fmt::format("{}: ncclCommSplit: {} ({})", what, ncclGetErrorString(r),
                                       ncclGetLastError(parent)),
                           "split", rank_, seq);
  }
  bool cancelled = true;
  struct on_cancel { // a cancelled wait leaves NCCL's split running on the parent: abort it
    nccl_comm& self;
    bool& cancelled;
    const std::string& what;
    ~on_cancel() {
      if (cancelled)
        self.abort_now(what + ": cancelled while NCCL was making the new communicator");
    }
  } guard{*this, cancelled, what};
  r = co_await settle_child(parent, slot, color != no_color, deadline, opts);
  cancelled = false;
  if (r == ncclInProgress) {
    const auto text = fmt::format("{}: not every rank of the group called split within {} ms", what,
                                  timeout.length().count());
    abort_now(text + " (the split left running on the communicator)");
    throw timeout_error(text + "; the group is aborted");
  }
  if (r != ncclSuccess) {
    if (const auto child = slot.load())
      ncclCommAbort(child);
    throw collective_error(fmt::format("{}: ncclCommSplit: {} ({})", what, ncclGetErrorString(r),
                                       ncclGetLastError(parent)),
                           "split", rank_, seq);
  }
  if (color == no_color)
    co_return nullptr;
  const ncclComm_t child = slot.load();
  int child_rank = 0;
  int child_size = 0;
  if (ncclCommUserRank(child, &child_rank) != ncclSuccess || ncclCommCount(child, &child_size) != ncclSuccess) {
    ncclCommAbort(child);
    throw collective_error(what + ": the new communicator has no rank or size", "split", rank_, seq);
  }
  auto st = std::make_shared<nccl_comm>(ex_, child_rank, child_size, opts);
  st->device_ = device_;
  st->comm_ = child;
  st->attach_store(base_store_, child_prefix);
  st->finish_setup(what, "split");
  CORODIST_LOG_DEBUG("{}: rank {} of {} now", what, st->rank_, st->size_);
  co_return st;
}

} // namespace

} // namespace corodist::collective

extern "C" const corodist::collective::detail::cuda_plugin* corodist_cuda_plugin_v1() {
  static const corodist::collective::detail::cuda_plugin plugin{
      corodist::collective::detail::cuda_plugin::abi,
      &corodist::collective::unavailable_reason,
      &corodist::collective::nccl_comm::create,
      corodist::collective::detail::plugin_runtime(),
  };
  return &plugin;
}
