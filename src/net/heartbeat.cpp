// Failure detection on a started connection (peer_timeout): one timer per
// connection ticks every quarter of peer_timeout; at each tick a side that has
// handed nothing to the socket since the last quarter sends a heartbeat (an
// empty one-way frame of control_kind, dropped by the peer's dispatch), and a
// side that has received no byte for peer_timeout closes the connection with
// errc::peer_timed_out. The read and write paths only note the time of each
// completion; nothing is re-armed per frame.
#include <corodist/net/connection.hpp>

#include "core/log.hpp"
#include "net/endpoint_text.hpp"

#include <asio/post.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>

namespace corodist::net {

namespace {
using clock = std::chrono::steady_clock;
} // namespace

std::chrono::milliseconds configured_peer_timeout() noexcept {
  const char* env = std::getenv("CORODIST_PEER_TIMEOUT_MS");
  if (!env || !*env)
    return connection_options::default_peer_timeout;
  long long ms = 0;
  const char* end = env + std::strlen(env);
  auto [p, ec] = std::from_chars(env, end, ms);
  if (ec != std::errc{} || p != end || ms < 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      try {
        CORODIST_LOG_WARN("CORODIST_PEER_TIMEOUT_MS='{}' is not a number of milliseconds: using {} ms", env,
                          connection_options::default_peer_timeout.count());
      } catch (...) {
      }
    }
    return connection_options::default_peer_timeout;
  }
  return std::chrono::milliseconds(ms);
}

void connection::arm_heartbeat() {
  if (opts_.peer_timeout.count() <= 0 || !open_)
    return;
  if (!heartbeat_timer_)
    heartbeat_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  heartbeat_timer_->expires_after(std::max(opts_.peer_timeout / 4, std::chrono::milliseconds(1)));
  heartbeat_timer_->async_wait([w = weak_from_this()](std::error_code ec) {
    if (ec)
      return;
    if (auto self = w.lock())
      self->on_heartbeat(false);
  });
}

void connection::on_heartbeat(bool confirming) {
  if (!open_)
    return;
  const auto now = clock::now();
  // The bytes of a large frame note their progress as they arrive (stall watch).
  const auto heard = in_frame_ ? std::max(received_at_, progress_at_) : received_at_;
  if (now - heard >= opts_.peer_timeout) {
    if (!confirming) {
      // A loop that was itself held up may have reaped reads it has not run
      // yet: let them run first (what a handler posts runs before the loop
      // next polls for completions; what that one posts, after them).
      asio::post(socket_.get_executor(), [w = weak_from_this()] {
        if (auto self = w.lock())
          asio::post(self->socket_.get_executor(), [w] {
            if (auto s = w.lock())
              s->on_heartbeat(true);
          });
      });
      return;
    }
    CORODIST_LOG_INFO("closing connection with {}: nothing received for {} ms (peer_timeout {} ms)",
                      detail::endpoint_text(remote_),
                      std::chrono::duration_cast<std::chrono::milliseconds>(now - heard).count(),
                      opts_.peer_timeout.count());
    close(errc::peer_timed_out);
    return;
  }
  const auto quarter = opts_.peer_timeout / 4;
  if (!writing_ && !write_scheduled_ && now - sent_at_ >= quarter) {
    frame_header h{0, control_kind, frame_flags::one_way, 0};
    enqueue(h, bytes(), {}); // an empty queue: sent at the end of this turn
  }
  arm_heartbeat();
}

} // namespace corodist::net
