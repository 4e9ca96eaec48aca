#include "rpc/dispatcher.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/timeout.hpp>
#include <corodist/rpc/errors.hpp>

#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "rpc/call_executor.hpp"
#include "rpc/call_flow.hpp"
#include "rpc/call_format.hpp"
#include "rpc/error_reply.hpp"
#include "rpc/protocol.hpp"

#include <asio/bind_cancellation_slot.hpp>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>

#include <corodist/core/little_endian.hpp>

#include <thread>

namespace corodist::rpc::detail {

namespace {
using clock = std::chrono::steady_clock;

std::exception_ptr fail_with(failure c, const std::string& what) {
  return std::make_exception_ptr(call_failure(c, what));
}

// The error reply for `e`: the dispatcher's own failures keep their code.
payload error_payload(const std::exception_ptr& e, const std::string& self) {
  try {
    std::rethrow_exception(e);
  } catch (const call_failure& f) {
    return encode_failure(f.code, f.code == failure::malformed ? "protocol_error" : "rpc", f.what());
  } catch (...) {
    return encode_exception(e, self);
  }
}

// The exception a local caller (run_local) gets for `e`.
std::exception_ptr local_exception(const std::exception_ptr& e, const std::string& worker) {
  try {
    std::rethrow_exception(e);
  } catch (const call_failure& f) {
    switch (f.code) {
    case failure::unknown_function: return std::make_exception_ptr(unknown_function_error(worker, f.what()));
    case failure::bad_arguments: return std::make_exception_ptr(bad_arguments_error(worker, f.what()));
    case failure::deadline: return std::make_exception_ptr(timeout_error(std::string("rpc: ") + f.what()));
    case failure::cancelled: return std::make_exception_ptr(cancelled_error(std::string("rpc: ") + f.what()));
    case failure::malformed: return std::make_exception_ptr(protocol_error(std::string("rpc: ") + f.what()));
    default: return std::make_exception_ptr(remote_error(worker, "rpc", f.what()));
    }
  } catch (...) {
    return e;
  }
}

// Ends entry `h` of `rec`: completed, or failed with the error's text and kind.
void end_serve_record(flight_recorder& rec, flight_recorder::handle h, const std::exception_ptr& e) {
  if (!e) {
    rec.complete(h);
    return;
  }
  try {
    std::rethrow_exception(e);
  } catch (const call_failure& f) {
    rec.fail(h, f.what(),
             f.code == failure::deadline           ? "timeout"
             : f.code == failure::unknown_function ? "unknown_function"
             : f.code == failure::bad_arguments    ? "bad_arguments"
             : f.code == failure::malformed        ? "malformed"
             : f.code == failure::cancelled        ? "cancelled"
                                                   : "error");
  } catch (const std::exception& x) {
    rec.fail(h, x.what(), "exception");
  } catch (...) {
    rec.fail(h, "unknown exception", "exception");
  }
}

std::string deadline_text(clock::time_point arrived, clock::time_point deadline) {
  return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - arrived).count()) + " ms";
}
} // namespace

dispatcher::dispatcher(dispatch_env env, std::size_t worker_threads)
    : env_(std::move(env)), pool_(std::make_unique<asio::thread_pool>(std::max<std::size_t>(worker_threads, 1))) {}

dispatcher::~dispatcher() {
  if (!pool_)
    return;
  pool_->stop();
  if (pool_->get_executor().running_in_this_thread() || corodist::detail::on_loop_thread()) {
    // Destroyed by one of its own tasks (a pool cannot join itself), or on an
    // event loop that a running plain function may be waiting for: join elsewhere.
    std::thread([pool = std::move(pool_)] { pool->join(); }).detach();
  } else {
    pool_->join();
  }
}

void dispatcher::add_function(std::string name, handler h) {
  if (!functions_.emplace(name, std::move(h)).second)
    throw usage_error("rpc: function '" + name + "' is already registered");
}

void dispatcher::set_handler(message_kind kind, std::string name, message_port::handler h) {
  // Named by the caller's name for it, never by its number.
  if (kind >= rpc_kinds_begin && kind < rpc_kinds_end)
    throw usage_error(fmt::format("rpc: set_handler('{}'): its message kind is reserved for rpc's own messages "
                                  "(rpc_kinds_begin to rpc_kinds_end)",
                                  name));
  if (auto it = handlers_.find(kind); it != handlers_.end())
    throw usage_error(
        fmt::format("rpc: set_handler('{}'): its message kind is already handled by '{}'", name, it->second.name));
  handlers_.emplace(kind, named_handler{std::move(name), std::move(h)});
}

std::string dispatcher::kind_name(message_kind kind) const {
  switch (kind) {
  case kind_call: return "rpc call";
  case kind_reply: return "rpc reply";
  case kind_error_reply: return "rpc error reply";
  case kind_identify: return "rpc identification";
  case kind_stream_open: return "rpc stream open";
  case kind_stream_items: return "rpc stream items";
  case kind_stream_end: return "rpc stream end";
  case kind_stream_error: return "rpc stream error";
  case kind_stream_credit: return "rpc stream credit";
  case kind_stream_cancel: return "rpc stream cancel";
  case kind_cancel: return "rpc cancel";
  default: break;
  }
  auto it = handlers_.find(kind);
  return it != handlers_.end() ? it->second.name : std::string("a message no layer here handles");
}

std::function<std::unique_ptr<encoder>()> dispatcher::result_encoder(int to) {
  return [port = env_.port, self = env_.self_rank, to] { return std::make_unique<encoder>(port, self, to); };
}

void dispatcher::on_message(int from, const std::string& from_name, const std::shared_ptr<net::connection>& conn,
                            net::message&& m) {
  ++received_;
  if (!serving_started_) {
    held_.push_back(held_message{from, from_name, conn, std::move(m)});
    return;
  }
  deliver(from, from_name, conn, std::move(m));
}

void dispatcher::start_serving() {
  serving_started_ = true;
  auto held = std::move(held_);
  held_.clear();
  for (auto& h : held)
    deliver(h.from, h.from_name, h.conn, std::move(h.m));
}

void dispatcher::deliver(int from, const std::string& from_name, const std::shared_ptr<net::connection>& conn,
                         net::message&& m) {
  const bool one_way = (m.header.flags & net::frame_flags::one_way) != 0;
  const auto id = m.header.request_id;
  if (m.header.kind == kind_call) {
    if (!one_way)
      serve_call(from, from_name, conn, id, std::move(m.payload), clock::now());
    return;
  }
  if (is_stream_kind(m.header.kind) && stream_handler_) {
    stream_handler_(from, from_name, conn, std::move(m));
    return;
  }
  if (m.header.kind == kind_cancel) {
    if (m.payload.size() == 8)
      cancel_served(conn.get(), corodist::load_le<std::uint64_t>(m.payload.data()));
    else
      CORODIST_LOG_WARN("rpc: malformed cancel from rank {} ({} bytes, not 8): ignored", from, m.payload.size());
    return;
  }
  auto it = handlers_.find(m.header.kind);
  if (it == handlers_.end()) {
    // The sender's layer is not enabled here (e.g. rref::enable on one worker only).
    if (!one_way) {
      auto p = encode_failure(failure::malformed, "protocol_error",
                              "worker '" + env_.worker_name +
                                  "' does not handle this request (the layer that sent it is not enabled there)");
      conn->respond(id, kind_error_reply, std::move(p.body), std::move(p.attachments));
    } else {
      CORODIST_LOG_DEBUG("rpc: worker '{}' dropped a one-way message from rank {} that no layer here handles",
                         env_.worker_name, from);
    }
    return;
  }
  responder r;
  if (!one_way) {
    std::weak_ptr<net::connection> wc = conn;
    auto loop = env_.loop;
    r = responder(
        [wc, id, loop](payload p) {
          asio::dispatch(loop, [wc, id, p = std::move(p)]() mutable {
            if (auto c = wc.lock())
              c->respond(id, kind_reply, std::move(p.body), std::move(p.attachments));
          });
        },
        [wc, id, loop, self_name = env_.worker_name](std::exception_ptr e) {
          asio::dispatch(loop, [wc, id, p = error_payload(e, self_name)]() mutable {
            if (auto c = wc.lock())
              c->respond(id, kind_error_reply, std::move(p.body), std::move(p.attachments));
          });
        });
  }
  it->second.h(inbound_message{from, m.header.kind, one_way, std::move(m.payload)}, std::move(r));
}

std::shared_ptr<peer_flow> dispatcher::flow_of(const std::shared_ptr<net::connection>& conn) {
  auto& f = flows_[conn.get()];
  if (f && f->serves(conn.get()))
    return f;
  f = std::make_shared<peer_flow>(conn, env_.max_output_per_peer);
  auto kept = f;
  if (flows_.size() >= sweep_flows_at_) { // those of closed connections, done with
    for (auto it = flows_.begin(); it != flows_.end();)
      it = it->second->idle() && !it->second->serves(it->first) ? flows_.erase(it) : std::next(it);
    sweep_flows_at_ = 2 * flows_.size() + 16;
  }
  return kept;
}

void dispatcher::cancel_served(const net::connection* conn, std::uint64_t id) {
  for (auto& rc : running_) {
    if (rc.conn == conn && rc.id == id) {
      if (!rc.state->cancelled.exchange(true))
        rc.signal.emit(asio::cancellation_type::terminal); // a coroutine function's pending operation ends
      return;
    }
  }
  CORODIST_LOG_DEBUG("rpc: a cancel for request {} that is not running here (finished, or unknown): ignored", id);
}

void dispatcher::serve_call(int from, const std::string& from_name, const std::shared_ptr<net::connection>& conn,
                            std::uint64_t id, net::bytes&& frame, clock::time_point arrived) {
  const bool serving = serving_.try_enter();
  std::shared_ptr<peer_flow> flow;
  if (serving && env_.max_output_per_peer > 0 && !stopped_)
    flow = flow_of(conn);
  // The call's entry among those running (a cancel finds it), until its reply.
  std::optional<std::list<running_call>::iterator> entry;
  if (serving) {
    entry = running_.emplace(running_.end());
    (*entry)->conn = conn.get();
    (*entry)->id = id;
    (*entry)->state = std::make_shared<call_state>();
  }
  // Replies leave from the loop, whichever thread produced them.
  auto reply = [self = shared_from_this(), loop = env_.loop, conn = std::weak_ptr<net::connection>(conn), id,
                max = env_.max_message_size, flow, entry](payload&& p, std::exception_ptr e) mutable {
    if (!e && p.size() > max)
      e = std::make_exception_ptr(usage_error("the result's " + std::to_string(p.size()) +
                                              " bytes exceed max_message_size " + std::to_string(max)));
    const std::size_t n = e ? 0 : p.size();
    if (flow)
      flow->encoded(n); // held for the peer from now until queued on its connection
    asio::dispatch(loop, [self = std::move(self), conn, id, p = std::move(p), e, flow = std::move(flow), n,
                          entry]() mutable {
      bool cancelled = false; // (then the caller has dropped the call: nothing to send)
      if (entry) {
        cancelled = (*entry)->state->cancelled.load();
        if ((*entry)->record != 0 && self->env_.recorder)
          end_serve_record(*self->env_.recorder, (*entry)->record, e);
        self->running_.erase(*entry);
      }
      const auto& self_name = self->env_.worker_name;
      if (auto c = conn.lock(); !cancelled && c && c->is_open()) { // (else the caller is gone: it sees connection_error)
        if (e) {
          auto ep = error_payload(e, self_name);
          c->respond(id, kind_error_reply, std::move(ep.body), std::move(ep.attachments));
        } else if (auto ec = c->respond(id, kind_reply, std::move(p.body), std::move(p.attachments));
                   ec && c->is_open()) {
          auto ep =
              encode_failure(failure::exception, "corodist::usage_error", "cannot send the result: " + ec.message());
          c->respond(id, kind_error_reply, std::move(ep.body), std::move(ep.attachments));
        }
      }
      p = {};
      if (flow)
        flow->finished(n);
    });
  };
  if (!serving) {
    reply({}, fail_with(failure::exception, "worker '" + env_.worker_name + "' is shutting down"));
    return;
  }
  auto start = [this, self = shared_from_this(), from, id,
                from_name = from_name.empty() && env_.name_of ? env_.name_of(from) : from_name, frame = std::move(frame),
                arrived, flow, reply = std::move(reply), rc = &**entry]() mutable {
    reply_fn done = [this, self, reply = std::move(reply)](payload&& p, std::exception_ptr e) mutable {
      reply(std::move(p), std::move(e));
      serving_.leave();
    };
    if (flow && flow->closed()) { // waited for its peer's output, which will not drain now
      done({}, fail_with(failure::exception, "not started: the caller's connection closed"));
      return;
    }
    start_call(from, std::move(from_name), id, std::move(frame), arrived, std::move(done), flow, rc);
  };
  if (!flow || flow->admit_now()) {
    start(); // (no function object made for a call that starts at once)
    return;
  }
  flow->submit(std::move(start));
}

void dispatcher::start_call(int from, std::string from_name, std::uint64_t id, net::bytes&& frame,
                            clock::time_point arrived, reply_fn reply, std::shared_ptr<peer_flow> flow,
                            running_call* rc) {
  // Parse, find the function, check the deadline, decode the arguments: on the
  // loop for small messages, on the pool for large ones (no single message may
  // hold the loop for long).
  auto bind = [this, self = shared_from_this(), from, from_name = std::move(from_name), id, arrived,
               flow = std::move(flow), rc, state = rc->state](net::bytes&& frame, reply_fn& reply) mutable -> bool {
    std::string name;
    try {
      codec_context ctx;
      if (env_.port)
        env_.port->decode_context(from, ctx);
      const auto size = frame.size();
      auto p = parse_payload(std::move(frame), ctx);
      const auto call = view_call(p.body.get());
      name.assign(call.name);
      if (call.metadata && call.metadata_bytes <= max_metadata_bytes)
        state->metadata = read_metadata(call);
      if (env_.recorder) { // ended with the reply, whatever ends the call
        std::string traced; // the caller's trace id, on the timeline
        for (const auto& [k, v] : state->metadata)
          if (k == "trace-id" && traced.empty())
            traced = name + " trace-id=" + v;
        rc->record = env_.recorder->record({.seq = id, .op = "serve",
                                            .detail = traced.empty() ? std::string_view(name) : traced,
                                            .peer = from_name, .bytes = size,
                                            .flow = call_flow(from, env_.self_rank, id)}); // ended with the reply
      }
      if (call.metadata_bytes > max_metadata_bytes)
        throw call_failure(failure::malformed, "the call of '" + name + "' has " +
                                                   std::to_string(call.metadata_bytes) +
                                                   " bytes of metadata, over the limit of " +
                                                   std::to_string(max_metadata_bytes));
      const auto deadline = corodist::deadline::from_wire(call.timeout_ms, arrived);
      state->deadline = deadline;
      auto it = functions_.find(name);
      if (it == functions_.end())
        throw call_failure(failure::unknown_function,
                           "no function '" + name + "' is registered on worker '" + env_.worker_name + "'");
      if (deadline.expired())
        throw call_failure(failure::deadline, "'" + name + "' was not started: its caller's deadline (" +
                                                  deadline_text(arrived, deadline.at()) + ") had passed");
      call_context cc(from, std::move(from_name), deadline, state);
      bound_call b;
      {
        codec_scope scope(ctx);
        try {
          b = it->second(*call.args, cc, result_encoder(from));
        } catch (const std::exception& e) {
          throw call_failure(failure::bad_arguments, "function '" + name + "': " + e.what());
        }
      }
      run_bound(std::move(name), std::move(b), std::move(cc), std::move(reply), std::move(flow), std::move(state), rc);
    } catch (const call_failure& f) {
      if (f.code == failure::malformed)
        CORODIST_LOG_WARN("rpc: malformed call from rank {}: {}", from, f.what());
      reply({}, std::current_exception());
    } catch (const protocol_error& e) {
      CORODIST_LOG_WARN("rpc: malformed call from rank {}: {}", from, e.what());
      reply({}, fail_with(failure::malformed, e.what()));
    } catch (...) {
      reply({}, std::current_exception());
    }
    return true;
  };
  if (frame.size() >= env_.offload_size && !stopped_) {
    asio::post(*pool_, [bind = std::move(bind), frame = std::move(frame), reply = std::move(reply)]() mutable {
      bind(std::move(frame), reply);
    });
    return;
  }
  bind(std::move(frame), reply);
}

void dispatcher::run_bound(std::string fn, bound_call b, call_context ctx, reply_fn reply,
                           std::shared_ptr<peer_flow> flow, std::shared_ptr<call_state> state, running_call* rc) {
  if (b.plain) {
    if (stopped_ || !pool_) {
      reply({}, fail_with(failure::exception, "worker '" + env_.worker_name + "' is shutting down"));
      return;
    }
    asio::post(*pool_, [this, self = shared_from_this(), fn = std::move(fn), work = std::move(b.plain),
                        ctx = std::move(ctx), reply = std::move(reply), flow = std::move(flow),
                        state = std::move(state), rc]() mutable {
      if (flow && !stopped_ && !flow->may_run()) {
        // Admitted before its peer's reply size was known, and its output
        // would now pass the cap: it waits again, unstarted, on the loop.
        asio::post(env_.loop, [this, self, fn = std::move(fn), work = std::move(work), ctx = std::move(ctx),
                               reply = std::move(reply), flow, state = std::move(state), rc]() mutable {
          flow->requeue([this, self, fn = std::move(fn), work = std::move(work), ctx = std::move(ctx),
                         reply = std::move(reply), flow, state = std::move(state), rc]() mutable {
            bound_call again;
            again.plain = std::move(work);
            run_bound(std::move(fn), std::move(again), std::move(ctx), std::move(reply), std::move(flow),
                      std::move(state), rc);
          });
        });
        return;
      }
      if (flow && flow->closed()) {
        work = {};
        reply({}, fail_with(failure::exception, "'" + fn + "' was not started: its caller's connection closed"));
        return;
      }
      if (stopped_) {
        work = {};
        reply({}, fail_with(failure::exception, "worker '" + env_.worker_name + "' is shutting down"));
        return;
      }
      if (state->cancelled.load()) {
        work = {};
        reply({}, fail_with(failure::cancelled, "'" + fn + "' was not started: its caller cancelled it"));
        return;
      }
      if (ctx.expired()) { // waited in the pool's queue past its caller's deadline
        work = {};
        reply({}, fail_with(failure::deadline, "'" + fn + "' was not started: its caller's deadline had passed"));
        return;
      }
      payload out;
      std::exception_ptr err;
      {
        current_call_scope serving(state.get()); // (calls it makes keep within its deadline)
        try {
          out = work();
        } catch (...) {
          err = std::current_exception();
        }
      }
      work = {}; // the function's arguments go here, off the loop
      if (state->cancelled.load()) { // its result is dropped by the caller
        out = {};
        err = fail_with(failure::cancelled, "'" + fn + "' was cancelled by its caller");
      }
      reply(std::move(out), std::move(err));
    });
    return;
  }
  // A coroutine function: on the loop, cancelled at its caller's deadline, at
  // its caller's cancel or when the agent stops.
  auto run = [this, self = shared_from_this(), fn = std::move(fn), coro = std::move(b.coro), ctx = std::move(ctx),
              reply = std::move(reply), state = std::move(state), rc]() mutable {
    if (stopped_) {
      reply({}, fail_with(failure::exception, "worker '" + env_.worker_name + "' is shutting down"));
      return;
    }
    if (state->cancelled.load()) {
      reply({}, fail_with(failure::cancelled, "'" + fn + "' was not started: its caller cancelled it"));
      return;
    }
    std::optional<std::list<running_call>::iterator> own; // a local call's entry
    if (!rc) {
      own = running_.emplace(running_.end());
      (*own)->state = state;
      rc = &**own;
    }
    if (!ctx.deadline().is_never()) { // cancelled there by the deadline timer
      rc->deadline = ctx.deadline().at();
      watch_deadline(*rc);
    }
    auto done = asio::bind_cancellation_slot(
        rc->signal.slot(),
        [this, self, own, state, rc, fn = std::move(fn), reply = std::move(reply)](std::exception_ptr e, payload p) mutable {
          const bool late = rc->deadline_hit; // (rc goes with the reply)
          if (own)
            running_.erase(*own);
          // Cancelled, whatever the function made of its cancellation.
          if (state->cancelled.load()) { // (the caller has dropped it)
            p = {};
            e = fail_with(failure::cancelled, "cancelled by its caller");
          } else if (late) {
            p = {};
            e = fail_with(failure::deadline, "'" + fn + "' was cancelled at its caller's deadline");
          }
          reply(std::move(p), std::move(e));
        });
    // Its executor makes the served call current around each resumption.
    if (const auto* io = env_.loop.target<asio::io_context::executor_type>())
      asio::co_spawn(call_executor<asio::io_context::executor_type>(*io, state), std::move(coro), std::move(done));
    else
      asio::co_spawn(call_executor<asio::any_io_executor>(env_.loop, state), std::move(coro), std::move(done));
  };
  asio::dispatch(env_.loop, std::move(run));
}

future<payload> dispatcher::run_local(std::string_view fn, const msgpack::object& args,
                                      std::shared_ptr<const void> keep, call_context ctx) {
  promise<payload> p;
  auto f = p.get_future();
  auto reply = [p = std::move(p), keep, worker = env_.worker_name](payload&& out, std::exception_ptr e) mutable {
    keep.reset();
    if (e)
      p.set_exception(local_exception(e, worker));
    else
      p.set_value(std::move(out));
  };
  try {
    auto it = functions_.find(std::string(fn));
    if (it == functions_.end())
      throw call_failure(failure::unknown_function,
                         "no function '" + std::string(fn) + "' is registered on worker '" + env_.worker_name + "'");
    if (!serving_.try_enter())
      throw call_failure(failure::exception, "worker '" + env_.worker_name + "' is shutting down");
    auto state = std::make_shared<call_state>();
    state->deadline = ctx.deadline();
    state->metadata = ctx.metadata();
    ctx = call_context(ctx.caller_rank(), ctx.caller(), ctx.deadline(), state);
    bound_call b;
    try {
      b = it->second(args, ctx, result_encoder(ctx.caller_rank()));
    } catch (const std::exception& e) {
      serving_.leave();
      throw call_failure(failure::bad_arguments, "function '" + std::string(fn) + "': " + e.what());
    }
    run_bound(std::string(fn), std::move(b), std::move(ctx),
              [this, self = shared_from_this(), reply = std::move(reply)](payload&& out, std::exception_ptr e) mutable {
                reply(std::move(out), std::move(e));
                serving_.leave();
              },
              nullptr, std::move(state), nullptr);
  } catch (...) {
    reply({}, std::current_exception());
  }
  return f;
}

void dispatcher::watch_deadline(running_call& rc) {
  if (rc.deadline >= deadline_armed_)
    return; // the timer comes first
  if (!deadline_timer_)
    deadline_timer_ = std::make_unique<asio::steady_timer>(env_.loop);
  deadline_armed_ = rc.deadline;
  deadline_timer_->expires_at(rc.deadline); // (a wait for a later one ends aborted)
  deadline_timer_->async_wait([w = weak_from_this()](std::error_code ec) {
    if (ec)
      return; // set again, or stopped
    if (auto self = w.lock())
      self->on_deadline_timer();
  });
}

void dispatcher::on_deadline_timer() {
  deadline_armed_ = clock::time_point::max();
  if (stopped_)
    return;
  const auto now = clock::now();
  running_call* next = nullptr;
  for (auto& rc : running_) {
    if (rc.deadline == clock::time_point::max() || rc.deadline_hit)
      continue; // not a watched deadline, or already cancelled
    if (rc.deadline <= now) {
      rc.deadline_hit = true;
      rc.signal.emit(asio::cancellation_type::terminal); // its pending operation ends
    } else if (!next || rc.deadline < next->deadline) {
      next = &rc;
    }
  }
  if (next)
    watch_deadline(*next);
}

void dispatcher::stop() {
  stopped_ = true;
  if (deadline_timer_)
    deadline_timer_->cancel();
  auto flows = std::move(flows_); // the calls waiting for their peer's output answer "shutting down" now
  flows_.clear();
  for (auto& [raw, f] : flows)
    f->release_all();
  for (auto& rc : running_)
    rc.signal.emit(asio::cancellation_type::terminal); // (a plain function's: nothing bound, nothing happens)
}

void dispatcher::join_pool() {
  // Queued jobs hold this dispatcher: they must run (each answers "shutting
  // down" at once), not be left in a stopped pool that this dispatcher owns.
  stopped_ = true;
  if (pool_)
    pool_->join();
}

} // namespace corodist::rpc::detail
