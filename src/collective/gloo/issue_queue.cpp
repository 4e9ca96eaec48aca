// A gloo_group's issue queue: collectives numbered in call order, queued onto
// the communication threads in that order, run there, and completed.
#include "collective/gloo/gloo_group_impl.hpp"

#include "collective/describe.hpp"
#include "collective/gloo/sigpipe_guard.hpp"

#include <fmt/format.h>

#include <cstring>

namespace corodist::collective {

using detail::work_state;

work gloo_group::impl::submit(collective_call call) {
  // CUDA buffers: copied to pinned host memory on the group's stream, after the caller's.
  auto staged = detail::cuda_staging::stage(call, staging);
  std::unique_lock lk(mutex);
  if (idle_lost >= 0 && !aborted) { // a rank was lost while the group was idle: abort now
    const int lost = idle_lost;
    const auto why = idle_lost_why;
    lk.unlock();
    rank_lost(lost, why);
    lk.lock();
  }
  const auto seq = next_seq++;
  auto op = std::make_shared<pending_op>();
  op->seq = seq;
  op->deadline = call.by.at();
  op->state = std::make_shared<work_state>(std::string(to_string(call.kind)), seq);
  op->call = std::move(call);
  op->staging = std::move(staged);
  op->probe_after = opts.mismatch_probe_delay;
  work w(op->state);
  if (aborted) {
    lk.unlock();
    op->state->complete(aborted_error(*op));
    return w;
  }
  inflight.emplace(seq, op);
  if (checks()) {
    // Under the lock, so that every header is posted before a later
    // collective's data; a failure here (a closed connection) shows again in run().
    try {
      detail::sigpipe_guard no_sigpipe; // Gloo may write to a dead peer from this (the caller's) thread
      op->inbox = detail::post_header_inbox(context, static_cast<std::uint32_t>(seq));
      op->header = detail::post_header_outbox(context, op->call, seq, static_cast<std::uint32_t>(seq));
    } catch (...) { // nothing of Gloo's leaves the caller's thread
    }
  }
  comm->post([this, op] { run(*op); }); // under the lock: queue order = sequence order
  const bool wake = op->deadline < watchdog_wakes_at || watchdog_parked;
  watchdog_parked = false;
  lk.unlock();
  if (wake)
    watchdog_cv.notify_one();
  return w;
}

std::string gloo_group::impl::where(const pending_op& op) const {
  return detail::where(op.call, op.seq, rank, size, label);
}

collective_error gloo_group::impl::error_of(const pending_op& op, const std::string& what) const {
  return detail::error_at({op.call, op.seq, rank, size, label}, what);
}

collective_timeout_error gloo_group::impl::timeout_of(const pending_op& op, const std::string& what) const {
  return detail::timeout_at({op.call, op.seq, rank, size, label}, what);
}

std::string gloo_group::impl::timed_out_text(const pending_op& op) const {
  return fmt::format("timed out after {} ms ({}); the group is aborted", op.call.timeout.length().count(),
                     detail::describe(op.call));
}

void gloo_group::impl::finish(const pending_op& op, std::exception_ptr e) {
  op.state->complete(std::move(e)); // first: a barrier waiting on `inflight` then sees it completed
  {
    std::lock_guard lk(mutex);
    inflight.erase(op.seq);
  }
  finished_cv.notify_all();
}

bool gloo_group::impl::wait_for_earlier(const pending_op& op) {
  std::unique_lock lk(mutex);
  return finished_cv.wait_until(lk, op.deadline, [&] {
    return aborted || inflight.empty() || inflight.begin()->first >= op.seq;
  });
}

void gloo_group::impl::run(pending_op& op) {
  op.state->mark_started();
  op.started.store(clock::now().time_since_epoch().count(), std::memory_order_release);
  if (clock::now() >= op.deadline) {
    const auto text = timed_out_text(op) + " before it could start";
    abort(where(op) + ": " + text);
    return finish(op, std::make_exception_ptr(timeout_of(op, text)));
  }
  if (aborted_flag.load(std::memory_order_acquire))
    return finish(op, aborted_error(op));
  std::vector<std::shared_ptr<void>> gloo_objects; // released after the work completes
  // The data's tag carries a digest of the call (call_header.hpp): ranks whose
  // calls differ exchange no data. PyTorch's ranks count 0, 1, 2, ...
  const auto tag = opts.pytorch ? static_cast<std::uint32_t>(op.seq)
                                : detail::data_tag(op.seq, detail::tag_digest(detail::record_of(
                                                               op.call, op.seq, rank, opts.bcube_max_bytes,
                                                               opts.bucket_bytes)));
  detail::gloo_call gc{context, tag, op.deadline, opts.bucket_bytes, opts.pytorch ? 0 : opts.bcube_max_bytes,
                       &gloo_objects};
  try {
    if (checks()) {
      const auto header_tag = static_cast<std::uint32_t>(op.seq); // the same on every rank, whatever the call
      if (!op.inbox)
        op.inbox = detail::post_header_inbox(context, header_tag);
      if (!op.header)
        op.header = detail::post_header_outbox(context, op.call, op.seq, header_tag);
      auto mismatch = detail::check_call(gc, *op.inbox, *op.header);
      if (!mismatch.empty()) // every rank sees it and skips the data: the group stays usable
        return finish(op, std::make_exception_ptr(error_of(op, mismatch)));
    }
    if (op.call.kind == collective_kind::barrier && !wait_for_earlier(op))
      throw timeout_error("Timed out waiting for the collectives issued before the barrier");
    if (op.staging)
      op.staging->before(op.deadline);
    detail::run_collective(gc, op.call);
    if (op.staging)
      op.staging->after(op.deadline);
    finish(op, nullptr);
  } catch (const std::exception& e) {
    failed(op, e.what());
  } catch (...) { // Gloo throws std::exceptions; nothing may leave a communication thread
    failed(op, "an exception of an unknown type");
  }
}

void gloo_group::impl::failed(pending_op& op, const char* what) {
  const bool was_aborted = aborted_flag.load(std::memory_order_acquire);
  const bool timed_out = clock::now() >= op.deadline || std::strstr(what, "Timed out") != nullptr;
  std::exception_ptr err;
  if (timed_out) {
    const auto text = timed_out_text(op);
    abort(where(op) + ": " + text);
    err = std::make_exception_ptr(timeout_of(op, text));
  } else if (was_aborted) {
    std::string mismatch;
    {
      std::lock_guard lk(mutex);
      mismatch = op.mismatch;
    }
    err = mismatch.empty() ? aborted_error(op)
                           : std::make_exception_ptr(error_of(op, mismatch + "; the group is aborted"));
  } else if (auto lost = lost_peer(what)) {
    // A rank's process died (its member key is gone): name it, not the
    // survivor whose abort may have ended this connection first.
    rank_lost(lost->first, lost->second);
    err = aborted_error(op);
  } else {
    // A peer ended the connections. If it found that the ranks' calls of this
    // collective differ, it left the difference in the store.
    std::string text;
    if (probe)
      if (auto found = probe->found_by_peer(op.seq, found_by_peer_limit))
        text = *found + "; the group is aborted";
    if (text.empty())
      text = fmt::format("{} failed: {}; the group is aborted", detail::describe(op.call), what);
    abort(where(op) + ": " + text);
    err = std::make_exception_ptr(error_of(op, text));
  }
  finish(op, err);
}

} // namespace corodist::collective
