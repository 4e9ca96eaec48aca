// The stall watch: the bytes of an incomplete frame are read under a
// watchdog that closes the connection (frame_stalled) when none arrives for
// frame_timeout.
#include <corodist/net/connection.hpp>

#include "core/deadline.hpp"
#include "net/connection_io.hpp"
#include "net/tls_stream.hpp"

#include <asio/read.hpp>
#include <asio/use_awaitable.hpp>

#if CORODIST_IO_URING
#include "net/uring_service.hpp"
#endif

#include <limits>
#include <tuple>

namespace corodist::net {

namespace {

using corodist::detail::use_tuple;
using clock = std::chrono::steady_clock;

// Completion condition "everything" (uncapped, as writer.cpp's transfer_all_uncapped) that
// also records the time of each step of progress for the stall watchdog.
struct transfer_all_noting_progress {
  std::chrono::steady_clock::time_point* progress_at;
  std::size_t seen = 0;
  std::size_t operator()(const std::error_code& ec, std::size_t n) noexcept {
    if (n != seen) {
      seen = n;
      *progress_at = clock::now();
    }
    return ec ? 0 : std::numeric_limits<std::uint32_t>::max();
  }
};

} // namespace

// While an incomplete frame is being read, a watchdog looks once per
// frame_timeout whether any byte arrived since the last progress; if none did it
// cancels the read, which then ends with frame_stalled. One timer wait per
// frame_timeout, not one per read.
void connection::arm_stall_watch() {
  if (!opts_.frame_timeout.is_finite() || stall_watch_armed_)
    return;
  stall_watch_armed_ = true;
  if (!stall_timer_)
    stall_timer_ = std::make_unique<asio::steady_timer>(socket_.get_executor());
  stall_timer_->expires_at(progress_at_ + opts_.frame_timeout.length());
  stall_timer_->async_wait([w = weak_from_this()](std::error_code ec) {
    if (ec)
      return;
    if (auto self = w.lock())
      self->on_stall_watch();
  });
}

void connection::on_stall_watch() {
  stall_watch_armed_ = false;
  if (!in_frame_ || !open_)
    return;
  if (clock::now() - progress_at_ >= opts_.frame_timeout.length()) {
    stalled_ = true;
    std::error_code ignored;
    if (uring_ != nullptr)
      cancel_on_uring();
    else
      tcp().cancel(ignored);
    return;
  }
  arm_stall_watch(); // from the last progress
}

asio::awaitable<std::pair<std::error_code, std::size_t>> connection::read_frame_bytes(asio::mutable_buffer b,
                                                                                     bool all) {
  in_frame_ = true;
  progress_at_ = clock::now();
  arm_stall_watch();
  std::error_code ec;
  std::size_t n = 0;
#if CORODIST_IO_URING
  if (uring_ != nullptr) {
    const detail::uring_file f{io_->ring, io_->slot};
    auto* ring = uring_;
    do { // until `b` is full (all) or once, noting each step of progress
      auto [e, k] = co_await ring->async_recv(f, b + n, use_tuple);
      n += k;
      if (k > 0)
        progress_at_ = clock::now();
      ec = e;
    } while (all && !ec && n < b.size() && uring_ != nullptr);
    if (!all)
      progress_at_ = clock::now();
  } else
#endif
  if (tls_) {
    do { // until `b` is full (all) or once, noting each step of progress
      auto [e, k] = co_await tls_->read_some(b + n);
      n += k;
      if (k > 0)
        progress_at_ = clock::now();
      ec = e;
    } while (all && !ec && n < b.size());
  } else if (all) {
    std::tie(ec, n) = co_await asio::async_read(socket_, b, transfer_all_noting_progress{&progress_at_}, use_tuple);
  } else {
    std::tie(ec, n) = co_await socket_.async_read_some(b, use_tuple);
    progress_at_ = clock::now();
  }
  in_frame_ = false;
  received_at_ = progress_at_; // the last byte that arrived (peer_timeout)
  if (stalled_)
    ec = errc::frame_stalled;
  co_return std::pair{ec, n};
}

} // namespace corodist::net
