// Reads the body of a frame too large for the read buffer into a buffer of
// its own, whose memory follows the bytes that really arrive and is touched a
// step per turn of the loop.
#include <corodist/net/connection.hpp>

#include "net/buffer_cache.hpp"

#include <asio/post.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <cstring>

namespace corodist::net {

namespace {

// A large frame's body starts with room for this much, and grows x4 as it arrives.
constexpr std::size_t first_large_buffer = 16 * 1024;
// The most one read of a large frame's body takes (between reads, the loop runs others).
constexpr std::size_t large_read_chunk = 4 * 1024 * 1024;
// The most fresh memory a large frame touches per turn of the loop. The first touch of
// a page is what costs (the kernel zeroes it): 0.4 ms per MiB measured on this
// project's VMs, so a 16 MiB growth copy done at once held the loop for 25 ms and
// more. In steps of this size, timers and other connections run in between.
constexpr std::size_t touch_step = 512 * 1024;

} // namespace

// The body of a frame too large for the read buffer, whose header (and first
// bytes) are in carry_. Memory follows the data: a cached buffer for the whole
// frame if there is one (the process holds it already), else a buffer that
// starts at 16 KiB and grows fourfold each time it fills, so a peer that
// declares a large frame and sends little of it holds little.
asio::awaitable<void> connection::read_large_frame(frame_header h) {
  // The body's memory follows its bytes: room is reserved in steps (x4 from
  // 16 KiB), and only the chunk about to be read is initialised; each read
  // takes at most large_read_chunk, and fresh memory is touched (copied into or
  // initialised) at most touch_step per turn of the loop, so that one frame does
  // not hold the loop for long.
  const std::size_t len = h.payload_len;
  std::size_t got = carry_.size() - header_size;
  bytes body = detail::take_cached_buffer(len); // sized len, or empty
  if (body.empty()) {
    body.reserve(std::min(len, std::max(first_large_buffer, got)));
    body.assign(carry_.begin() + header_size, carry_.end());
  } else {
    std::memcpy(body.data(), carry_.data() + header_size, got);
  }
  carry_ = bytes();
  // Before touching n more bytes of fresh memory: lets the loop run other handlers
  // once this turn has touched touch_step; false when the connection closed meanwhile.
  std::size_t touched = 0; // this turn
  auto may_touch = [this, &touched](std::size_t n) -> asio::awaitable<bool> {
    if (touched > 0 && touched + n > touch_step) {
      // Twice: what a handler posts runs before the loop next polls for completions
      // (timers, other connections); what that one posts, after them.
      co_await asio::post(socket_.get_executor(), asio::use_awaitable);
      co_await asio::post(socket_.get_executor(), asio::use_awaitable);
      touched = 0;
    }
    touched += n;
    co_return open_;
  };
  while (got < len) {
    if (got == body.capacity()) {
      // The intermediate sizes are neither taken from the cache nor offered to
      // it: the cache is for buffers of the sizes frames really have.
      bytes bigger = detail::take_cached_buffer(len);
      if (bigger.empty()) {
        const std::size_t next = std::min(len, body.capacity() * 4);
        bigger = next == len ? detail::reserved_buffer(len) : bytes();
        if (next != len)
          bigger.reserve(next);
        for (std::size_t from = 0; from < got;) {
          const std::size_t n = std::min(touch_step, got - from);
          if (!co_await may_touch(n))
            co_return;
          bigger.insert(bigger.end(), body.begin() + static_cast<std::ptrdiff_t>(from),
                        body.begin() + static_cast<std::ptrdiff_t>(from + n));
          from += n;
        }
      } else {
        std::memcpy(bigger.data(), body.data(), got); // a recycled buffer: its pages are mapped
      }
      detail::free_buffer(std::move(body)); // outgrown: its pages go back to the system
      body = std::move(bigger);
    }
    const std::size_t chunk = std::min({len - got, large_read_chunk, body.capacity() - got});
    while (body.size() < got + chunk) {
      const std::size_t n = std::min(got + chunk - body.size(), touch_step);
      if (!co_await may_touch(n))
        co_return;
      body.resize(body.size() + n);
    }
    auto [ec, n] = co_await read_frame_bytes(asio::buffer(body.data() + got, chunk), true);
    touched = 0; // the read was a turn of its own
    if (ec) {
      on_read_error(ec, header_size + got);
      co_return;
    }
    got += n;
  }
  body.resize(len);
  dispatch(message{h, std::move(body)});
}

} // namespace corodist::net
