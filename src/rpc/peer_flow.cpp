#include "rpc/peer_flow.hpp"

#include "core/log.hpp"
#include "net/endpoint_text.hpp"

#include <algorithm>

namespace corodist::rpc::detail {

peer_flow::peer_flow(const std::shared_ptr<net::connection>& conn, std::size_t cap)
    : conn_(conn), raw_(conn.get()), cap_(cap) {}

bool peer_flow::serves(const net::connection* c) const {
  auto p = conn_.lock();
  return p && p.get() == c && raw_ == c;
}

// The memory a running call may hold: its value and the value's encoding.
// Before any reply, nothing is known: calls are admitted, and those that had
// not started by the time the first reply showed its size check again
// (may_run) before they run.
bool peer_flow::admits() const noexcept {
  const std::size_t held = output_.load() + in_transit_.load();
  const std::size_t running = running_.load();
  if (running == 0 && held == 0)
    return true; // alone, a call runs whatever its size
  return held + (running + 1) * 2 * largest_.load() <= cap_;
}

bool peer_flow::may_run() const noexcept {
  if (closed())
    return true; // (it finds the connection closed and answers nobody)
  const std::size_t held = output_.load() + in_transit_.load();
  const std::size_t running = running_.load(); // this call among them
  if (running <= 1 && held == 0)
    return true;
  return held + running * 2 * largest_.load() <= cap_;
}

bool peer_flow::admit_now() {
  if (!waiting_.empty())
    return false;
  if (auto c = conn_.lock())
    output_ = c->buffered_output();
  if (!closed() && !admits())
    return false;
  ++running_;
  return true;
}

void peer_flow::submit(start_fn s) {
  waiting_.push_back(std::move(s));
  pump();
}

void peer_flow::encoded(std::size_t n) noexcept {
  in_transit_ += n;
  auto seen = largest_.load();
  while (n > seen && !largest_.compare_exchange_weak(seen, n)) {
  }
}

void peer_flow::finished(std::size_t n) {
  in_transit_ -= n;
  --running_;
  if (!waiting_.empty())
    pump();
}

void peer_flow::requeue(start_fn s) {
  --running_;
  waiting_.push_front(std::move(s));
  pump();
}

void peer_flow::release_all() {
  closed_ = true; // (every call then answers at once)
  pump();
}

void peer_flow::pump() {
  if (pumping_) {
    again_ = true;
    return;
  }
  pumping_ = true;
  auto self = shared_from_this(); // (a started call may drop the dispatcher's hold on this)
  do {
    again_ = false;
    auto c = conn_.lock();
    if (!c || !c->is_open())
      closed_ = true;
    output_ = c ? c->buffered_output() : 0;
    while (!waiting_.empty() && (closed() || admits())) {
      auto s = std::move(waiting_.front());
      waiting_.pop_front();
      ++running_;
      s();
      if (c)
        output_ = c->buffered_output();
    }
    if (!c)
      continue;
    if (waiting_.empty()) {
      if (c->reading_paused()) {
        CORODIST_LOG_DEBUG("rpc: calls from {} resume", net::detail::endpoint_text(c->remote_endpoint()));
        c->on_output_written({});
        c->resume_reading();
      }
    } else if (!c->reading_paused() && c->is_open()) {
      CORODIST_LOG_DEBUG("rpc: calls from {} wait: {} bytes of output held for it, {} calls running, largest "
                         "reply {} (cap {})",
                         net::detail::endpoint_text(c->remote_endpoint()), output_.load() + in_transit_.load(),
                         running_.load(), largest_.load(), cap_);
      c->pause_reading();
      c->on_output_written([w = weak_from_this()] {
        if (auto f = w.lock())
          f->pump();
      });
    }
  } while (again_);
  pumping_ = false;
}

} // namespace corodist::rpc::detail
