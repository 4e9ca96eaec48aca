// The requests awaiting a response: dispatch() routes each incoming frame (a
// response completes the pending request of its id, the rest go to the
// request handler), complete() ends a pending request, and one timer enforces
// their deadlines.
#include <corodist/net/connection.hpp>

#include "core/log.hpp"
#include "net/buffer_cache.hpp"
#include "net/endpoint_text.hpp"

#include <vector>

namespace corodist::net {

namespace {

using clock = std::chrono::steady_clock;

} // namespace

void connection::dispatch(message&& m) {
  CORODIST_LOG_TRACE("net: from {}: kind {}, request {}, flags 0x{:x}, {} bytes", detail::endpoint_text(remote_),
                     m.header.kind, m.header.request_id, unsigned(m.header.flags), m.header.payload_len);
  if (m.header.kind == control_kind)
    return; // a heartbeat: its bytes have done their job (heartbeat.cpp)
  if (m.header.flags & frame_flags::response) {
    auto ec = (m.header.flags & frame_flags::error) ? std::error_code(errc::remote_failure) : std::error_code{};
    complete(m.header.request_id, response{ec, std::move(m)});
    return;
  }
  if (on_request_) {
    on_request_(shared_from_this(), std::move(m));
    // A large payload its handler did not keep: its pages go back to the system.
    detail::free_buffer(std::move(m.payload));
  } else if (!(m.header.flags & frame_flags::one_way)) {
    respond_error(m.header.request_id, m.header.kind, "no request handler on this connection");
  }
}

void connection::complete(std::uint64_t id, response r) {
  auto it = pending_.find(id);
  if (it == pending_.end())
    return; // already completed (timeout, cancellation) or never ours: a late reply is dropped
  auto done = std::move(it->second.complete);
  pending_.erase(it);
  done(std::move(r));
}

void connection::cancel_request(std::uint64_t request_id) {
  complete(request_id, response{asio::error::operation_aborted, {}});
}

void connection::arm_timer(clock::time_point deadline) {
  if (timer_deadline_ && *timer_deadline_ <= deadline)
    return;
  timer_deadline_ = deadline;
  if (!timer_)
    timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  timer_->expires_at(deadline);
  timer_->async_wait([w = weak_from_this()](std::error_code ec) {
    if (ec)
      return;
    if (auto self = w.lock())
      self->on_timer();
  });
}

void connection::on_timer() {
  timer_deadline_.reset();
  const auto now = clock::now();
  std::vector<std::uint64_t> expired;
  auto next = clock::time_point::max();
  for (auto& [id, p] : pending_) {
    if (p.deadline <= now)
      expired.push_back(id);
    else if (p.deadline < next)
      next = p.deadline;
  }
  for (auto id : expired)
    complete(id, response{errc::request_timeout, {}});
  if (next != clock::time_point::max())
    arm_timer(next);
}

} // namespace corodist::net
