// A gloo_group's issue queue: collectives numbered in call order, queued onto
// the communication threads in that order, run there, and completed.
#include "collective/gloo/gloo_group_impl.hpp"

#include "collective/describe.hpp"
#include "collective/record_call.hpp"
#include "collective/gloo/sigpipe_guard.hpp"

#include <fmt/format.h>

#include <cstring>

namespace corodist::collective {

using detail::work_state;

work gloo_group::impl::submit(collective_call call) {
  if (opts.pytorch && (call.kind == collective_kind::all_to_all || call.kind == collective_kind::monitored_barrier))
    throw usage_error(fmt::format("{}: not available in a group joined to a PyTorch job (PyTorch 1.13's gloo has "
                                  "no matching call{})",
                                  to_string(call.kind),
                                  call.kind == collective_kind::all_to_all ? "; use all_to_all_single" : ""));
  if (is_point_to_point(call.kind))
    return submit_p2p(std::move(call));
  // CUDA buffers: copied to pinned host memory on the group's stream, after the caller's.
  auto staged = detail::cuda_staging::stage(call, staging);
  std::unique_lock lk(mutex);
  abort_if_lost_while_idle(lk);
  const auto seq = next_seq++;
  auto op = std::make_shared<pending_op>();
  op->seq = seq;
  op->deadline = call.by.at();
  if (call.kind == collective_kind::monitored_barrier && call.timeout.is_finite())
    // Arrival is bounded by call.by; rank 0's verdict travels after that
    // (and a rank that arrived early waits for it): the work ends by this.
    op->deadline += std::chrono::duration_cast<clock::duration>(call.timeout.length());
  op->state = std::make_shared<work_state>(std::string(to_string(call.kind)), seq);
  detail::record_call(*op->state, recorder, call, seq, peers);
  op->call = std::move(call);
  op->staging = std::move(staged);
  op->probe_after = opts.mismatch_probe_delay;
  op->warn_after = opts.mismatch_probe_delay;
  work w(op->state);
  if (aborted) {
    lk.unlock();
    op->state->complete(aborted_error(*op));
    return w;
  }
  inflight.emplace(seq, op);
  if (checks() && op->call.kind != collective_kind::monitored_barrier) {
    // Under the lock, so that every header is posted before a later
    // collective's data; a failure here (a closed connection) shows again in run().
    try {
      detail::sigpipe_guard no_sigpipe; // Gloo may write to a dead peer from this (the caller's) thread
      op->inbox = detail::post_header_inbox(context, static_cast<std::uint32_t>(seq));
      op->header = detail::post_header_outbox(context, op->call, seq, static_cast<std::uint32_t>(seq),
                                              opts.compare_call_sites);
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
  return fmt::format("timed out after {} ms ({})", op.call.timeout.length().count(), detail::describe(op.call));
}

std::string gloo_group::impl::absent_text(const pending_op& op) {
  if (!probe)
    return {};
  const auto seen = probe->waiting_in(size, absent_limit);
  if (!seen)
    return "; the ranks waiting could not be read from the store in time";
  std::string text;
  int named = 0, more = 0;
  for (int r = 0; r < size; ++r) {
    const auto& in = (*seen)[static_cast<std::size_t>(r)];
    if (r == rank || (in && *in >= op.seq))
      continue;
    if (++named > 8) {
      ++more;
      continue;
    }
    text += fmt::format("; rank {} is not in {} #{} ({})", r, to_string(op.call.kind), op.seq,
                        in ? fmt::format("last seen waiting in #{}", *in) : std::string("never seen waiting"));
  }
  if (more > 0)
    text += fmt::format("; {} more ranks are not in it", more);
  return text;
}

std::pair<std::string, std::string> gloo_group::impl::timeout_texts(pending_op& op) {
  std::call_once(op.timeout_once, [&] {
    op.timeout_text = timed_out_text(op) + absent_text(op) + "; the group is aborted";
    op.timeout_reason = where(op) + ": " + op.timeout_text;
    if (const auto path = write_flight_recorder_dump(op.timeout_reason); !path.empty())
      op.timeout_reason += " (flight recorders dumped to " + path + ")";
  });
  return {op.timeout_text, op.timeout_reason};
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
    auto [text, reason] = timeout_texts(op);
    abort(reason);
    return finish(op, std::make_exception_ptr(timeout_of(op, text + " (it timed out before it could start)")));
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
  detail::gloo_call gc{context,           tag, op.deadline, opts.bucket_bytes, opts.pytorch ? 0 : opts.bcube_max_bytes,
                       &gloo_objects,     opts.pytorch.has_value()};
  try {
    if (op.call.kind == collective_kind::monitored_barrier)
      return run_monitored_barrier(op, gc);
    if (checks()) {
      const auto header_tag = static_cast<std::uint32_t>(op.seq); // the same on every rank, whatever the call
      if (!op.inbox)
        op.inbox = detail::post_header_inbox(context, header_tag);
      if (!op.header)
        op.header = detail::post_header_outbox(context, op.call, op.seq, header_tag, opts.compare_call_sites);
      auto mismatch = detail::check_call(gc, *op.inbox, *op.header);
      if (mismatch.empty() && detail::per_peer(op.call))
        mismatch = detail::check_pairwise(gc, op.call, header_tag);
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

void gloo_group::impl::run_monitored_barrier(pending_op& op, const detail::gloo_call& gc) {
  std::vector<int> missing;
  try {
    missing = detail::monitored_barrier(gc, op.call.by.at());
  } catch (const std::exception& e) {
    if (rank != 0 && (clock::now() >= op.deadline || std::strstr(e.what(), "Timed out") != nullptr)) {
      const auto text = fmt::format("rank 0, which monitors the barrier, did not answer within {} ms; the group is "
                                    "aborted",
                                    2 * op.call.timeout.length().count());
      abort(where(op) + ": " + text);
      return finish(op, std::make_exception_ptr(timeout_of(op, text)));
    }
    return failed(op, e.what());
  }
  if (missing.empty())
    return finish(op, nullptr);
  const auto text = fmt::format("rank{} {} did not reach monitored_barrier within {} ms (of {} ranks, {} arrived); "
                                "the group is aborted",
                                missing.size() == 1 ? "" : "s", fmt::join(missing, ", "),
                                op.call.timeout.length().count(), size, size - static_cast<int>(missing.size()));
  abort(where(op) + ": " + text);
  finish(op, std::make_exception_ptr(timeout_of(op, text)));
}

void gloo_group::impl::failed(pending_op& op, const char* what) {
  const bool was_aborted = aborted_flag.load(std::memory_order_acquire);
  const bool timed_out = clock::now() >= op.deadline || std::strstr(what, "Timed out") != nullptr;
  std::exception_ptr err;
  if (timed_out) {
    auto [text, reason] = timeout_texts(op);
    abort(reason);
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
