#include "rref/sim_network.hpp"

#include "rpc/error_reply.hpp"

#include <corodist/core/error.hpp>

#include <string>
#include <utility>

namespace corodist::test::sim {

port::port(network& net, int rank, int world) : net_(net), rank_(rank) {
  for (int r = 0; r < world; ++r) {
    std::string name = "w"; // (not "w" + std::string: GCC 12's -Wrestrict misfires on it)
    name += std::to_string(r);
    info_.push_back(rpc::worker_info{std::move(name), r, "sim", 0});
  }
}

const rpc::worker_info& port::worker(rpc::worker_ref w) const {
  if (w.by_rank()) {
    if (static_cast<std::size_t>(w.rank()) >= info_.size())
      throw usage_error("sim: no worker " + std::to_string(w.rank()));
    return info_[static_cast<std::size_t>(w.rank())];
  }
  for (auto& i : info_)
    if (i.name == w.name())
      return i;
  throw usage_error("sim: no worker named " + std::string(w.name()));
}

future<net::bytes> port::request(int to, rpc::message_kind kind, rpc::payload p, corodist::deadline,
                                 std::string what) {
  const auto id = next_request_++;
  auto& pending = pending_[id];
  pending.what = std::move(what);
  auto f = pending.p.get_future();
  net_.send(message{rank_, to, kind, message::type::request, id, flatten(std::move(p))});
  return f;
}

void port::notify(int to, rpc::message_kind kind, rpc::payload p) {
  net_.send(message{rank_, to, kind, message::type::one_way, 0, flatten(std::move(p))});
}

future<rpc::payload> port::run_local(std::string_view fn, const msgpack::object& args, std::shared_ptr<const void>,
                                     rpc::call_context ctx) {
  auto it = functions_.find(std::string(fn));
  if (it == functions_.end())
    return make_exceptional_future<rpc::payload>(
        std::make_exception_ptr(remote_error(self().name, "unknown_function", "no function " + std::string(fn))));
  try {
    const int to = ctx.caller_rank();
    auto bound = it->second(args, ctx, [this, to] { return std::make_unique<rpc::encoder>(this, rank_, to); });
    if (!bound.plain)
      throw usage_error("sim: coroutine functions are not simulated");
    return make_ready_future(bound.plain());
  } catch (...) {
    return make_exceptional_future<rpc::payload>(std::current_exception());
  }
}

void port::deliver(message&& m) {
  switch (m.what) {
  case message::type::request: {
    auto it = handlers_.find(m.kind);
    if (it == handlers_.end())
      throw usage_error("sim: worker " + std::to_string(rank_) + " has no handler for a request of worker " +
                        std::to_string(m.from));
    const int from = m.from;
    const auto id = m.request;
    const auto kind = m.kind;
    network* net = &net_;
    const int me = rank_;
    rpc::responder r(
        [net, me, from, id, kind](rpc::payload p) {
          net->send(message{me, from, kind, message::type::reply, id, flatten(std::move(p))});
        },
        [net, me, from, id, kind, name = self().name](std::exception_ptr e) {
          net->send(message{me, from, kind, message::type::error_reply, id,
                            flatten(rpc::detail::encode_exception(e, name))});
        });
    it->second(rpc::inbound_message{m.from, m.kind, false, std::move(m.payload)}, std::move(r));
    break;
  }
  case message::type::reply:
  case message::type::error_reply: {
    auto it = pending_.find(m.request);
    if (it == pending_.end())
      return; // a reply nobody waits for
    auto [p, what] = std::move(it->second);
    pending_.erase(it);
    if (m.what == message::type::reply)
      p.set_value(std::move(m.payload));
    else
      p.set_exception(
          rpc::detail::decode_failure(info_[static_cast<std::size_t>(m.from)].name, what, std::move(m.payload)));
    break;
  }
  case message::type::one_way: {
    auto it = handlers_.find(m.kind);
    if (it != handlers_.end())
      it->second(rpc::inbound_message{m.from, m.kind, true, std::move(m.payload)}, rpc::responder{});
    break;
  }
  }
}

network::network(int workers, std::uint64_t seed) : rng_(seed), now_(clock::time_point{} + std::chrono::hours(1)) {
  rr::enable_options opts;
  opts.give_up_after = std::chrono::hours(24 * 365); // the simulated network heals: never give up
  for (int r = 0; r < workers; ++r)
    ports_.push_back(std::make_unique<port>(*this, r, workers));
  for (int r = 0; r < workers; ++r) {
    auto t = std::make_shared<rr::detail::reference_tracker>(*ports_[static_cast<std::size_t>(r)], nullptr, opts,
                                                             [this] { return now_; });
    t->install();
    ports_[static_cast<std::size_t>(r)]->set_extension(t);
    trackers_.push_back(t);
  }
}

network::~network() {
  settle();
  in_flight_.clear();
}

void network::settle() {
  for (int rounds = 0; rounds < 100000; ++rounds) {
    std::size_t ran = 0;
    for (auto& p : ports_)
      ran += p->poll();
    if (ran == 0)
      return;
  }
}

void network::advance(std::chrono::milliseconds d) {
  now_ += d;
  for (auto& c : trackers_)
    c->pump();
  settle();
}

bool network::step(bool faults) {
  std::uniform_int_distribution<int> pct(0, 99);
  if (in_flight_.empty() || pct(rng_) < 12) {
    advance(std::chrono::milliseconds(std::uniform_int_distribution<int>(10, 300)(rng_)));
    return true;
  }
  const auto i = std::uniform_int_distribution<std::size_t>(0, in_flight_.size() - 1)(rng_);
  message m = std::move(in_flight_[i]);
  in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
  if (faults && m.kind == rr::detail::kind_control) {
    const int roll = pct(rng_);
    if (roll < 10) // dropped: the sender sends it again
      return true;
    if (roll < 20) // duplicated: a copy stays in flight
      in_flight_.push_back(message{m.from, m.to, m.kind, m.what, m.request, m.payload});
  }
  at(m.to).deliver(std::move(m));
  settle();
  return true;
}

bool network::drain() {
  for (int i = 0; i < 200000; ++i) {
    if (in_flight_.empty()) {
      bool quiet = true;
      for (auto& c : trackers_)
        quiet = quiet && c->info().unacked == 0;
      if (quiet)
        return true;
      advance(std::chrono::milliseconds(500));
      continue;
    }
    message m = std::move(in_flight_.front());
    in_flight_.pop_front();
    at(m.to).deliver(std::move(m));
    settle();
  }
  return false;
}

} // namespace corodist::test::sim
