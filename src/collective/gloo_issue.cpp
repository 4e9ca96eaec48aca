// A gloo_group's issue queue: collectives numbered in call order, queued onto
// the communication threads in that order, run there, and completed.
#include "collective/gloo_group_impl.hpp"

#include "collective/describe.hpp"
#include "collective/sigpipe_guard.hpp"

#include <fmt/format.h>

#include <cstring>

namespace corodist::collective {

using detail::work_state;

work gloo_group::impl::submit(collective_call call) {
  std::unique_lock lk(mutex);
  const auto seq = next_seq++;
  auto op = std::make_shared<pending_op>();
  op->seq = seq;
  op->deadline = clock::now() + call.timeout;
  op->state = std::make_shared<work_state>(std::string(to_string(call.kind)), seq);
  op->call = std::move(call);
  work w(op->state);
  if (aborted) {
    auto reason = abort_reason;
    lk.unlock();
    op->state->complete(std::make_exception_ptr(error_of(*op, "the group was aborted: " + reason)));
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
    } catch (const std::exception&) {
    }
  }
  comm->post([this, op] { run(*op); }); // under the lock: queue order = sequence order
  const bool wake = op->deadline < watchdog_wakes_at;
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
  return fmt::format("timed out after {} ms ({}); the group is aborted", op.call.timeout.count(),
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
  if (clock::now() >= op.deadline) {
    const auto text = timed_out_text(op) + " before it could start";
    abort(where(op) + ": " + text);
    return finish(op, std::make_exception_ptr(timeout_of(op, text)));
  }
  if (aborted_flag.load(std::memory_order_acquire))
    return finish(op, std::make_exception_ptr(error_of(op, "the group was aborted: " + reason())));
  std::vector<std::shared_ptr<void>> gloo_objects; // released after the work completes
  detail::gloo_call_context cc{context, static_cast<std::uint32_t>(op.seq), op.deadline, opts.bucket_bytes,
                               opts.pytorch ? 0 : opts.bcube_max_bytes, &gloo_objects};
  try {
    if (checks()) {
      if (!op.inbox)
        op.inbox = detail::post_header_inbox(context, cc.tag);
      if (!op.header)
        op.header = detail::post_header_outbox(context, op.call, op.seq, cc.tag);
      auto mismatch = detail::check_call(cc, *op.inbox, *op.header);
      if (!mismatch.empty()) // every rank sees it and skips the data: the group stays usable
        return finish(op, std::make_exception_ptr(error_of(op, mismatch)));
    }
    if (op.call.kind == collective_kind::barrier && !wait_for_earlier(op))
      throw timeout_error("Timed out waiting for the collectives issued before the barrier");
    detail::run_collective(cc, op.call);
    finish(op, nullptr);
  } catch (const std::exception& e) {
    const bool was_aborted = aborted_flag.load(std::memory_order_acquire);
    const bool timed_out = clock::now() >= op.deadline || std::strstr(e.what(), "Timed out") != nullptr;
    std::exception_ptr err;
    if (timed_out) {
      const auto text = timed_out_text(op);
      abort(where(op) + ": " + text);
      err = std::make_exception_ptr(timeout_of(op, text));
    } else if (was_aborted) {
      err = std::make_exception_ptr(error_of(op, "the group was aborted: " + reason()));
    } else {
      const auto text = fmt::format("{} failed: {}; the group is aborted", detail::describe(op.call), e.what());
      abort(where(op) + ": " + text);
      err = std::make_exception_ptr(error_of(op, text));
    }
    finish(op, err);
  }
}

} // namespace corodist::collective
