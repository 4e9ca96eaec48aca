#include "store/server/torch_session.hpp"

#include <corodist/net/frame.hpp>

#include "core/deadline.hpp"
#include "core/log.hpp"
#include "net/endpoint_text.hpp"
#include "store/server/heap_trim.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/write.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

namespace corodist::store::detail::torch {

namespace {
using corodist::detail::use_tuple;
constexpr std::size_t read_chunk = 64 * 1024;

} // namespace

session::session(asio::ip::tcp::socket socket, std::shared_ptr<engine> eng, engine::owner_id id,
                 std::size_t max_output, std::function<void()> on_close)
    : socket_(std::move(socket)), engine_(std::move(eng)), id_(id), max_output_(max_output),
      on_close_(std::move(on_close)),
      // at context shutdown (final): close only, nothing else is safe to touch
      registration_(socket_.get_executor(), [this](bool final) { finish(!final); }) {
  peer_ = net::detail::peer_text(socket_);
  std::error_code ec;
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);
}

session::~session() = default;

void session::start(std::function<void(asio::ip::tcp::socket)> late_hello) {
  asio::co_spawn(socket_.get_executor(), run(std::move(late_hello)), asio::detached);
}

void session::close() { finish(true); }

void session::finish(bool notify) {
  if (closed_)
    return;
  closed_ = true;
  std::error_code ignored;
  socket_.close(ignored);
  if (notify && on_close_)
    on_close_(); // drops this session's waits
  on_close_ = nullptr;
}

asio::awaitable<void> session::run(std::function<void(asio::ip::tcp::socket)> late_hello) {
  auto self = shared_from_this();
  if (late_hello) { // a silent connection: look at its first byte without taking it
    std::array<std::uint8_t, 1> first{};
    auto [ec, n] = co_await socket_.async_receive(asio::buffer(first), asio::socket_base::message_peek, use_tuple);
    if (!ec && n == 1 && first[0] == static_cast<std::uint8_t>(net::protocol_magic & 0xff) && !closed_) {
      CORODIST_LOG_DEBUG("store: {} was silent past the handshake timeout, then sent a native hello", peer_);
      auto socket = std::move(socket_);
      close();
      late_hello(std::move(socket));
      co_return;
    }
  }
  // Largest query accepted: one maximal value and key with room for framing,
  // and at least 4 maximal values (a MULTI_SET).
  const auto& limits = engine_->limits();
  const std::size_t max_query =
      std::max(limits.max_value_size + 2 * limits.max_key_size + 1024 * 1024, 4 * limits.max_value_size);
  std::vector<std::uint8_t> buf(read_chunk);
  std::size_t begin = 0, end = 0;
  while (!closed_) {
    try {
      while (end > begin && !closed_) {
        auto used = serve_one(std::span<const std::uint8_t>(buf.data() + begin, end - begin));
        if (used == 0)
          break;
        begin += used;
      }
    } catch (const std::exception& e) {
      CORODIST_LOG_WARN("store: closing PyTorch TCPStore client {}: {}", peer_, e.what());
      break;
    }
    flush(); // every response this read produced, in one write
    if (closed_)
      break;
    if (begin == end) {
      begin = end = 0;
      if (buf.size() > read_chunk) // a large query is done: give its memory back
        std::vector<std::uint8_t>(read_chunk).swap(buf);
    } else if (begin > 0) {
      std::memmove(buf.data(), buf.data() + begin, end - begin);
      end -= begin;
      begin = 0;
    }
    if (buf.size() - end < read_chunk / 4) {
      if (buf.size() >= max_query) {
        CORODIST_LOG_WARN("store: closing PyTorch TCPStore client {}: query larger than {} bytes", peer_, max_query);
        break;
      }
      buf.resize(std::min(max_query, buf.size() * 2));
      largest_buffer_ = std::max(largest_buffer_, buf.size());
    }
    auto [ec, n] = co_await socket_.async_read_some(asio::buffer(buf.data() + end, buf.size() - end), use_tuple);
    if (ec) {
      if (ec != asio::error::eof && ec != asio::error::operation_aborted && ec != asio::error::connection_reset)
        CORODIST_LOG_DEBUG("store: PyTorch TCPStore client {} read failed: {}", peer_, ec.message());
      break;
    }
    end += n;
  }
  close();
  buf = {};
  trim_heap_after(largest_buffer_);
}

std::size_t session::serve_one(std::span<const std::uint8_t> input) {
  if (!version_) {
    version_ = detect_version(input);
    if (!version_)
      return 0;
    CORODIST_LOG_DEBUG("store: {} speaks the PyTorch {} TCPStore protocol", peer_, version_name(*version_));
  }
  // A WAIT over this connection's limits is refused (the connection closed:
  // the protocol has no error reply) before its keys are copied.
  auto d = decode_query(*version_, input, engine_->limits(),
                        [this](std::span<const std::string_view> keys) { engine_->admit_wait(keys, id_); });
  if (!d)
    return 0;
  // Responses are encoded straight into the output queue, and only once the
  // whole query has been decoded (an incomplete one leaves nothing behind).
  const auto queued_before = out_.size();
  serve(std::move(d->q));
  // (A WAIT answered at once has flushed out_ already: then nothing was added here.)
  if (out_.size() > queued_before)
    check_output(out_.size() - queued_before);
  return d->size;
}

void session::serve(query&& next) {
  encoder reply(out_);
  auto& eng = *engine_;
  std::visit(
      [&](auto&& q) {
        using Q = std::decay_t<decltype(q)>;
        if constexpr (std::is_same_v<Q, validate_query>) {
          // checked by the decoder; no response
        } else if constexpr (std::is_same_v<Q, ping_query>) {
          reply.u32(q.nonce);
        } else if constexpr (std::is_same_v<Q, set_query>) {
          eng.set(std::move(q.key), std::move(q.value)); // no response
        } else if constexpr (std::is_same_v<Q, append_query>) {
          eng.append(q.key, q.value); // no response
        } else if constexpr (std::is_same_v<Q, compare_set_query>) {
          // As PyTorch's master: a key it creates wakes no WAIT (the next SET or ADD does).
          reply.bytes(eng.compare_set(q.key, q.expected, std::move(q.desired), false));
        } else if constexpr (std::is_same_v<Q, get_query>) {
          auto* v = eng.get(q.key); // the client WAITs first; a key deleted since reads as empty
          reply.bytes(v ? std::string_view(*v) : std::string_view());
        } else if constexpr (std::is_same_v<Q, add_query>) {
          // Read and summed as PyTorch's master does; a value with no leading integer
          // throws (the connection closes, as that master's does: no error reply).
          reply.i64(eng.add(q.key, q.delta, engine::counter_text::like_stoll));
        } else if constexpr (std::is_same_v<Q, check_query>) {
          reply.u8(eng.check(q.keys) ? check_ready : check_not_ready);
        } else if constexpr (std::is_same_v<Q, wait_query>) {
          // No server deadline, as in PyTorch: the client times out (2.x then sends
          // CANCEL_WAIT); the wait goes when the connection does. Answered when the
          // keys exist (possibly at once, here).
          eng.wait(std::move(q.keys), std::chrono::milliseconds(0), id_,
                   [w = weak_from_this()](std::vector<std::string>&&, std::vector<std::string>&& missing) {
                     auto self = w.lock();
                     if (!self || self->closed_ || !missing.empty())
                       return;
                     const char stop = static_cast<char>(wait_stop_waiting);
                     self->queue_output(std::string_view(&stop, 1));
                     self->flush();
                   });
        } else if constexpr (std::is_same_v<Q, num_keys_query>) {
          reply.i64(static_cast<std::int64_t>(eng.size()));
        } else if constexpr (std::is_same_v<Q, delete_key_query>) {
          reply.i64(eng.erase(q.key) ? 1 : 0);
        } else if constexpr (std::is_same_v<Q, multi_get_query>) {
          for (auto& v : eng.values(q.keys))
            reply.bytes(v);
        } else if constexpr (std::is_same_v<Q, multi_set_query>) {
          eng.multi_set(std::move(q.keys), std::move(q.values)); // no response
        } else if constexpr (std::is_same_v<Q, cancel_wait_query>) {
          eng.drop_owner(id_); // this session's pending waits (it has no watches)
          reply.u8(wait_canceled);
        } else if constexpr (std::is_same_v<Q, queue_push_query>) {
          eng.queue_push(q.key, std::move(q.value)); // no response
        } else if constexpr (std::is_same_v<Q, queue_pop_query>) {
          std::size_t size = 0;
          auto v = eng.queue_pop(q.key, size);
          reply.i64(static_cast<std::int64_t>(size)); // the length before the pop, then the value if there was one
          if (v)
            reply.bytes(*v);
        } else if constexpr (std::is_same_v<Q, queue_len_query>) {
          reply.i64(static_cast<std::int64_t>(eng.queue_len(q.key)));
        } else {
          static_assert(!sizeof(Q), "every query is served");
        }
      },
      next);
}

void session::queue_output(std::string_view bytes) {
  if (closed_)
    return;
  out_ += bytes;
  check_output(bytes.size());
}

void session::check_output(std::size_t added) {
  const auto queued = out_.size() + sending_.size();
  if (queued > max_output_ && queued > added) {
    CORODIST_LOG_WARN("store: dropping PyTorch TCPStore client {}: it does not read its responses ({} bytes queued)",
                      peer_, queued);
    close();
  }
}

void session::flush() {
  if (writing_ || out_.empty() || closed_)
    return;
  writing_ = true;
  sending_.swap(out_);
  out_.clear();
  asio::async_write(socket_, asio::buffer(sending_), [self = shared_from_this()](std::error_code ec, std::size_t) {
    self->writing_ = false;
    self->sending_.clear();
    if (ec) {
      self->close();
      return;
    }
    self->flush();
  });
}

} // namespace corodist::store::detail::torch
