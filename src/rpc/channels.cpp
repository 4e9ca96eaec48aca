#include "rpc/channels.hpp"

#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "rpc/call_flow.hpp"
#include "rpc/protocol.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/ip/address.hpp>

#include <algorithm>

namespace corodist::rpc::detail {

namespace {
using clock = std::chrono::steady_clock;

bool passed(clock::time_point deadline) { return corodist::deadline(deadline).expired(); }
} // namespace

net::bytes encode_identity(const worker_info& self) {
  net::bytes b(4 + self.name.size());
  corodist::store_le(b.data(), static_cast<std::int32_t>(self.rank));
  std::copy(self.name.begin(), self.name.end(), reinterpret_cast<char*>(b.data()) + 4);
  return b;
}

std::optional<std::pair<int, std::string>> decode_identity(const net::bytes& b) {
  if (b.size() < 4)
    return std::nullopt;
  const auto rank = corodist::load_le<std::int32_t>(b.data());
  if (rank < 0)
    return std::nullopt;
  return std::pair<int, std::string>(rank, std::string(reinterpret_cast<const char*>(b.data()) + 4, b.size() - 4));
}

channels::channels(asio::any_io_executor ex, const worker_registry& registry, net::connection_options options,
                   kind_name_fn kind_name, message_fn on_message)
    : ex_(std::move(ex)), registry_(registry), options_(std::move(options)), kind_name_(std::move(kind_name)),
      on_message_(std::move(on_message)) {}

void channels::request(int rank, message_kind kind, payload p, corodist::deadline by, response_fn done,
                       call_link link) {
  waiting w{kind, std::move(p), by.at(), std::move(done), std::move(link), rank};
  if (closed_) {
    w.done(net::response{net::errc::connection_closed, {}});
    return;
  }
  auto& pr = peers_[rank];
  if (pr.lost) {
    w.done(net::response{pr.lost->ec, {}});
    return;
  }
  if (pr.conn && pr.conn->is_open()) {
    send(pr.conn, std::move(w));
    return;
  }
  pr.queue.push_back(std::move(w));
  arm_queue_timer(rank);
  if (!pr.dialing) {
    pr.dialing = true;
    asio::co_spawn(ex_, dial(rank), asio::detached);
  }
}

void channels::notify(int rank, message_kind kind, payload p) {
  if (closed_)
    return;
  auto& pr = peers_[rank];
  if (pr.lost) {
    CORODIST_LOG_DEBUG("rpc: {} to rank {} dropped: the worker is lost ({})", kind_name_(kind), rank,
                       pr.lost->reason);
    return;
  }
  if (pr.conn && pr.conn->is_open()) {
    send(pr.conn, waiting{kind, std::move(p), clock::time_point::max(), {}});
    return;
  }
  pr.queue.push_back(waiting{kind, std::move(p), clock::time_point::max(), {}});
  if (!pr.dialing) {
    pr.dialing = true;
    asio::co_spawn(ex_, dial(rank), asio::detached);
  }
}

void channels::send(const std::shared_ptr<net::connection>& conn, waiting&& w) {
  if (!w.done) { // a notification: handed over once queued on the connection
    if (auto ec = conn->send(w.kind, std::move(w.body.body), std::move(w.body.attachments)))
      CORODIST_LOG_DEBUG("rpc: {} to {} not sent: {}", kind_name_(w.kind),
                         net::detail::endpoint_text(conn->remote_endpoint()), ec.message());
    return;
  }
  const corodist::deadline by(w.deadline);
  if (w.link.call && w.link.call->cancelled.load()) { // cancelled before it could be sent
    w.link.call->finished = true;
    w.done(net::response{asio::error::operation_aborted, {}});
    return;
  }
  // (A deadline that has passed fails it in start_request, with request_timeout.)
  const auto id = conn->next_request_id(); // the request's, sent below
  if (w.link.recorder)
    w.link.recorder->set_link(w.link.record, id, call_flow(registry_.self().rank, w.rank, id));
  if (w.link.call) {
    w.link.call->sent = true;
    w.link.call->conn = conn;
    w.link.call->id = id;
  }
  // (upper layers' records live until the reply)
  conn->start_request(w.kind, std::move(w.body.body), std::move(w.body.attachments), by,
                      [done = std::move(w.done), call = std::move(w.link.call),
                       records = std::move(w.body.records)](net::response r) mutable {
                        if (call)
                          call->finished = true;
                        done(std::move(r));
                      });
}

void channels::cancel(outgoing_call& call) {
  if (!call.sent || call.finished)
    return; // not sent yet (send() ends it), or nothing left to cancel
  call.finished = true;
  if (auto c = call.conn.lock(); c && c->is_open()) {
    net::bytes id(8);
    corodist::store_le(id.data(), call.id);
    if (auto ec = c->send(kind_cancel, std::move(id), {}))
      CORODIST_LOG_DEBUG("rpc: a call's cancel to {} not sent: {}", net::detail::endpoint_text(c->remote_endpoint()),
                         ec.message());
    c->cancel_request(call.id); // its request() ends now, with operation_aborted
  }
}

asio::awaitable<void> channels::dial(int rank) {
  auto self = shared_from_this();
  const auto& w = registry_.lookup(rank);
  std::error_code ec;
  auto addr = asio::ip::make_address(w.host, ec);
  std::shared_ptr<net::connection> conn;
  auto dial_ends = clock::time_point::max(); // when the dial's hello deadline passes
  bool shortened_dial = false;               // ... before the usual handshake timeout (a call's deadline)
  if (!ec) {
    auto opts = options_;
    // The dial may take no longer than the nearest deadline of what waits for it.
    const auto usual = options_.handshake_timeout.or_else(net::connection_options::default_handshake_timeout).from();
    auto ends = usual;
    for (auto& q : peers_[rank].queue)
      ends = earliest(ends, corodist::deadline(q.deadline));
    if (!ends.is_never())
      opts.handshake_timeout = std::max(std::chrono::ceil<std::chrono::milliseconds>(ends.remaining()),
                                        std::chrono::milliseconds(1));
    dial_ends = ends.at();
    shortened_dial = ends != usual;
    CORODIST_LOG_DEBUG("rpc: dialling worker '{}' (rank {}) at {}:{}", w.name, rank, w.host, w.port);
    auto [cec, c] = co_await net::connection::connect(ex_, asio::ip::tcp::endpoint(addr, w.port), opts);
    ec = cec;
    conn = std::move(c);
  }
  auto& pr = peers_[rank];
  pr.dialing = false;
  auto queue = std::move(pr.queue);
  pr.queue.clear();
  if (!ec && (closed_ || pr.lost)) {
    conn->close();
    ec = pr.lost ? pr.lost->ec : std::error_code(net::errc::connection_closed);
  }
  if (ec) {
    CORODIST_LOG_DEBUG("rpc: cannot connect to worker '{}' at {}:{}: {}", w.name, w.host, w.port, ec.message());
    // A hello deadline shortened to a call's own (rounded down to the
    // millisecond) fails that call by its deadline; calls queued meanwhile
    // with later deadlines are not bound by it: they dial again.
    const bool shortened = ec == net::errc::hello_timeout && shortened_dial;
    std::deque<waiting> again;
    for (auto& q : queue) {
      if (!q.done)
        continue;
      const bool bounded = shortened && q.deadline < dial_ends + std::chrono::milliseconds(1);
      const bool late =
          q.deadline != clock::time_point::max() && (bounded || passed(q.deadline));
      if (shortened && !late && !closed_ && !pr.lost) {
        again.push_back(std::move(q));
        continue;
      }
      q.done(net::response{late ? std::error_code(net::errc::request_timeout) : ec, {}});
    }
    if (!again.empty()) {
      auto& retry = peers_[rank];
      for (auto& q : again)
        retry.queue.push_back(std::move(q));
      arm_queue_timer(rank);
      if (!retry.dialing) {
        retry.dialing = true;
        asio::co_spawn(ex_, dial(rank), asio::detached);
      }
    }
    co_return;
  }
  // Who we are, rank and name: the first frame on the connection (the callee
  // may not have the worker table yet when our first call arrives).
  conn->send(kind_identify, encode_identity(registry_.self()));
  conn->start(
      [wk = weak_from_this(), rank](const std::shared_ptr<net::connection>& c, net::message&& m) {
        if (is_stream_kind(m.header.kind) && (m.header.flags & net::frame_flags::one_way)) {
          if (auto s = wk.lock(); s && s->stream_frames_)
            s->stream_frames_(rank, c, std::move(m));
          return;
        }
        // Nothing is served on a connection this worker dialled.
        if (!(m.header.flags & net::frame_flags::one_way))
          c->respond_error(m.header.request_id, m.header.kind, "rpc: requests go on the connection the sender dialled");
      },
      [wk = weak_from_this(), rank, raw = conn.get()](std::error_code reason) {
        if (auto s = wk.lock()) {
          auto it = s->peers_.find(rank);
          if (it != s->peers_.end() && it->second.conn.get() == raw) {
            it->second.conn.reset();
            s->mark_lost(rank, reason);
          }
          if (s->stream_closed_)
            s->stream_closed_(raw, rank);
        }
      });
  pr.conn = conn;
  CORODIST_LOG_DEBUG("rpc: connected to worker '{}' (rank {})", w.name, rank);
  for (auto& q : queue)
    send(conn, std::move(q));
}

void channels::arm_queue_timer(int rank) {
  auto& pr = peers_[rank];
  auto earliest = clock::time_point::max();
  for (auto& q : pr.queue)
    if (q.done)
      earliest = std::min(earliest, q.deadline);
  if (earliest == clock::time_point::max())
    return;
  if (!pr.timer)
    pr.timer = std::make_unique<asio::steady_timer>(ex_);
  else if (pr.timer->expiry() <= earliest && pr.timer->expiry() > clock::now())
    return; // already due no later
  pr.timer->expires_at(earliest);
  pr.timer->async_wait([w = weak_from_this(), rank](std::error_code ec) {
    if (ec)
      return;
    if (auto self = w.lock())
      self->expire_queued(rank);
  });
}

// A request still queued behind its peer's dial at its deadline fails now, on
// its own timer, whatever the dial does.
void channels::expire_queued(int rank) {
  auto& pr = peers_[rank];
  const auto now = clock::now();
  std::vector<response_fn> expired;
  for (auto it = pr.queue.begin(); it != pr.queue.end();) {
    if (it->done && it->deadline <= now) {
      expired.push_back(std::move(it->done));
      it = pr.queue.erase(it);
    } else {
      ++it;
    }
  }
  arm_queue_timer(rank);
  for (auto& d : expired)
    d(net::response{net::errc::request_timeout, {}});
}

void channels::adopt(std::shared_ptr<net::connection> conn) {
  if (closed_) {
    conn->close();
    return;
  }
  auto* raw = conn.get();
  incoming_[raw] = accepted_conn{conn, -1};
  conn->start(
      [w = weak_from_this(), raw](const std::shared_ptr<net::connection>& c, net::message&& m) {
        if (auto self = w.lock())
          self->on_incoming(raw, c, std::move(m));
      },
      [w = weak_from_this(), raw](std::error_code reason) {
        if (auto self = w.lock()) {
          auto it = self->incoming_.find(raw);
          if (it == self->incoming_.end())
            return;
          const int rank = it->second.rank;
          self->incoming_.erase(it);
          if (self->stream_closed_)
            self->stream_closed_(raw, rank);
          // A worker whose own connection to us fell silent hangs (or its host
          // is cut off): calls to it would wait out a dial. (A plain close of
          // this side is left to the connection this worker dialled, if any.)
          if (reason == net::errc::peer_timed_out && rank >= 0)
            self->mark_lost(rank, reason);
        }
      });
}

void channels::on_incoming(net::connection* raw, const std::shared_ptr<net::connection>& conn, net::message&& m) {
  auto it = incoming_.find(raw);
  if (it == incoming_.end())
    return;
  if (m.header.kind == kind_identify) {
    if (auto id = decode_identity(m.payload)) {
      it->second.rank = id->first;
      it->second.name = std::move(id->second);
    }
    return;
  }
  on_message_(it->second.rank, it->second.name, conn, std::move(m));
}

void channels::close_all() {
  closed_ = true;
  std::vector<response_fn> failed;
  for (auto& [rank, pr] : peers_) {
    if (pr.timer)
      pr.timer->cancel();
    for (auto& q : pr.queue)
      if (q.done)
        failed.push_back(std::move(q.done));
    pr.queue.clear();
    if (auto c = std::move(pr.conn))
      c->close();
  }
  auto incoming = std::move(incoming_);
  incoming_.clear();
  for (auto& [raw, a] : incoming)
    if (auto c = a.conn.lock())
      c->close();
  for (auto& d : failed)
    d(net::response{net::errc::connection_closed, {}});
}

void channels::mark_lost(int rank, std::error_code reason) {
  if (closed_)
    return; // this agent closes: nobody is lost
  const auto* table = registry_.table();
  if (!table || rank < 0 || static_cast<std::size_t>(rank) >= table->by_rank.size())
    return; // (an unknown rank, or a close before the agent started)
  auto& pr = peers_[rank];
  if (pr.lost)
    return;
  lost_peer l;
  if (reason == net::errc::peer_timed_out) {
    l.ec = reason;
    l.reason = "no frame received for " + options_.peer_timeout.str() + " (peer_timeout)";
  } else {
    l.ec = net::errc::connection_closed;
    l.reason = reason == net::errc::connection_closed ? std::string("connection closed") : reason.message();
  }
  const auto& name = table->by_rank[static_cast<std::size_t>(rank)].name;
  if (peers_leaving_)
    CORODIST_LOG_DEBUG("rpc: worker '{}' (rank {}) left: {}", name, rank, l.reason);
  else
    CORODIST_LOG_WARN("rpc: worker '{}' (rank {}) lost: {}", name, rank, l.reason);
  pr.lost = std::move(l);
  if (auto c = std::move(pr.conn))
    c->close(reason); // (the accepted side fell silent: the dialled one goes too)
  // Requests queued behind a dial fail now, not at the dial's end. (What
  // they run may add peers: `pr` is not used after this point.)
  const auto ec = pr.lost->ec;
  auto queue = std::move(pr.queue);
  pr.queue.clear();
  for (auto& q : queue)
    if (q.done)
      q.done(net::response{ec, {}});
}

const channels::lost_peer* channels::lost(int rank) const {
  auto it = peers_.find(rank);
  return it != peers_.end() && it->second.lost ? &*it->second.lost : nullptr;
}

std::shared_ptr<net::connection> channels::connection_to(int rank) const {
  auto it = peers_.find(rank);
  return it != peers_.end() && it->second.conn && it->second.conn->is_open() ? it->second.conn : nullptr;
}

std::size_t channels::dialled_peers() const {
  std::size_t n = 0;
  for (auto& [rank, pr] : peers_)
    n += pr.conn && pr.conn->is_open();
  return n;
}

} // namespace corodist::rpc::detail
