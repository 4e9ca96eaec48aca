// One worker's side of the RRef protocol: the references it owns and uses,
// their forks and confirmations, remote() and to_here(), and draining at shutdown.
#include "rref/reference_tracker.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/core/run_on.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"

#include <asio/bind_executor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>

namespace corodist::rref::detail {

namespace {
constexpr std::int32_t created_here = -2; // user_entry::parent of the UserRRef remote() made

// A received frame payload flattened back from an encoded one (local fetches).
net::bytes flatten(rpc::payload&& p) {
  net::bytes b = std::move(p.body);
  for (auto& a : p.attachments) {
    const auto* d = static_cast<const std::byte*>(a.data.data());
    b.insert(b.end(), d, d + a.data.size());
  }
  return b;
}
// The owner's record of a failed function: a remote_error naming this worker and
// the exception's type (a remote_error from further away keeps its own).
std::exception_ptr as_remote_error(const std::exception_ptr& e, const std::string& worker) {
  try {
    std::rethrow_exception(e);
  } catch (const remote_error&) {
    return e;
  } catch (const std::exception& x) {
    return std::make_exception_ptr(remote_error(worker, rpc::demangle(typeid(x).name()), x.what()));
  } catch (...) {
    return std::make_exception_ptr(remote_error(worker, "unknown", "a non-standard exception"));
  }
}
} // namespace

std::atomic<bool> break_g2_for_tests{false};

namespace {
// A promise posted to the tracker's loop that fails with usage_error(`why`) if
// the work carrying it is dropped unrun (the tracker went first: its agent was
// destroyed), instead of breaking.
template <typename T>
class failed_if_dropped {
public:
  failed_if_dropped(promise<T> p, std::string why) : p_(std::move(p)), why_(std::move(why)) {}
  failed_if_dropped(failed_if_dropped&& o) noexcept : p_(std::move(o.p_)), why_(std::move(o.why_)) { o.why_.clear(); }
  failed_if_dropped& operator=(failed_if_dropped&&) = delete;
  ~failed_if_dropped() {
    if (!why_.empty())
      p_.set_exception(std::make_exception_ptr(usage_error(why_)));
  }
  /// The promise, now answered by its taker.
  promise<T> take() {
    why_.clear();
    return std::move(p_);
  }

private:
  promise<T> p_;
  std::string why_;
};

std::string context_gone(const std::string& what) {
  return what + ": this worker's RRef context is gone (its agent was destroyed)";
}
} // namespace

// A to_here() on the owner, waiting for the value until its deadline.
struct reference_tracker::local_fetch {
  promise<net::bytes> p;
  clock::time_point deadline;
  std::chrono::milliseconds timeout;
};

// The rarely used parts of an OwnerRRef, out of the common entry.
struct reference_tracker::owner_extra {
  std::vector<std::pair<rpc::responder, int>> waiting;   // fetches before the value
  std::vector<local_fetch> waiting_here;                  // fetches on the owner itself
  std::vector<promise<std::shared_ptr<value_slot>>> waiting_slots; // local_value() calls
  std::exception_ptr failure;                             // its function threw
};

reference_tracker::reference_tracker(rpc::message_port& port, rpc::agent* agent, enable_options opts,
                                     std::function<clock::time_point()> now)
    : port_(port), port_life_(port.lifetime()), port_tracked_(!port_life_.expired()), agent_(agent), opts_(opts),
      now_(std::move(now)), ex_(port.get_executor()),
      channel_([&port](int to, rpc::payload p) { port.notify(to, kind_control, std::move(p)); }, opts) {
  if (!now_) { // the real clock: retries on a timer of the loop
    now_ = [] { return clock::now(); };
    retry_timer_ = std::make_unique<asio::steady_timer>(ex_);
    fetch_timer_ = std::make_unique<asio::steady_timer>(ex_);
    registration_.emplace(ex_, [this](bool final) {
      for (auto* t : {&retry_timer_, &fetch_timer_}) {
        if (*t)
          (*t)->cancel();
        if (final)
          t->reset(); // destroyed while the timer service is alive
      }
    });
  }
}

reference_tracker::~reference_tracker() {
  // Waits on the owner that never got their value: they fail, not break.
  for (auto& [id, e] : owners_) {
    if (!e.extra)
      continue;
    for (auto& f : e.extra->waiting_here)
      f.p.set_exception(std::make_exception_ptr(usage_error(context_gone("to_here of RRef R" + id.str()))));
    for (auto& p : e.extra->waiting_slots)
      p.set_exception(std::make_exception_ptr(usage_error(context_gone("local_value of RRef R" + id.str()))));
  }
}

void reference_tracker::arm_retry() {
  if (!retry_timer_ || retry_armed_ || channel_.unacked() == 0)
    return;
  retry_armed_ = true;
  retry_timer_->expires_after(opts_.first_retry);
  retry_timer_->async_wait([w = weak_from_this()](std::error_code ec) {
    auto self = w.lock();
    if (!self)
      return;
    self->retry_armed_ = false;
    if (ec)
      return;
    self->pump();
  });
}

void reference_tracker::install() {
  auto w = weak_from_this();
  port_.set_handler(kind_remote, "rref: remote() call", [w](rpc::inbound_message&& m, rpc::responder&& r) {
    if (auto self = w.lock())
      self->on_remote(std::move(m), std::move(r));
  });
  port_.set_handler(kind_fetch, "rref: to_here() request", [w](rpc::inbound_message&& m, rpc::responder&& r) {
    if (auto self = w.lock())
      self->on_fetch(std::move(m), std::move(r));
  });
  port_.set_handler(kind_control, "rref: control message", [w](rpc::inbound_message&& m, rpc::responder&&) {
    if (auto self = w.lock())
      self->on_control(m);
  });
}

std::shared_ptr<const void> reference_tracker::hold_port(std::string_view op) const {
  if (!port_tracked_)
    return nullptr;
  auto p = port_life_.lock();
  if (!p)
    throw usage_error(std::string(op) + ": this worker's agent is gone");
  return p;
}

void reference_tracker::post(corodist::unique_function<void(reference_tracker&)> f) {
  // Weak: a change posted after the agent (and this context) went is dropped.
  asio::post(ex_, [w = weak_from_this(), f = std::move(f)]() mutable {
    if (auto self = w.lock()) {
      f(*self);
      self->wake_drain();
    }
  });
}

void reference_tracker::send_control(int to, const control_msg& m) {
  CORODIST_LOG_TRACE("rref: worker {} -> {}: {} R{} F{} parent {}", self(), to, name(m.type), m.id.str(),
                     m.fork.str(), m.parent);
  channel_.send(to, m, now_());
  arm_retry();
}

std::string reference_tracker::describe(const handle& h) const {
  std::string owner;
  try {
    owner = "'" + port_.worker(h.owner()).name + "'";
  } catch (const std::exception&) { // (not expected: handles exist once the agent runs)
    owner = "rank " + std::to_string(h.owner());
  }
  return "RRef R" + h.id().str() + " owned by " + owner;
}

// ---- creating RRefs (any thread) ----------------------------------------------

std::shared_ptr<handle> reference_tracker::new_remote(int owner) {
  const rref_id id = next_id();
  if (owner == self()) { // remote() to ourselves: the handle is the owner's own
    auto h = std::make_shared<handle>(weak_from_this(), id, fork_id{}, owner, true);
    h->set_confirmed();
    post([id](reference_tracker& self) {
      CORODIST_LOG_TRACE("rref: worker {}: remote() to itself, R{}", self.self(), id.str());
      ++self.owner_of(id).local_refs;
    });
    return h;
  }
  const fork_id f = next_id();
  auto h = std::make_shared<handle>(weak_from_this(), id, f, owner, false);
  post([id, f, owner, wh = std::weak_ptr<handle>(h)](reference_tracker& self) {
    self.users_[f] = user_entry{id, owner, created_here, 0, false, true, wh};
  });
  return h;
}

void reference_tracker::send_remote(const std::shared_ptr<handle>& h, std::string_view fn, rpc::payload call,
                                    corodist::deadline by) {
  // The owner acknowledges the creator's fork at once (it runs the function after).
  auto what = "remote '" + std::string(fn) + "' on '" + port_.worker(h->owner()).name + "' (RRef R" + h->id().str() + ")";
  port_.request(h->owner(), kind_remote, std::move(call), by, what)
      .async_get(asio::bind_executor(ex_, [w = weak_from_this(), f = h->fork(), what](std::exception_ptr e, net::bytes) {
        if (auto self = w.lock())
          self->creation_acked(f, what, e);
      }));
}

std::shared_ptr<handle> reference_tracker::new_owned(std::shared_ptr<value_slot> v) {
  const rref_id id = next_id();
  auto h = std::make_shared<handle>(weak_from_this(), id, fork_id{}, self(), true);
  h->set_confirmed();
  post([id, v = std::move(v)](reference_tracker& self) mutable {
    auto& e = self.owner_of(id);
    ++e.local_refs;
    e.value = std::move(v);
  });
  return h;
}

void reference_tracker::creation_acked(fork_id f, const std::string& what, std::exception_ptr failure) {
  if (failure) { // (every use of the RRef fails on its own, saying why)
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      CORODIST_LOG_DEBUG("rref: worker {}: {}", self(), e.what());
    } catch (...) {
      CORODIST_LOG_DEBUG("rref: worker {}: {} failed", self(), what);
    }
  }
  auto it = users_.find(f);
  if (it == users_.end())
    return;
  if (failure) { // the owner never got it, or is gone: nothing to tell it later
    users_.erase(it);
    wake_drain();
    return;
  }
  it->second.confirmed = true;
  if (auto h = it->second.h.lock())
    h->set_confirmed();
  maybe_delete_user(f);
  wake_drain();
}

// ---- forks (any thread; from the codec) -----------------------------------------

fork_info reference_tracker::fork_to(const std::shared_ptr<handle>& h, int peer) {
  const fork_id child = next_id();
  const rref_id id = h->id();
  if (h->is_owner()) {
    // The owner is the parent: it records the fork itself, before it is sent.
    post([id, child, peer](reference_tracker& self) {
      CORODIST_LOG_TRACE("rref: worker {}: the owner forks R{} as F{} for worker {}", self.self(), id.str(),
                         child.str(), peer);
      self.owner_of(id).forks.push_back(child);
    });
    return fork_info{id, self(), child, self()};
  }
  // A user is the parent: it holds its own UserRRef until the child is confirmed (G2).
  if (!break_g2_for_tests.load(std::memory_order_relaxed))
    post([id, child, parent_fork = h->fork()](reference_tracker& self) {
      CORODIST_LOG_TRACE("rref: worker {}: forks R{} F{} as F{}", self.self(), id.str(), parent_fork.str(),
                         child.str());
      self.children_[child] = pending_child{id, parent_fork};
      if (auto it = self.users_.find(parent_fork); it != self.users_.end())
        ++it->second.pending_children;
    });
  (void)peer;
  return fork_info{id, h->owner(), child, self()};
}

std::shared_ptr<handle> reference_tracker::adopt(const fork_info& f, int from) {
  const int me = self();
  if (f.owner == me) {
    // Back on the owner: a local reference; the owner accepts the child directly.
    auto h = std::make_shared<handle>(weak_from_this(), f.id, fork_id{}, me, true);
    h->set_confirmed();
    post([f, me](reference_tracker& self) {
      CORODIST_LOG_TRACE("rref: worker {}: R{} F{} came back to its owner (from worker {})", me, f.id.str(),
                         f.fork.str(), f.parent);
      auto& e = self.owner_of(f.id);
      ++e.local_refs;
      if (f.parent == me)
        std::erase(e.forks, f.fork); // our own fork came back: it is this local reference now
      else
        self.send_control(f.parent, control_msg{control::child_accept, f.id, f.fork, -1});
    });
    return h;
  }
  auto h = std::make_shared<handle>(weak_from_this(), f.id, f.fork, f.owner, false);
  const bool confirmed = f.parent == f.owner; // the owner itself sent it: it knows this fork
  if (confirmed)
    h->set_confirmed();
  post([f, confirmed, wh = std::weak_ptr<handle>(h)](reference_tracker& self) {
    CORODIST_LOG_TRACE("rref: worker {}: takes R{} F{} from worker {}{}", self.self(), f.id.str(), f.fork.str(),
                       f.parent, confirmed ? " (confirmed: the owner sent it)" : "");
    self.users_[f.fork] = user_entry{f.id, f.owner, f.parent, 0, confirmed, true, wh};
    if (!confirmed)
      self.send_control(f.owner, control_msg{control::fork_request, f.id, f.fork, f.parent});
  });
  (void)from;
  return h;
}

// ---- using them -------------------------------------------------------------------

future<net::bytes> reference_tracker::fetch(const std::shared_ptr<handle>& h, corodist::deadline by) {
  const rref_id id = h->id();
  if (!h->is_owner()) {
    rpc::encoder e;
    auto& pk = e.packer();
    pk.pack_array(2);
    pk.pack(id.worker);
    pk.pack(id.local);
    return port_.request(h->owner(), kind_fetch, e.finish(), by, "to_here of " + describe(*h));
  }
  // On the owner: the value here, once there (at most until the deadline).
  promise<net::bytes> p;
  auto f = p.get_future();
  // The time left, kept on this tracker's clock (a simulated one in tests).
  const auto timeout = std::chrono::ceil<std::chrono::milliseconds>(
      std::min<clock::duration>(by.remaining(), std::chrono::hours(24 * 365)));
  failed_if_dropped<net::bytes> answer(std::move(p), context_gone("to_here of RRef R" + id.str()));
  post([id, answer = std::move(answer), timeout](reference_tracker& self) mutable {
    auto p = answer.take();
    auto it = self.owners_.find(id);
    if (it == self.owners_.end()) { // (a handle keeps its entry: not expected)
      p.set_exception(std::make_exception_ptr(
          usage_error("to_here of RRef R" + id.str() + " on its owner '" + self.port_.self().name +
                      "': the RRef is not held here")));
      return;
    }
    auto& e = it->second;
    if (e.extra && e.extra->failure) {
      p.set_exception(e.extra->failure);
    } else if (e.value) {
      try {
        p.set_value(flatten(e.value->encode_for(&self.port_, self.self(), self.self())));
      } catch (...) {
        p.set_exception(std::current_exception());
      }
    } else {
      if (!e.extra)
        e.extra = std::make_unique<owner_extra>();
      const auto deadline = self.now_() + timeout;
      e.extra->waiting_here.push_back(local_fetch{std::move(p), deadline, timeout});
      self.arm_fetch_timer(deadline);
    }
  });
  return f;
}

std::shared_ptr<value_slot> reference_tracker::local_slot(const handle& h) {
  if (!h.is_owner())
    throw usage_error("local_value of " + describe(h) + ": this is worker '" + port_.self().name +
                      "', not its owner; use to_here()");
  if (corodist::detail::on_loop_thread()) // (cannot block) the value if it is there, inline when on our loop
    return run_on(ex_, [w = weak_from_this(), id = h.id()]() -> std::shared_ptr<value_slot> {
             auto self = w.lock();
             if (!self)
               throw usage_error("local_value of RRef R" + id.str() + ": this worker's RRef context is gone "
                                 "(its agent was destroyed)");
             auto it = self->owners_.find(id);
             if (it != self->owners_.end() && it->second.extra && it->second.extra->failure)
               std::rethrow_exception(it->second.extra->failure);
             if (it == self->owners_.end() || !it->second.value)
               throw usage_error("local_value of RRef R" + id.str() + " on its owner '" + self->port_.self().name +
                                 "': called on an event-loop thread before its function finished (it would block "
                                 "the loop); co_await to_here().async_get()");
             return it->second.value;
           })
        .get();
  // The value, once its function has finished (as PyTorch's OwnerRRef::getValue).
  promise<std::shared_ptr<value_slot>> p;
  auto f = p.get_future();
  failed_if_dropped<std::shared_ptr<value_slot>> answer(std::move(p),
                                                       context_gone("local_value of RRef R" + h.id().str()));
  post([id = h.id(), answer = std::move(answer)](reference_tracker& self) mutable {
    auto p = answer.take();
    auto it = self.owners_.find(id);
    if (it == self.owners_.end()) {
      p.set_exception(std::make_exception_ptr(usage_error("local_value of RRef R" + id.str() + " on its owner '" +
                                                          self.port_.self().name + "': the RRef is not held here")));
      return;
    }
    auto& e = it->second;
    if (e.extra && e.extra->failure)
      p.set_exception(e.extra->failure);
    else if (e.value)
      p.set_value(e.value);
    else {
      if (!e.extra)
        e.extra = std::make_unique<owner_extra>();
      e.extra->waiting_slots.push_back(std::move(p));
    }
  });
  const auto limit = default_timeout();
  if (limit.is_never())
    f.wait();
  else if (!f.wait_for(limit.length()))
    throw timeout_error("local_value of RRef R" + h.id().str() + " on its owner '" + port_.self().name +
                        "': its function did not finish within " + limit.str());
  return f.get();
}

void reference_tracker::released(const handle& h) noexcept {
  try {
    post([id = h.id(), f = h.fork(), owner = h.is_owner()](reference_tracker& self) {
      CORODIST_LOG_TRACE("rref: worker {}: a handle of R{} F{} is gone", self.self(), id.str(), f.str());
      if (owner) {
        auto it = self.owners_.find(id);
        if (it != self.owners_.end() && it->second.local_refs > 0) {
          --it->second.local_refs;
          self.maybe_delete_owner(id);
        }
        return;
      }
      auto it = self.users_.find(f);
      if (it == self.users_.end())
        return;
      it->second.handle_alive = false;
      self.maybe_delete_user(f);
    });
  } catch (...) {
  }
}

// ---- the owner's side -----------------------------------------------------------

reference_tracker::owner_entry& reference_tracker::owner_of(rref_id id) {
  auto [it, fresh] = owners_.try_emplace(id);
  if (fresh)
    CORODIST_LOG_TRACE("rref: worker {}: OwnerRRef R{} recorded", self(), id.str());
  return it->second;
}

void reference_tracker::on_remote(rpc::inbound_message&& m, rpc::responder&& r) {
  rpc::codec_context ctx;
  port_.decode_context(m.from, ctx);
  std::shared_ptr<rpc::parsed_payload> parsed;
  rref_id id;
  fork_id creator;
  std::string fn;
  const msgpack::object* args = nullptr;
  std::uint64_t timeout_ms = 0;
  try {
    parsed = std::make_shared<rpc::parsed_payload>(rpc::parse_payload(std::move(m.payload), ctx));
    const auto& o = parsed->body.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 7)
      throw protocol_error("rref: a remote() call is [R, F, fn, [args], timeout_ms]");
    const auto* a = o.via.array.ptr;
    id = {a[0].as<std::int32_t>(), a[1].as<std::uint64_t>()};
    creator = {a[2].as<std::int32_t>(), a[3].as<std::uint64_t>()};
    fn = a[4].as<std::string>();
    args = &a[5];
    timeout_ms = a[6].as<std::uint64_t>();
  } catch (...) {
    r.fail(std::current_exception());
    return;
  }
  CORODIST_LOG_TRACE("rref: worker {} <- {}: remote() R{} F{} '{}'", self(), m.from, id.str(), creator.str(), fn);
  auto& e = owner_of(id);
  if (creator && std::find(e.forks.begin(), e.forks.end(), creator) == e.forks.end())
    e.forks.push_back(creator); // the creator's UserRRef: known from now on
  r.reply(rpc::payload{});      // ... which the creator may now let go of (G2)
  rpc::call_context cc(m.from, "", corodist::deadline::from_wire(timeout_ms));
  future<rpc::payload> result;
  {
    rpc::codec_scope scope(ctx); // arguments (rrefs among them) decode as sent by the creator
    result = port_.run_local(fn, *args, parsed, cc);
  }
  result.async_get(asio::bind_executor(ex_, [w = weak_from_this(), id](std::exception_ptr e, rpc::payload v) {
    auto self = w.lock();
    if (!self)
      return;
    if (e) // every later use rethrows it, here and elsewhere, as the owner's remote_error
      self->remote_done(id, nullptr, as_remote_error(e, self->port_.self().name));
    else
      self->remote_done(id, std::make_shared<value_slot>(std::move(v)), nullptr);
  }));
}

void reference_tracker::remote_done(rref_id id, std::shared_ptr<value_slot> value, std::exception_ptr failure) {
  auto it = owners_.find(id);
  if (it == owners_.end())
    return; // nobody refers to it any more: the value goes
  auto& e = it->second;
  if (failure) {
    if (!e.extra)
      e.extra = std::make_unique<owner_extra>();
    e.extra->failure = failure;
  } else {
    e.value = std::move(value);
  }
  if (e.extra) {
    auto waiting = std::move(e.extra->waiting);
    auto here = std::move(e.extra->waiting_here);
    auto slots = std::move(e.extra->waiting_slots);
    e.extra->waiting.clear();
    e.extra->waiting_here.clear();
    e.extra->waiting_slots.clear();
    for (auto& p : slots) {
      if (e.extra->failure)
        p.set_exception(e.extra->failure);
      else
        p.set_value(e.value);
    }
    for (auto& [r, to] : waiting)
      answer(e, std::move(r), to);
    for (auto& [p, deadline, timeout] : here) {
      if (e.extra->failure) {
        p.set_exception(e.extra->failure);
      } else {
        try {
          p.set_value(flatten(e.value->encode_for(&port_, self(), self())));
        } catch (...) {
          p.set_exception(std::current_exception());
        }
      }
    }
    if (!e.extra->failure)
      e.extra.reset();
  }
  maybe_delete_owner(id);
}

void reference_tracker::answer(owner_entry& e, rpc::responder&& r, int to) {
  if (e.extra && e.extra->failure) {
    r.fail(e.extra->failure);
    return;
  }
  try {
    r.reply(e.value->encode_for(&port_, self(), to));
  } catch (...) {
    r.fail(std::current_exception());
  }
}

void reference_tracker::on_fetch(rpc::inbound_message&& m, rpc::responder&& r) {
  rref_id id;
  try {
    rpc::codec_context ctx;
    auto parsed = rpc::parse_payload(std::move(m.payload), ctx);
    const auto& o = parsed.body.get();
    if (o.type != msgpack::type::ARRAY || o.via.array.size != 2)
      throw protocol_error("rref: a fetch is [R]");
    id = {o.via.array.ptr[0].as<std::int32_t>(), o.via.array.ptr[1].as<std::uint64_t>()};
  } catch (...) {
    r.fail(std::current_exception());
    return;
  }
  CORODIST_LOG_TRACE("rref: worker {} <- {}: to_here R{}", self(), m.from, id.str());
  auto& e = owner_of(id); // a fetch may come before remote()'s call: it waits
  if (e.value || (e.extra && e.extra->failure)) {
    answer(e, std::move(r), m.from);
    return;
  }
  if (!e.extra)
    e.extra = std::make_unique<owner_extra>();
  e.extra->waiting.emplace_back(std::move(r), m.from);
}

void reference_tracker::maybe_delete_owner(rref_id id) {
  auto it = owners_.find(id);
  if (it == owners_.end())
    return;
  auto& e = it->second;
  if (e.local_refs > 0 || !e.forks.empty())
    return;
  if (e.extra && (!e.extra->waiting.empty() || !e.extra->waiting_here.empty()))
    return;
  CORODIST_LOG_TRACE("rref: worker {} deletes OwnerRRef R{}", self(), id.str());
  owners_.erase(it);
}

// ---- the users' side ---------------------------------------------------------------

void reference_tracker::maybe_delete_user(fork_id f) {
  auto it = users_.find(f);
  if (it == users_.end())
    return;
  auto& u = it->second;
  if (u.handle_alive || !u.confirmed || u.pending_children > 0)
    return;
  send_control(u.owner, control_msg{control::user_delete, u.id, f, -1}); // G1
  users_.erase(it);
}

// ---- control messages ------------------------------------------------------------

void reference_tracker::on_control(const rpc::inbound_message& m) {
  try {
    auto [seq, msg] = decode_control(net::bytes(m.payload));
    if (auto fresh = channel_.receive(m.from, seq, msg))
      process(m.from, *fresh);
  } catch (const std::exception& e) {
    CORODIST_LOG_WARN("rref: bad control message from worker {}: {}", m.from, e.what());
  }
  wake_drain();
}

void reference_tracker::process(int from, const control_msg& m) {
  CORODIST_LOG_TRACE("rref: worker {} <- {}: {} R{} F{} parent {}", self(), from, name(m.type), m.id.str(),
                     m.fork.str(), m.parent);
  switch (m.type) {
  case control::fork_request: { // at the owner: record the child's fork, confirm it
    auto& e = owner_of(m.id);
    if (std::find(e.forks.begin(), e.forks.end(), m.fork) == e.forks.end())
      e.forks.push_back(m.fork);
    send_control(from, control_msg{control::fork_confirm, m.id, m.fork, -1});
    break;
  }
  case control::fork_confirm: { // at the child: confirmed; tell the parent (unless the owner was it)
    auto it = users_.find(m.fork);
    if (it == users_.end())
      break;
    auto& u = it->second;
    if (!u.confirmed) {
      u.confirmed = true;
      if (auto h = u.h.lock())
        h->set_confirmed();
      if (u.parent >= 0 && u.parent != u.owner)
        send_control(u.parent, control_msg{control::child_accept, m.id, m.fork, -1});
    }
    maybe_delete_user(m.fork);
    break;
  }
  case control::child_accept: { // at the parent: the child is known; our hold goes
    auto it = children_.find(m.fork);
    if (it == children_.end())
      break;
    const auto parent_fork = it->second.parent_fork;
    children_.erase(it);
    if (auto u = users_.find(parent_fork); u != users_.end() && u->second.pending_children > 0) {
      --u->second.pending_children;
      maybe_delete_user(parent_fork);
    }
    break;
  }
  case control::user_delete: { // at the owner: one UserRRef fewer
    auto it = owners_.find(m.id);
    if (it == owners_.end())
      break;
    std::erase(it->second.forks, m.fork);
    maybe_delete_owner(m.id);
    break;
  }
  case control::ack:
    break;
  }
}

void reference_tracker::pump() {
  channel_.pump(now_());
  arm_retry();
}

// ---- introspection and shutdown --------------------------------------------------------

debug_info reference_tracker::info() const {
  debug_info d;
  d.owners = owners_.size();
  for (auto& [id, e] : owners_)
    d.forks += e.forks.size();
  for (auto& [f, u] : users_)
    (u.confirmed ? d.users : d.pending_users) += 1;
  d.pending_children = children_.size();
  d.unacked = channel_.unacked();
  return d;
}

std::vector<std::string> reference_tracker::alive() const {
  std::vector<std::string> out;
  for (auto& [id, e] : owners_)
    out.push_back("OwnerRRef R" + id.str() + " (" + std::to_string(e.forks.size()) + " forks, " +
                  std::to_string(e.local_refs) + " local references)");
  for (auto& [f, u] : users_)
    out.push_back("UserRRef R" + u.id.str() + " F" + f.str() + (u.confirmed ? "" : " (unconfirmed)") +
                  (u.pending_children ? " (" + std::to_string(u.pending_children) + " pending children)" : ""));
  return out;
}

bool reference_tracker::holds_value(rref_id id) const {
  auto it = owners_.find(id);
  return it != owners_.end() && it->second.value != nullptr;
}

bool reference_tracker::settled() const noexcept {
  if (!users_.empty() || !children_.empty() || channel_.unacked() != 0)
    return false;
  return std::all_of(owners_.begin(), owners_.end(), [](auto& o) { return o.second.forks.empty(); });
}

bool reference_tracker::empty() const noexcept { return settled() && owners_.empty(); }

void reference_tracker::wake_drain() {
  if (drain_wait_ && settled())
    drain_wait_->cancel();
}

asio::awaitable<bool> reference_tracker::drain(corodist::deadline by) {
  const auto started = clock::now();
  // Every UserRRef goes, live handles or not (the application's handles of it
  // fail afterwards); so does every OwnerRRef that nothing refers to any more.
  std::vector<fork_id> users;
  for (auto& [f, u] : users_) {
    u.handle_alive = false;
    users.push_back(f);
  }
  for (auto f : users)
    maybe_delete_user(f);
  std::vector<rref_id> owners;
  for (auto& [id, e] : owners_)
    owners.push_back(id);
  for (auto id : owners)
    maybe_delete_owner(id);
  // Then wait for the others' deletes, the confirmations our pending children
  // and users need, and our messages' acknowledgements (each wakes this wait;
  // retries go out on the retry timer meanwhile).
  asio::steady_timer t(co_await asio::this_coro::executor);
  while (!settled() && !by.expired()) {
    t.expires_at(by.at());
    drain_wait_ = &t;
    co_await t.async_wait(corodist::detail::use_tuple);
    drain_wait_ = nullptr;
  }
  if (settled())
    co_return true;
  std::vector<std::string> left;
  for (auto& [id, e] : owners_)
    if (!e.forks.empty())
      left.push_back("OwnerRRef R" + id.str() + " (" + std::to_string(e.forks.size()) + " forks on other workers)");
  for (auto& [f, u] : users_)
    left.push_back("UserRRef R" + u.id.str() + " F" + f.str() + (u.confirmed ? "" : " (unconfirmed)") +
                   (u.pending_children ? " (" + std::to_string(u.pending_children) + " pending children)" : ""));
  if (!children_.empty())
    left.push_back(std::to_string(children_.size()) + " forks sent and not yet confirmed");
  std::string list;
  for (std::size_t i = 0; i < left.size() && i < 16; ++i)
    list += (i ? "; " : "") + left[i];
  if (left.size() > 16)
    list += "; ... (" + std::to_string(left.size()) + " in all)";
  CORODIST_LOG_WARN("rref: worker {}: after {} ms of shutdown, still held: {}{}", self(),
                    std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - started).count(),
                    list.empty() ? "nothing" : list,
                    channel_.unacked() ? " (" + std::to_string(channel_.unacked()) + " control messages unacknowledged)"
                                       : "");
  co_return false;
}

// ---- deadlines of to_here() on the owner (real clock only) -----------------------

void reference_tracker::arm_fetch_timer(clock::time_point deadline) {
  if (!fetch_timer_ || (fetch_armed_ && fetch_timer_->expiry() <= deadline))
    return;
  fetch_armed_ = true;
  fetch_timer_->expires_at(deadline); // (cancels the wait for a later one)
  fetch_timer_->async_wait([w = weak_from_this()](std::error_code ec) {
    auto self = w.lock();
    if (!self || ec) // cancelled: re-armed earlier, or the loop is shutting down
      return;
    self->fetch_armed_ = false;
    self->expire_local_fetches();
  });
}

void reference_tracker::expire_local_fetches() {
  const auto now = now_();
  std::optional<clock::time_point> next;
  for (auto& [id, e] : owners_) {
    if (!e.extra)
      continue;
    auto& here = e.extra->waiting_here;
    for (auto it = here.begin(); it != here.end();) {
      if (it->deadline > now) {
        next = std::min(next.value_or(it->deadline), it->deadline);
        ++it;
        continue;
      }
      it->p.set_exception(std::make_exception_ptr(timeout_error(
          "to_here of RRef R" + id.str() + " on its owner '" + port_.self().name +
          "': its function did not finish within " + std::to_string(it->timeout.count()) + " ms")));
      it = here.erase(it);
    }
  }
  if (next)
    arm_fetch_timer(*next);
}

} // namespace corodist::rref::detail
