// An NCCL communicator, the heart of libcorodist-cuda (the plugin that holds
// the CUDA and NCCL calls): rendezvous through the store, collectives on the
// group's stream, completion and deadlines polled on an Asio timer.
#include <corodist/collective/errors.hpp>
#include <corodist/core/error.hpp>
#include <corodist/store/prefix_store.hpp>

#include "collective/cuda/cuda_plugin.hpp"
#include "collective/describe.hpp"
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

struct pending_op {
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
  // ncclInProgress for the call just made; bounded by `deadline`.
  ncclResult_t settle(ncclResult_t r, clock::time_point deadline) {
    while (r == ncclInProgress) {
      if (clock::now() >= deadline)
        return ncclInProgress;
      std::this_thread::yield();
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      r = state;
    }
    return r;
  }

  void enqueue(const collective_call& call, clock::time_point deadline) {
    auto check = [&](ncclResult_t r, const char* what) {
      r = settle(r, deadline);
      if (r != ncclSuccess)
        throw collective_error(fmt::format("{}: {} failed: {} ({})", label_, what, ncclGetErrorString(r),
                                           ncclGetLastError(comm_)),
                               std::string(to_string(call.kind)), rank_, next_seq_ - 1);
    };
    const auto& t = call.tensors;
    check(ncclGroupStart(), "ncclGroupStart");
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
    default:
      throw usage_error(fmt::format("{}: {} is not implemented on NCCL yet", label_, to_string(call.kind)));
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }

  work submit(collective_call call) override {
    for (const auto& t : call.tensors)
      if (t.where() != device::cuda(device_))
        throw usage_error(fmt::format("{}: the nccl group of rank {} takes buffers on cuda:{}, not {}",
                                      to_string(call.kind), rank_, device_, t.where().to_string()));
    std::unique_lock lk(mutex_);
    auto op = std::make_shared<pending_op>();
    op->seq = next_seq_++;
    op->deadline = call.by.at();
    op->state = std::make_shared<work_state>(std::string(to_string(call.kind)), op->seq);
    op->call = std::move(call);
    work w(op->state);
    if (aborted_) {
      auto why = abort_reason_;
      lk.unlock();
      op->state->complete(std::make_exception_ptr(error_of(*op, "the group was aborted: " + why)));
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
      enqueue(op->call, op->deadline);
      if (auto e = cudaEventCreateWithFlags(&op->done, cudaEventDisableTiming); e != cudaSuccess)
        throw error_of(*op, "cudaEventCreate: " + cuda_text(e));
      if (auto e = cudaEventRecord(op->done, stream_); e != cudaSuccess)
        throw error_of(*op, "cudaEventRecord: " + cuda_text(e));
    } catch (const std::exception& e) {
      const std::string why = e.what();
      lk.unlock();
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
        self->fail_all(self->where(*front) + fmt::format(": timed out after {} ms ({}); the group is aborted",
                                                         front->call.timeout.length().count(), detail::describe(front->call)),
                       true);
        continue;
      }
      timer.expires_after(interval);
      co_await timer.async_wait(asio::use_awaitable);
      interval = std::min(interval * 2, self->opts_.max_poll_interval);
    }
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

  mutable std::mutex mutex_;
  std::uint64_t next_seq_ = 0;
  bool aborted_ = false;
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
  auto group_store = std::make_shared<store::prefix_store>(opts.prefix, store);
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
  auto r = ncclCommShrink(parent, excluded.data(), static_cast<int>(excluded.size()), &st->comm_, &config, flags);
  r = co_await settle_init(*st, r, deadline);
  if (r != ncclSuccess) {
    const std::string last = st->comm_ ? ncclGetLastError(st->comm_) : ncclGetLastError(parent);
    if (st->comm_)
      ncclCommAbort(st->comm_);
    st->comm_ = nullptr;
    if (r == ncclInProgress)
      throw timeout_error(fmt::format("{}: not every surviving rank joined the shrink within {} ms", what,
                                      opts.timeout.length().count()));
    throw collective_error(fmt::format("{}: ncclCommShrink ({}): {} ({})", what,
                                       flags == NCCL_SHRINK_ABORT ? "NCCL_SHRINK_ABORT" : "NCCL_SHRINK_DEFAULT",
                                       ncclGetErrorString(r),
                                       last),
                           "shrink", rank_, seq);
  }
  st->finish_setup(what, "shrink");
  CORODIST_LOG_DEBUG("{}: rank {} of {} now", what, st->rank_, st->size_);
  co_return st;
#else
  throw usage_error(what + ": " + shrink_unavailable_reason());
  co_return nullptr;
#endif
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
