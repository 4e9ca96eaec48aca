// Outgoing calls and requests of rpc::agent: from any thread to the channel of
// their peer, and the response turned into a result or an exception.
#include "rpc/agent_core.hpp"

#include <corodist/core/error.hpp>
#include <corodist/rpc/errors.hpp>

#include "rpc/error_reply.hpp"
#include "rpc/protocol.hpp"

#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/post.hpp>

namespace corodist::rpc::detail {

namespace {
// Replies at least this large are handed to their caller from the worker pool,
// where decoding them does not hold the loop.
constexpr std::size_t offload_size = 64 * 1024;

std::string text_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}
} // namespace

void agent_core::start_call(worker_ref to, std::string_view fn, payload call, corodist::deadline by,
                            reply_handler done, std::shared_ptr<outgoing_call> cancel) {
  int rank = -1;
  try {
    rank = registry_.lookup(to).rank;
  } catch (...) {
    const auto st = state_.load();
    done(st == agent_state::running
             ? std::current_exception()
             : std::make_exception_ptr(usage_error(st == agent_state::stopped
                                                       ? "rpc: agent '" + opts_.name + "' is shut down"
                                                       : "rpc: agent '" + opts_.name + "' is not started")),
         {});
    return;
  }
  const auto record =
      recorder_ ? recorder_->record({.op = "call", .detail = fn, .peer = registry_.lookup(rank).name,
                                     .bytes = call.size()})
                : 0;
  start_message(rank, kind_call, std::move(call), by, std::move(done), message_what::call(fn), record,
                std::move(cancel));
}

std::string agent_core::what_text(const message_what& what, int to) const {
  if (!what.text.empty())
    return what.text;
  return "rpc '" + what.fn + "' on worker '" + registry_.lookup(to).name + "'";
}

void agent_core::cancel_call(const std::shared_ptr<outgoing_call>& handle) {
  handle->cancelled.store(true);
  auto core = handle->core.lock();
  if (!core)
    return; // the agent is gone: its calls ended with it
  asio::dispatch(core->ex_, [core, handle] {
    if (core->channels_)
      core->channels_->cancel(*handle);
  });
}

void agent_core::start_message(int rank, message_kind kind, payload p, corodist::deadline by, reply_handler done,
                               message_what what, flight_recorder::handle record,
                               std::shared_ptr<outgoing_call> cancel) {
  // How long the deadline was, for its error (it was made at the call, a moment ago).
  const auto length = std::chrono::ceil<std::chrono::milliseconds>(by.remaining());
  try {
    const auto st = state_.load();
    if (st != agent_state::running)
      throw usage_error(what_text(what, rank) + ": agent '" + opts_.name + "' is " +
                        (st == agent_state::stopped ? "shut down" : "not started"));
    if (p.size() > opts_.max_message_size)
      throw usage_error(what_text(what, rank) + ": the message's " + std::to_string(p.size()) +
                        " bytes exceed max_message_size " + std::to_string(opts_.max_message_size));
    if (!outgoing_.try_enter())
      throw usage_error(what_text(what, rank) + ": agent '" + opts_.name + "' is shut down");
  } catch (...) {
    if (record != 0)
      recorder_->fail(record, text_of(std::current_exception()), "usage");
    done(std::current_exception(), {});
    return;
  }
  ++calls_sent_;
  asio::dispatch(ex_, [self = shared_from_this(), rank, kind, p = std::move(p), by, length, done = std::move(done),
                       what = std::move(what), record, cancel = std::move(cancel)]() mutable {
    self->channels_->request(
        rank, kind, std::move(p), by,
        [self, rank, length, what = std::move(what), done = std::move(done), record](net::response&& r) mutable {
          self->finish_message(rank, what, length, std::move(r), done, record);
        },
        record != 0 ? call_link{self->recorder_, record, std::move(cancel)} : call_link{{}, 0, std::move(cancel)});
  });
}

void agent_core::finish_message(int rank, const message_what& w, std::chrono::milliseconds length,
                                net::response&& r, reply_handler& done, flight_recorder::handle record) {
  struct {
    std::exception_ptr error;
    net::bytes payload;
  } out;
  std::string what; // (made for an error only)
  if (r.ec || r.msg.header.kind == kind_error_reply) {
    what = what_text(w, rank);
    if (r.ec == net::errc::request_timeout) // say how long the deadline was
      what += " (deadline " + std::to_string(length.count()) + " ms)";
  }
  const auto& worker = registry_.lookup(rank).name;
  const auto* lost = (r.ec == net::errc::connection_closed || r.ec == net::errc::peer_timed_out) && channels_
                         ? channels_->lost(rank)
                         : nullptr;
  if (lost) {
    out.error = std::make_exception_ptr(peer_lost_error(worker, rank, lost->reason, what));
  } else if (r.ec == asio::error::operation_aborted) {
    out.error = std::make_exception_ptr(cancelled_error(what));
  } else if (r.ec) {
    try {
      net::throw_net_error(r.ec, what);
    } catch (...) {
      out.error = std::current_exception();
    }
  } else if (r.msg.header.kind == kind_error_reply) {
    out.error = decode_failure(worker, what, std::move(r.msg.payload));
  } else {
    out.payload = std::move(r.msg.payload);
  }
  if (record != 0) {
    if (!out.error) {
      recorder_->complete(record);
    } else {
      const bool timed_out = !lost && r.ec == net::errc::request_timeout;
      recorder_->fail(record, text_of(out.error),
                      lost ? "peer_lost"
                      : timed_out ? "timeout"
                      : r.ec == asio::error::operation_aborted ? "cancelled"
                      : r.ec ? "network"
                             : "remote");
      if (timed_out) // (a file written: off the loop)
        asio::post(dispatcher_->pool_executor(), [why = what + " timed out"] { write_flight_recorder_dump(why); });
    }
  }
  const bool large = out.payload.size() >= offload_size;
  auto deliver = [self = shared_from_this(), out = std::move(out), done = std::move(done)]() mutable {
    done(std::move(out.error), std::move(out.payload));
    self->outgoing_.leave(); // after the reply: wait_idle sees the caller's continuation done
  };
  if (large)
    asio::post(dispatcher_->pool_executor(), std::move(deliver));
  else
    deliver();
}

} // namespace corodist::rpc::detail
