// Failure detection on a started connection (peer_timeout): the loop's
// heartbeat wheel (heartbeat_wheel.hpp: one timer per loop and peer_timeout,
// not one per connection) looks at each connection every quarter of
// peer_timeout; then a side that has handed nothing to the socket since the
// last quarter sends a heartbeat (an empty one-way frame of control_kind,
// dropped by the peer's dispatch), and a side that has received no byte for
// peer_timeout closes the connection with errc::peer_timed_out. The read and
// write paths only note the time of each completion; nothing is re-armed per
// frame or per connection.
#include <corodist/net/connection.hpp>

#include "core/log.hpp"
#include "net/connection_counting.hpp"
#include "net/endpoint_text.hpp"
#include "net/heartbeat_wheel.hpp"

#include <asio/post.hpp>
#include <asio/query.hpp>
#include <asio/execution/context.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>

namespace corodist::net {

namespace {
using clock = std::chrono::steady_clock;
} // namespace

corodist::timeout configured_peer_timeout() noexcept {
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
  return ms == 0 ? corodist::timeout::never() : corodist::timeout::after(std::chrono::milliseconds(ms));
}

namespace detail {

asio::execution_context::id heartbeat_service::id;

heartbeat_wheel::heartbeat_wheel(const asio::any_io_executor& ex, std::chrono::milliseconds peer_timeout)
    : peer_timeout_(peer_timeout),
      step_(std::chrono::duration_cast<clock::duration>(std::max(peer_timeout / 4, std::chrono::milliseconds(1))) /
            slot_count) {
  timer_.emplace(ex);
}

void heartbeat_wheel::add(connection& c) {
  std::size_t s = 0;
  for (std::size_t i = 1; i < slot_count; ++i)
    if (members_[i] < members_[s])
      s = i;
  c.wheel_ = this;
  c.wheel_slot_ = static_cast<std::uint32_t>(s);
  c.wheel_index_ = static_cast<std::uint32_t>(slots_[s].size());
  slots_[s].push_back(&c);
  ++members_[s];
  ++live_;
  arm();
}

void heartbeat_wheel::remove(connection& c) noexcept {
  auto& slot = slots_[c.wheel_slot_];
  slot[c.wheel_index_] = nullptr;
  --members_[c.wheel_slot_];
  ++holes_[c.wheel_slot_];
  c.wheel_ = nullptr;
  if (--live_ == 0 && !ticking_) {
    // Nothing left to look at: no timer keeps the loop busy (a loop drains).
    if (armed_) {
      armed_ = false;
      timer_->cancel();
    }
    for (std::size_t i = 0; i < slot_count; ++i)
      compact(i);
  }
}

void heartbeat_wheel::shutdown() noexcept {
  stopped_ = true;
  armed_ = false;
  timer_.reset(); // before the timer's service goes (it may have been made after this one)
}

void heartbeat_wheel::arm() {
  if (armed_ || stopped_ || live_ == 0)
    return;
  armed_ = true;
  const auto now = clock::now();
  // On schedule from the last tick, unless the loop fell a step behind (or the
  // wheel was idle): then a step from now, with no burst to catch up.
  next_tick_ += step_;
  if (next_tick_ <= now || next_tick_ > now + step_)
    next_tick_ = now + step_;
  timer_->expires_at(next_tick_);
  timer_->async_wait([this](std::error_code ec) {
    if (ec) // cancelled: remove() took the last member, or a new expiry replaced this wait
      return;
    armed_ = false;
    on_tick();
  });
}

void heartbeat_wheel::on_tick() {
  const std::size_t s = turn_;
  turn_ = (turn_ + 1) % slot_count;
  // Members that join meanwhile (a close handler that connects again) wait for
  // their slot's next turn; those that leave leave holes.
  ticking_ = true;
  const std::size_t n = slots_[s].size();
  for (std::size_t i = 0; i < n && !stopped_; ++i) {
    connection* c = slots_[s][i];
    if (!c)
      continue;
    if (auto self = c->weak_from_this().lock())
      self->on_heartbeat(false);
  }
  ticking_ = false;
  if (live_ == 0) {
    for (std::size_t i = 0; i < slot_count; ++i)
      compact(i);
  } else {
    compact(s);
  }
  arm();
}

void heartbeat_wheel::compact(std::size_t s) {
  if (holes_[s] == 0)
    return;
  auto& slot = slots_[s];
  std::size_t to = 0;
  for (std::size_t from = 0; from < slot.size(); ++from)
    if (connection* c = slot[from]) {
      c->wheel_index_ = static_cast<std::uint32_t>(to);
      slot[to++] = c;
    }
  slot.resize(to);
  holes_[s] = 0;
  if (slot.capacity() > 64 && slot.capacity() / 4 > slot.size())
    slot.shrink_to_fit(); // a crowd has gone: give its memory back
}

heartbeat_wheel& heartbeat_service::wheel(const asio::any_io_executor& ex, std::chrono::milliseconds peer_timeout) {
  for (auto& w : wheels_)
    if (w->peer_timeout() == peer_timeout)
      return *w;
  wheels_.push_back(std::make_unique<heartbeat_wheel>(ex, peer_timeout));
  return *wheels_.back();
}

void heartbeat_service::shutdown() {
  // The wheels stay (connections still leave them as the context closes
  // them); only their timers stop.
  for (auto& w : wheels_)
    w->shutdown();
}

} // namespace detail

void connection::start_heartbeat() {
  if (!opts_.peer_timeout.is_finite() || !open_ || wheel_)
    return;
  auto ex = socket_.get_executor();
  asio::use_service<detail::heartbeat_service>(asio::query(ex, asio::execution::context))
      .wheel(ex, opts_.peer_timeout.length())
      .add(*this);
}

void connection::stop_heartbeat() noexcept {
  if (wheel_)
    wheel_->remove(*this);
}

void connection::on_heartbeat(bool confirming) {
  if (!open_)
    return;
  const auto now = clock::now();
  // The bytes of a large frame note their progress as they arrive (stall watch).
  auto heard = in_frame_ ? std::max(received_at_, progress_at_) : received_at_;
  // Paused (flow control): this side reads nothing, so the peer is judged by
  // its reading instead: alive while nothing is unwritten or writes complete.
  const bool paused = read_paused_;
  if (paused)
    heard = queued_bytes_ + writing_bytes_ == 0 ? now : std::max(heard, written_at_);
  if (now - heard >= opts_.peer_timeout.length()) {
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
    if (paused) {
      CORODIST_LOG_WARN("closing connection to {}: the peer does not read ({} bytes of output unwritten, none "
                        "written for {} ms while its requests wait; peer_timeout {} ms)",
                        detail::endpoint_text(remote_), queued_bytes_ + writing_bytes_,
                        std::chrono::duration_cast<std::chrono::milliseconds>(now - heard).count(),
                        opts_.peer_timeout.length().count());
      close(errc::output_overflow);
      return;
    }
    CORODIST_LOG_INFO("closing connection with {}: nothing received for {} ms (peer_timeout {} ms)",
                      detail::endpoint_text(remote_),
                      std::chrono::duration_cast<std::chrono::milliseconds>(now - heard).count(),
                      opts_.peer_timeout.length().count());
    close(errc::peer_timed_out);
    return;
  }
  // Silent for two heartbeat periods: a heartbeat the peer owed has not come.
  if (!confirming && now - heard >= opts_.peer_timeout.length() / 2)
    detail::bump(detail::counting().heartbeats_missed);
  // The wheel comes by a quarter apart, and a heartbeat sent at its last
  // visit went out a little after it: an eighth of slack keeps them a quarter
  // apart (not a half).
  const auto quarter = opts_.peer_timeout.length() / 4;
  if (!writing_ && !write_scheduled_ && now - sent_at_ >= quarter - quarter / 8) {
    frame_header h{0, control_kind, frame_flags::one_way, 0};
    enqueue(h, bytes(), {}); // an empty queue: sent at the end of this turn
  }
}

} // namespace corodist::net
