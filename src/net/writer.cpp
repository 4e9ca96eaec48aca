// The output side of a connection: requests (under a fresh id, awaiting their
// response), responses and one-way frames queued by many coroutines in one
// turn of the loop go out in one gathered write (small bodies copied next to
// their header, large ones and segments written in place), under the caps on
// queued output.
#include <corodist/net/connection.hpp>

#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "net/tls_stream.hpp"

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <cstring>
#include <limits>
#include <span>
#include <sys/socket.h>

namespace corodist::net {

namespace {

// Bodies up to this size are copied next to their header (one iovec per batch);
// larger ones are written in place.
constexpr std::size_t copy_threshold = 2048;
// A turn of the loop that queues this many small frames on a connection sends
// them at once (non-blocking) instead of at the end of the turn, so that the
// peer works on them while this side makes the rest: with many requests in
// flight, waiting for the end of the turn left each side idle while the other
// worked (RPC calls with 64 in flight: 149,000/s -> 265,000/s on this project's
// 2-vCPU VMs; 16 and 64 frames did less well).
constexpr std::size_t eager_send_frames = 32;
// A write buffer larger than this is freed once written, not kept for reuse.
constexpr std::size_t release_above = 1 << 20;

using clock = std::chrono::steady_clock;

// Completion condition "everything", without the 64 KiB cap per system call
// that Asio's transfer_all() applies (default_max_transfer_size): with it, a
// 64 MiB frame took 1,024 sendmsg and 1,024 recvmsg operations, each a trip
// through the loop.
struct transfer_all_uncapped {
  std::size_t operator()(const std::error_code& ec, std::size_t) const noexcept {
    return ec ? 0 : std::numeric_limits<std::uint32_t>::max();
  }
};

} // namespace

void connection::batch::clear() noexcept {
  if (stage.capacity() > release_above)
    bytes().swap(stage); // a burst is over: give its memory back
  else
    stage.clear();
  large.clear();
}

std::error_code connection::enqueue(frame_header h, bytes&& body, std::vector<segment>&& segments) {
  if (!open_)
    return errc::connection_closed;
  std::size_t len = body.size();
  for (auto& s : segments)
    len += s.data.size();
  if (len > opts_.max_frame_size)
    return errc::frame_too_large;
  h.payload_len = static_cast<std::uint32_t>(len);
  CORODIST_LOG_TRACE("net: to {}: kind {}, request {}, flags 0x{:x}, {} bytes", detail::endpoint_text(remote_), h.kind,
                     h.request_id, unsigned(h.flags), len);
  // Everything this connection holds unwritten counts: what is queued and the
  // write in flight (a peer that does not read holds that one forever). The
  // caps are checked before the frame is copied into the queue, so a refused
  // frame never grows it. A frame alone, with nothing else unwritten, is
  // always accepted.
  const std::size_t frame_bytes = header_size + len;
  const std::size_t held = queued_bytes_ + writing_bytes_ + frame_bytes;
  if (held > opts_.max_buffered_output && held > frame_bytes) {
    CORODIST_LOG_WARN("closing connection to {}: the peer does not read ({} bytes of output unwritten, cap {})",
                      detail::endpoint_text(remote_), held, opts_.max_buffered_output);
    close(errc::output_overflow);
    return errc::output_overflow;
  }
  const std::size_t shared = opts_.shared_output ? opts_.shared_output->add(frame_bytes) : 0;
  if (opts_.shared_output && shared > opts_.shared_output->limit() && held >= opts_.shared_output->limit() / 4 &&
      held > frame_bytes) {
    opts_.shared_output->remove(frame_bytes);
    CORODIST_LOG_WARN("closing connection to {}: the peer does not read ({} bytes of output unwritten for it; its "
                      "group of connections holds {}, cap {})",
                      detail::endpoint_text(remote_), held, shared, opts_.shared_output->limit());
    close(errc::output_overflow);
    return errc::output_overflow;
  }
  queued_bytes_ += frame_bytes;
  auto hdr = encode(h);
  auto& st = queued_.stage;
  if (segments.empty() && body.size() <= copy_threshold) {
    st.insert(st.end(), hdr.begin(), hdr.end());
    st.insert(st.end(), body.begin(), body.end());
  } else {
    st.insert(st.end(), hdr.begin(), hdr.end());
    queued_.large.push_back(large_frame{st.size(), std::move(body), std::move(segments)});
  }
  if (++queued_frames_ >= eager_send_frames && !writing_ && queued_.large.empty())
    send_queued_now();
  schedule_write();
  return {};
}

void connection::send_queued_now() {
  queued_frames_ = 0;
  if (uring_ != nullptr || tls_)
    return; // no descriptor to send on at once (or TLS records to make): the write takes all of it
  auto& st = queued_.stage;
  // No write is in flight and every queued frame is in `stage`: a plain
  // non-blocking send keeps the byte order. What the socket does not take now
  // (or an error, which the write then meets and closes on) goes the usual way.
  const auto n = ::send(socket_.native_handle(), st.data(), st.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n <= 0)
    return;
  const auto sent = static_cast<std::size_t>(n);
  sent_at_ = clock::now();
  if (opts_.shared_output)
    opts_.shared_output->remove(sent);
  queued_bytes_ -= sent;
  st.erase(st.begin(), st.begin() + static_cast<std::ptrdiff_t>(sent));
}

void connection::schedule_write() {
  if (writing_ || write_scheduled_)
    return;
  write_scheduled_ = true;
  if (parsing_) { // (a handler of a frame just read: a reply, or a call its caller makes next)
    // Started when the read's frames are all handled: what they queue goes
    // out in one write, with no trip through the loop's queue.
    write_after_parse_ = true;
    return;
  }
  // Deferred to the end of this turn of the loop, so that frames queued by
  // other coroutines meanwhile go out in the same gathered write.
  asio::post(socket_.get_executor(), [self = shared_from_this()] {
    self->write_scheduled_ = false;
    self->start_write();
  });
}

void connection::start_write() {
  if (writing_ || !open_ || (queued_.stage.empty() && queued_.large.empty()))
    return;
  if (uring_ == nullptr && !tls_ && queued_.large.empty()) {
    // Small frames only, and the socket usually takes them all at once: a
    // plain non-blocking send costs one system call and no trip through the
    // ring (a submission, a completion, a handler). The rest, if any, or an
    // error, goes the usual way.
    send_queued_now();
    if (queued_.stage.empty()) {
      written_at_ = sent_at_;
      if (on_written_) {
        auto h = on_written_; // (it may replace itself)
        h();
      }
      return;
    }
  }
  writing_ = true;
  sent_at_ = clock::now(); // (heartbeats: this side is not silent)
  queued_frames_ = 0;
  std::swap(queued_, writing_batch_);
  writing_bytes_ = queued_bytes_; // still held (and counted) until written
  queued_bytes_ = 0;
  // Asio's completion (the ring path ends in write_done() itself).
  auto on_asio = [this] {
    return [self = shared_from_this()](std::error_code ec, std::size_t) { self->write_done(ec); };
  };
  const auto& b = writing_batch_;
  if (uring_ != nullptr && b.large.empty()) {
    iov_.assign(1, asio::buffer(b.stage));
    uring_write();
    return;
  }
  if (b.large.empty()) {
    // Small frames only: one buffer, and an operation sized for one (the
    // gathered write's operation holds room for 64 iovecs, 1.6 KB).
    if (tls_) {
      iov_.assign(1, asio::buffer(b.stage));
      tls_->async_write_all(iov_, on_asio());
    } else
      asio::async_write(socket_, asio::buffer(b.stage), transfer_all_uncapped{}, on_asio());
    return;
  }
  iov_.clear();
  std::size_t pos = 0;
  for (auto& f : b.large) {
    iov_.push_back(asio::buffer(b.stage.data() + pos, f.stage_offset - pos));
    pos = f.stage_offset;
    if (!f.body.empty())
      iov_.push_back(asio::buffer(f.body));
    for (auto& s : f.segments)
      if (s.data.size())
        iov_.push_back(s.data);
  }
  if (pos < b.stage.size())
    iov_.push_back(asio::buffer(b.stage.data() + pos, b.stage.size() - pos));
  if (uring_ != nullptr) {
    uring_write();
    return;
  }
  if (tls_) {
    tls_->async_write_all(iov_, on_asio());
    return;
  }
  asio::async_write(socket_, std::span<const asio::const_buffer>(iov_), transfer_all_uncapped{}, on_asio());
}

void connection::write_done(std::error_code ec) {
  writing_ = false;
  writing_batch_.clear();
  if (opts_.shared_output)
    opts_.shared_output->remove(writing_bytes_); // written (or dropped): no longer held
  writing_bytes_ = 0;
  if (ec) {
    if (open_)
      CORODIST_LOG_DEBUG("write to {} failed: {}", detail::endpoint_text(remote_), ec.message());
    close(errc::connection_closed);
    return;
  }
  written_at_ = clock::now();
  start_write();
  if (on_written_) {
    auto h = on_written_; // (it may replace itself)
    h();
  }
}

asio::awaitable<response> connection::request(std::uint16_t kind, bytes payload, std::vector<segment> segments) {
  return request(kind, std::move(payload), std::move(segments), opts_.request_timeout.from());
}

asio::awaitable<response> connection::request(std::uint16_t kind, bytes payload, std::vector<segment> segments,
                                              corodist::deadline by) {
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable), void(response)>(
      [this, kind, &payload, &segments, by](auto handler) {
        auto slot = asio::get_associated_cancellation_slot(handler);
        if (slot.is_connected())
          slot.assign([w = weak_from_this(), id = next_id_](asio::cancellation_type) {
            if (auto self = w.lock())
              self->cancel_request(id);
          });
        start_request(kind, std::move(payload), std::move(segments), by,
                      [h = std::move(handler), slot](response r) mutable {
                        auto ex = asio::get_associated_executor(h);
                        asio::post(ex, [h = std::move(h), slot, r = std::move(r)]() mutable {
                          if (slot.is_connected())
                            slot.clear();
                          std::move(h)(std::move(r));
                        });
                      });
      },
      asio::use_awaitable);
}

void connection::start_request(std::uint16_t kind, bytes payload, std::vector<segment> segments,
                               corodist::deadline by, corodist::unique_function<void(response)> done) {
  const std::uint64_t id = next_id_++; // (taken even if not sent: a cancel naming it finds nothing)
  std::error_code ec;
  if (by.expired())
    ec = errc::request_timeout;
  else if (!open_)
    ec = errc::connection_closed;
  else if (pending_.size() >= opts_.max_pending_requests)
    ec = errc::too_many_pending;
  else
    ec = enqueue(frame_header{0, kind, 0, id}, std::move(payload), std::move(segments));
  if (ec) {
    done(response{ec, {}});
    return;
  }
  const auto deadline = by.at();
  pending_.emplace(id, pending_request{std::move(done), deadline});
  if (deadline != clock::time_point::max())
    arm_timer(deadline);
}

std::error_code connection::respond(std::uint64_t request_id, std::uint16_t kind, bytes payload,
                                    std::vector<segment> segments) {
  return enqueue(frame_header{0, kind, frame_flags::response, request_id}, std::move(payload), std::move(segments));
}

std::error_code connection::respond_error(std::uint64_t request_id, std::uint16_t kind, std::string_view text) {
  bytes b(text.size());
  std::memcpy(b.data(), text.data(), text.size());
  return enqueue(frame_header{0, kind, frame_flags::response | frame_flags::error, request_id}, std::move(b), {});
}

std::error_code connection::send(std::uint16_t kind, bytes payload, std::vector<segment> segments) {
  return enqueue(frame_header{0, kind, frame_flags::one_way, 0}, std::move(payload), std::move(segments));
}

} // namespace corodist::net
