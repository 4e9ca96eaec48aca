// A gloo_group's sends and receives: posted to Gloo as unbound buffers when
// issued (so that exchanges listed in any order on each rank progress), then
// waited for, in issue order, on the group's point-to-point thread, which
// completes their works. Their slots: PyTorch's ranks use the tag alone; ours
// add a digest of the dtype and element count, so that a send and a receive
// that differ never exchange data (a receive smaller than the data would end
// the process on Gloo's event-loop thread): they fail at the deadline.
#include "collective/gloo/gloo_group_impl.hpp"

#include "collective/describe.hpp"
#include "collective/record_call.hpp"
#include "collective/gloo/algorithms.hpp"
#include "collective/gloo/call_header.hpp"
#include "collective/gloo/sigpipe_guard.hpp"

#include <gloo/types.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace corodist::collective {

using detail::work_state;

namespace {

// The Gloo slot of a send or receive.
std::uint64_t p2p_slot(const p2p_op& o, bool pytorch) {
  if (pytorch)
    return o.tag; // ProcessGroupGloo::send/recv: the tag is the slot
  detail::fnv1a h;
  h.mix(static_cast<std::uint64_t>(o.tensor.type()));
  h.mix(o.tensor.count());
  return static_cast<std::uint64_t>(gloo::Slot::build(detail::p2p_slot_prefix, o.tag)) | h.low24();
}

std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point t) {
  return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(t - std::chrono::steady_clock::now()),
                  std::chrono::milliseconds(1));
}

} // namespace

work gloo_group::impl::submit_p2p(collective_call call) {
  // CUDA buffers: staged as a collective's (the staging reads `tensors`);
  // a send's copy to the host is waited for here, before it is posted.
  for (const auto& o : call.p2p)
    call.tensors.push_back(o.tensor);
  auto staged = detail::cuda_staging::stage(call, staging);
  for (std::size_t i = 0; i < call.p2p.size(); ++i)
    call.p2p[i].tensor = call.tensors[i];
  call.tensors.clear();
  if (staged)
    staged->before(call.by.at());
  std::unique_lock lk(mutex);
  abort_if_lost_while_idle(lk);
  auto op = std::make_shared<pending_op>();
  op->seq = next_p2p++;
  op->deadline = call.by.at();
  op->state = std::make_shared<work_state>(std::string(to_string(call.kind)), op->seq);
  detail::record_call(*op->state, recorder, call, op->seq, {});
  op->call = std::move(call);
  op->staging = std::move(staged);
  work w(op->state);
  if (aborted) {
    lk.unlock();
    op->state->complete(aborted_error(*op));
    return w;
  }
  if (!p2p_waiter) {
    worker_thread_options wo;
    wo.name = "corodist-p2p";
    p2p_waiter = std::make_unique<worker_thread>(wo);
  }
  p2p_queue.emplace(op->seq, op);
  std::string failure;
  std::size_t entry = 0;
  try {
    detail::sigpipe_guard no_sigpipe; // Gloo may write to a dead peer from this (the caller's) thread
    for (; entry < op->call.p2p.size(); ++entry) {
      const auto& o = op->call.p2p[entry];
      const bool pytorch = opts.pytorch.has_value();
      op->p2p_buffers.push_back(context->createUnboundBuffer(o.tensor.data(), o.tensor.bytes()));
      auto& b = *op->p2p_buffers.back();
      if (o.dir == p2p_op::direction::send) {
        b.send(o.peer, p2p_slot(o, pytorch));
      } else if (o.peer == any_source) {
        std::vector<int> from;
        for (int r = 0; r < size; ++r)
          if (r != rank)
            from.push_back(r);
        b.recv(from, p2p_slot(o, pytorch));
      } else {
        b.recv(o.peer, p2p_slot(o, pytorch));
      }
    }
  } catch (const std::exception& e) { // a closed connection: nothing of Gloo's leaves the caller's thread
    failure = e.what();
  }
  if (!failure.empty()) {
    lk.unlock();
    p2p_failed(*op, entry, failure.c_str());
    return w;
  }
  // Sends that Gloo wrote out within the call complete here, unless an
  // earlier call is still pending (works complete in issue order): the
  // point-to-point thread's round trip would add two thread wake-ups.
  bool sent = !op->staging;
  for (const auto& [seq, other] : p2p_queue)
    sent = sent && (other == op || other->state->completed());
  for (std::size_t i = 0; sent && i < op->p2p_buffers.size(); ++i)
    sent = op->call.p2p[i].dir == p2p_op::direction::send && detail::send_completed(*op->p2p_buffers[i]);
  if (sent) {
    op->state->complete(nullptr); // nothing awaits it yet: resumes no one
    p2p_queue.erase(op->seq);
    return w;
  }
  p2p_waiter->post([this, op] { wait_p2p(*op); }); // under the lock: queue order = issue order
  return w;
}

void gloo_group::impl::wait_p2p(pending_op& op) {
  op.state->mark_started();
  auto limit = op.deadline; // also bounded by a later call's earlier deadline
  {
    std::lock_guard lk(mutex);
    for (const auto& [seq, other] : p2p_queue)
      limit = std::min(limit, other->deadline);
  }
  std::size_t entry = 0;
  try {
    for (; entry < op.p2p_buffers.size(); ++entry) {
      const auto& o = op.call.p2p[entry];
      auto& b = *op.p2p_buffers[entry];
      int source = o.peer;
      const bool done = o.dir == p2p_op::direction::send ? b.waitSend(left_until(limit))
                                                         : b.waitRecv(&source, left_until(limit));
      if (!done)
        throw std::runtime_error("the wait was aborted");
      if (op.call.kind == collective_kind::recv)
        op.state->set_source(source);
    }
    entry = 0;
    if (op.staging)
      op.staging->after(op.deadline);
    finish_p2p(op, nullptr);
  } catch (const std::exception& e) {
    p2p_failed(op, entry, e.what());
  } catch (...) { // nothing may leave the point-to-point thread
    p2p_failed(op, entry, "an exception of an unknown type");
  }
}

std::string gloo_group::impl::p2p_timeout_text(const pending_op& op, std::size_t entry) const {
  const auto& o = op.call.p2p.at(std::min(entry, op.call.p2p.size() - 1));
  const auto ms = op.call.timeout.length().count();
  std::string text;
  if (o.dir == p2p_op::direction::send)
    text = fmt::format("rank {} posted no matching recv({} x {} from rank {}, tag {}) within {} ms", o.peer,
                       to_string(o.tensor.type()), o.tensor.count(), rank, o.tag, ms);
  else if (o.peer == any_source)
    text = fmt::format("no rank sent a matching send({} x {} to rank {}, tag {}) within {} ms",
                       to_string(o.tensor.type()), o.tensor.count(), rank, o.tag, ms);
  else
    text = fmt::format("rank {} posted no matching send({} x {} to rank {}, tag {}) within {} ms", o.peer,
                       to_string(o.tensor.type()), o.tensor.count(), rank, o.tag, ms);
  if (!opts.pytorch)
    text += " (a send and a receive match only with the same tag, dtype and element count)";
  return text + "; the group is aborted";
}

void gloo_group::impl::p2p_failed(pending_op& op, std::size_t entry, const char* what) {
  const bool was_aborted = aborted_flag.load(std::memory_order_acquire);
  std::exception_ptr err;
  if (clock::now() >= op.deadline || (!was_aborted && std::strstr(what, "Timed out") != nullptr)) {
    if (clock::now() < op.deadline) {
      // A later call's earlier deadline ended the wait: that call timed out;
      // this one fails with the abort.
      std::shared_ptr<pending_op> expired;
      {
        std::lock_guard lk(mutex);
        for (const auto& [seq, other] : p2p_queue)
          if (!expired || other->deadline < expired->deadline)
            expired = other;
      }
      abort(where(*expired) + ": " + p2p_timeout_text(*expired, 0));
      err = aborted_error(op);
    } else {
      const auto text = p2p_timeout_text(op, entry);
      abort(where(op) + ": " + text);
      err = std::make_exception_ptr(timeout_of(op, text));
    }
  } else if (was_aborted) {
    err = aborted_error(op);
  } else if (auto lost = lost_peer(what)) {
    rank_lost(lost->first, lost->second);
    err = aborted_error(op);
  } else {
    const auto text = fmt::format("{} failed: {}; the group is aborted", detail::describe(op.call), what);
    abort(where(op) + ": " + text);
    err = std::make_exception_ptr(error_of(op, text));
  }
  finish_p2p(op, err);
}

void gloo_group::impl::finish_p2p(const pending_op& op, std::exception_ptr e) {
  op.state->complete(std::move(e));
  std::lock_guard lk(mutex);
  p2p_queue.erase(op.seq);
}

} // namespace corodist::collective
