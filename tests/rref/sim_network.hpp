#pragma once
// A deterministic simulated network for the RRef protocol: every worker is an
// rpc::message_port of this process whose messages go into one pool of messages
// in flight, and a seeded schedule decides what happens next -- which message is
// delivered (any order), which control message is dropped (its sender sends it
// again) or duplicated, when time advances (retries), and what the workers'
// programs do. The protocol under test is the real reference_tracker, unchanged.
//
// User messages (remote() calls, to_here requests and their replies, messages
// carrying RRefs) are delayed and reordered freely but delivered exactly once,
// as TCP delivers them; control messages may also be dropped and duplicated.

#include <corodist/rpc/codec.hpp>
#include <corodist/rpc/detail/codec.hpp> // make_handler: the simulated port registers functions as rpc::agent does
#include <corodist/rpc/message_port.hpp>
#include <corodist/rref/rref.hpp>

#include "rref/reference_tracker.hpp"

#include <asio/io_context.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace corodist::test::sim {

namespace rr = corodist::rref;
using clock = std::chrono::steady_clock;

/// A message in flight.
struct message {
  int from = -1;
  int to = -1;
  rpc::message_kind kind = 0;
  enum class type { request, reply, error_reply, one_way } what = type::one_way;
  std::uint64_t request = 0; // for request / replies
  net::bytes payload;        // the frame payload (body + attachments, flattened)
};

class network;

/// One simulated worker's port.
class port final : public rpc::message_port {
public:
  port(network& net, int rank, int world);

  const rpc::worker_info& self() const override { return info_[static_cast<std::size_t>(rank_)]; }
  int world_size() const override { return static_cast<int>(info_.size()); }
  const rpc::worker_info& worker(rpc::worker_ref w) const override;
  asio::any_io_executor get_executor() override { return ctx_.get_executor(); }
  void set_handler(rpc::message_kind kind, std::string, handler h) override { handlers_[kind] = std::move(h); }
  future<net::bytes> request(int to, rpc::message_kind kind, rpc::payload p, corodist::deadline,
                             std::string what) override;
  void notify(int to, rpc::message_kind kind, rpc::payload p) override;
  future<rpc::payload> run_local(std::string_view fn, const msgpack::object& args, std::shared_ptr<const void> keep,
                                 rpc::call_context ctx) override;
  void add_shutdown_step(std::string, shutdown_step) override {}
  void decode_context(int from, rpc::codec_context& ctx) override {
    ctx.port = this;
    ctx.self = rank_;
    ctx.peer = from;
  }

  /// Registers a user function (as an agent would).
  template <typename F>
  void add_function(std::string name, F f) {
    functions_[std::move(name)] = rpc::detail::make_handler(std::move(f));
  }
  /// Delivers a message addressed to this worker.
  void deliver(message&& m);
  /// Runs what is ready on this worker's executor; returns how many handlers ran.
  std::size_t poll() {
    ctx_.restart();
    return ctx_.poll();
  }

private:
  network& net_;
  int rank_;
  std::vector<rpc::worker_info> info_;
  asio::io_context ctx_{1};
  std::unordered_map<rpc::message_kind, handler> handlers_;
  std::unordered_map<std::string, rpc::detail::handler> functions_;
  std::uint64_t next_request_ = 1;
  struct pending_request {
    promise<net::bytes> p;
    std::string what; // names the request in its errors
  };
  std::unordered_map<std::uint64_t, pending_request> pending_;
};

/// Flattens an encoded payload into the bytes a receiver gets.
inline net::bytes flatten(rpc::payload&& p) {
  net::bytes b = std::move(p.body);
  for (auto& a : p.attachments) {
    const auto* d = static_cast<const std::byte*>(a.data.data());
    b.insert(b.end(), d, d + a.data.size());
  }
  return b;
}

/// The network and its workers (each with its real reference_tracker).
class network {
public:
  network(int workers, std::uint64_t seed);
  ~network();

  int size() const noexcept { return static_cast<int>(ports_.size()); }
  port& at(int r) { return *ports_[static_cast<std::size_t>(r)]; }
  rr::detail::reference_tracker& tracker(int r) { return *trackers_[static_cast<std::size_t>(r)]; }
  std::mt19937_64& rng() noexcept { return rng_; }
  clock::time_point now() const noexcept { return now_; }

  /// A message enters the network.
  void send(message m) { in_flight_.push_back(std::move(m)); }
  /// Messages in flight.
  std::size_t in_flight() const noexcept { return in_flight_.size(); }
  const std::deque<message>& flight() const noexcept { return in_flight_; }

  /// Runs every worker's ready handlers until none is left.
  void settle();
  /// One network event: a random message is delivered (control ones may also
  /// be dropped or duplicated, with `faults`), or time advances and every
  /// worker resends what is due. Returns false if nothing could happen.
  bool step(bool faults);
  /// Delivers everything (no more faults) and lets retries run until no message
  /// is in flight and every control message was acknowledged (bounded).
  bool drain();

private:
  void advance(std::chrono::milliseconds d);

  std::mt19937_64 rng_;
  clock::time_point now_;
  std::deque<message> in_flight_;
  std::vector<std::unique_ptr<port>> ports_;
  std::vector<std::shared_ptr<rr::detail::reference_tracker>> trackers_;
};

} // namespace corodist::test::sim
