// The input side of a connection: the posted read, whose completion parses
// frames out of what arrived and hands each to dispatch(), keeping only an
// incomplete frame's bytes for a coroutine that completes it.
#include <corodist/net/connection.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "net/connection_counting.hpp"
#include "net/connection_io.hpp"
#include "net/endpoint_text.hpp"
#include "net/tls_stream.hpp"

#include <asio/bind_allocator.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/use_awaitable.hpp>

#if CORODIST_IO_URING
#include "net/uring_service.hpp"
#endif

#include <atomic>
#include <cstring>
#include <sys/socket.h>

namespace corodist::net {

namespace {

using corodist::detail::use_tuple;
// Size of the per-thread read buffer; a frame that does not fit is read straight
// into its own buffer.
constexpr std::size_t read_buffer_size = 64 * 1024;

} // namespace

std::size_t connection::parse(const std::byte* data, std::size_t n) {
  std::size_t used = 0;
  while (open_ && n - used >= header_size) {
    auto h = decode_header(data + used);
    if (h.payload_len > opts_.max_frame_size) {
      CORODIST_LOG_WARN("closing connection from {}: frame of {} bytes exceeds max_frame_size {}",
                        detail::endpoint_text(remote_), h.payload_len, opts_.max_frame_size);
      close(errc::frame_too_large);
      return used;
    }
    if (n - used - header_size < h.payload_len)
      break; // incomplete
    const auto* p = data + used + header_size;
    used += header_size + h.payload_len;
    dispatch(message{h, bytes(p, p + h.payload_len)});
  }
  return used;
}

void connection::on_read_error(std::error_code ec, std::size_t frame_bytes) {
  if (!open_)
    return;
  if (ec == errc::frame_stalled) {
    CORODIST_LOG_INFO("closing connection from {}: no byte of an incomplete frame for {} ms ({} bytes of it received)",
                      detail::endpoint_text(remote_), opts_.frame_timeout.length().count(), frame_bytes);
    close(errc::frame_stalled);
    return;
  }
  if (frame_bytes > 0) {
    CORODIST_LOG_WARN("connection from {} closed in the middle of a frame ({} bytes buffered): {}",
                      detail::endpoint_text(remote_), frame_bytes, ec.message());
    close(errc::truncated_frame);
    return;
  }
  if (ec != asio::error::eof && ec != asio::ssl::error::stream_truncated) { // (a TLS peer's close without close_notify)
    CORODIST_LOG_DEBUG("connection from {} lost: {}", detail::endpoint_text(remote_), ec.message());
    if (started_ && ec != asio::error::operation_aborted)
      detail::bump(detail::counting().lost);
  }
  close(errc::connection_closed);
}

// The posted read's operation is made in the connection's io_->read_memory (one
// read is posted at a time); a larger one (another build of Asio) falls back
// to the heap. Without it the operation came from Asio's per-thread recycling
// cache, which hands out any cached block large enough: an idle connection's
// read then kept whatever the last write or coroutine had freed (1.6 KB for a
// gathered write's operation).
template <typename T>
class connection::read_op_allocator {
public:
  using value_type = T;
  explicit read_op_allocator(read_op_memory& m) noexcept : memory_(&m) {}
  template <typename U>
  read_op_allocator(const read_op_allocator<U>& other) noexcept : memory_(other.memory_) {}

  T* allocate(std::size_t n) {
    const std::size_t size = sizeof(T) * n;
    if (!memory_->in_use && size <= read_op_memory::size && alignof(T) <= alignof(std::max_align_t)) {
      memory_->in_use = true;
      return reinterpret_cast<T*>(memory_->storage);
    }
    if (!memory_->in_use) {
      static std::atomic<bool> told{false};
      if (!told.exchange(true))
        CORODIST_LOG_DEBUG("net: a read operation of {} bytes does not fit the connection's {} (heap instead)", size,
                           read_op_memory::size);
    }
    return static_cast<T*>(::operator new(size));
  }
  void deallocate(T* p, std::size_t) noexcept {
    if (reinterpret_cast<std::byte*>(p) == memory_->storage)
      memory_->in_use = false;
    else
      ::operator delete(p);
  }
  template <typename U>
  bool operator==(const read_op_allocator<U>& other) const noexcept {
    return memory_ == other.memory_;
  }
  template <typename U>
  bool operator!=(const read_op_allocator<U>& other) const noexcept {
    return memory_ != other.memory_;
  }

private:
  template <typename U>
  friend class read_op_allocator;
  read_op_memory* memory_;
};

// An idle connection holds a 512-byte read buffer (head_) and its posted read:
// the operation, in io_->read_memory, and nothing else (no coroutine frame).
// What follows a full head_ is drained into a per-thread scratch buffer, and
// frames are parsed straight from there. Only the bytes of an incomplete
// frame are kept, in carry_, and completed by a coroutine (read_incomplete)
// that posts the idle read again when done; a frame too large for the scratch
// buffer is read directly into its own payload buffer.
//
// The fd stays in blocking mode: with it, Asio's io_uring backend hands whole
// recvmsg/sendmsg operations to the kernel; a readiness wait + non-blocking
// recv instead was measured 2x slower for 1 MiB frames. The drain uses MSG_DONTWAIT.
void connection::post_read() {
  // Keep a read posted so the kernel completes it the moment data arrives:
  // into the 512-byte head_ while traffic is light, into a 64 KiB buffer of
  // the connection's own while reads keep filling the small one.
  const bool big = !big_.empty();
  auto done = asio::bind_allocator(read_op_allocator<void>(io_->read_memory),
                                   [self = shared_from_this(), big](std::error_code ec, std::size_t got) {
                                     self->on_read(ec, got, big);
                                   });
#if CORODIST_IO_URING
  if (uring_ != nullptr) {
    uring_->async_recv(detail::uring_file{io_->ring, io_->slot}, big ? asio::buffer(big_) : asio::buffer(head_),
                       std::move(done));
    return;
  }
#endif
  if (tls_) {
    tls_->async_read_some(big ? asio::buffer(big_) : asio::buffer(head_), std::move(done));
    return;
  }
  socket_.async_read_some(big ? asio::buffer(big_) : asio::buffer(head_), std::move(done));
}

void connection::on_read(std::error_code rec, std::size_t got, bool big) {
  thread_local bytes scratch(read_buffer_size);
  if (rec) {
    on_read_error(rec, 0);
    return;
  }
  if (!open_)
    return; // closed meanwhile (a loop draining at its destruction): touch no buffer
  try {
    received_at_ = std::chrono::steady_clock::now(); // the peer is alive (peer_timeout)
    std::byte* data = big_.data();
    std::size_t n = got;
    if (!big) {
      data = scratch.data();
      std::memcpy(data, head_.data(), got);
      if (got == head_.size()) { // more is probably waiting: drain it without waiting
        if (uring_ == nullptr && !tls_) { // (on the ring there is no descriptor, and TLS bytes are records: the next read takes it)
          const ssize_t more = ::recv(socket_.native_handle(), data + n, scratch.size() - n, MSG_DONTWAIT);
          if (more > 0)
            n += static_cast<std::size_t>(more); // errors and EOF surface on the next read
        }
        big_.resize(read_buffer_size);
      }
    } else if (got <= head_.size()) {
      scratch_hold_.swap(big_); // light traffic again: release the big buffer once parsed
    }
    parsing_ = true;
    const std::size_t used = parse(data, n);
    parsing_ = false;
    if (open_ && used < n)
      carry_.assign(data + used, data + n);
    scratch_hold_ = bytes();
  } catch (const std::exception& e) {
    parsing_ = false;
    CORODIST_LOG_ERROR("connection from {}: read failed: {}", detail::endpoint_text(remote_), e.what());
    close(errc::connection_closed);
    return;
  }
  if (!open_)
    return;
  if (write_after_parse_) { // what the frames' handlers queued
    write_after_parse_ = false;
    write_scheduled_ = false;
    start_write();
  }
  if (read_paused_) {
    read_parked_ = true; // resume_reading() goes on from here
    parked_hold_ = shared_from_this();
    return;
  }
  if (carry_.empty())
    post_read();
  else
    asio::co_spawn(socket_.get_executor(), read_incomplete(), asio::detached);
}

void connection::pause_reading() noexcept { read_paused_ = true; }

void connection::resume_reading() {
  if (!read_paused_)
    return;
  read_paused_ = false;
  if (!read_parked_ || !open_)
    return; // the read loop still runs: it reads on
  read_parked_ = false;
  auto keep = std::move(parked_hold_); // (the read posted now holds it)
  // The silence was this side's: peer_timeout counts from now.
  received_at_ = std::chrono::steady_clock::now();
  if (carry_.empty())
    post_read();
  else
    asio::co_spawn(socket_.get_executor(), read_incomplete(), asio::detached);
}

asio::awaitable<void> connection::read_incomplete() {
  auto self = shared_from_this();
  try {
    while (open_ && !carry_.empty() && !read_paused_) {
      std::size_t want = read_buffer_size;
      if (carry_.size() >= header_size) {
        auto h = decode_header(carry_.data());
        if (header_size + h.payload_len > read_buffer_size) {
          co_await read_large_frame(h);
          continue;
        }
        want = header_size + h.payload_len; // no more than this frame needs
      }
      const std::size_t have = carry_.size();
      carry_.resize(want);
      auto [rec, n] = co_await read_frame_bytes(asio::buffer(carry_.data() + have, want - have), false);
      carry_.resize(have + (rec ? 0 : n));
      if (rec) {
        on_read_error(rec, carry_.size());
        co_return;
      }
      std::size_t used = parse(carry_.data(), carry_.size());
      if (!open_)
        co_return;
      if (used == carry_.size())
        carry_ = bytes(); // release: idle connections keep no buffer
      else if (used > 0)
        carry_.erase(carry_.begin(), carry_.begin() + static_cast<std::ptrdiff_t>(used));
    }
  } catch (const std::exception& e) {
    CORODIST_LOG_ERROR("connection from {}: read loop failed: {}", detail::endpoint_text(remote_), e.what());
    close(errc::connection_closed);
    co_return;
  }
  if (!open_)
    co_return;
  if (read_paused_) {
    read_parked_ = true; // (with carry_ kept) resume_reading() goes on from here
    parked_hold_ = std::move(self);
  } else {
    post_read(); // (the loop above ends open and unpaused only with carry_ empty)
  }
}

} // namespace corodist::net
