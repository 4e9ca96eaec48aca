// One end of an RPC stream: items batched into frames, the credit window each
// way, items received and decoded into the reader's inbox, and the ways a
// stream ends (end, error, cancel, deadline, a lost connection).
#include <corodist/rpc/detail/stream_core.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/little_endian.hpp>
#include <corodist/net/buffer.hpp>
#include <corodist/rpc/errors.hpp>
#include <corodist/rpc/message_port.hpp>

#include "core/deadline.hpp"
#include "rpc/error_reply.hpp"
#include "rpc/object_budget.hpp"
#include "rpc/protocol.hpp"
#include "rpc/stream_table.hpp"

#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>

#include <algorithm>
#include <cstring>

namespace corodist::rpc::detail {

namespace {
constexpr std::size_t id_size = 8;
constexpr std::size_t items_header = 16; // id, count, attachment count
// A batch is handed to the connection once it holds this much (items and attachments).
constexpr std::size_t flush_at = 64 * 1024;
constexpr std::uint32_t has_attachment_bytes = 0x80000000u;
constexpr std::size_t max_item_length = has_attachment_bytes - 1;
using clock = std::chrono::steady_clock;
} // namespace

stream_core::stream_core(asio::any_io_executor ex, role r, std::uint64_t id, int peer, std::string what,
                         stream_mode mode, std::size_t window_items, std::size_t window_bytes)
    : ex_(std::move(ex)), role_(r), id_(id), peer_(peer), what_(std::move(what)), mode_(mode),
      recv_items_window_(std::max<std::size_t>(window_items, 1)),
      recv_bytes_window_(std::max<std::size_t>(window_bytes, 1)) {
  out_ctx_.direction = codec_context::mode::encode;
  out_ctx_.peer = peer;
}

stream_core::~stream_core() = default;

void stream_core::set_port(message_port* port, int self, std::string peer_name) {
  port_ = port;
  self_ = self;
  peer_name_ = std::move(peer_name);
  out_ctx_.port = port;
  out_ctx_.self = self;
}

void stream_core::require_loop(const char* op) const {
  const auto* io = ex_.target<asio::io_context::executor_type>();
  if (io && !io->running_in_this_thread())
    throw usage_error(std::string("rpc: ") + op + " must run on the agent's event loop (" + what_ + ")");
}

void stream_core::attach(const std::shared_ptr<net::connection>& conn) {
  if (conn_ || !conn)
    return;
  conn_ = conn;
  if (cancelled_) { // cancelled before the open's reply came: tell the server now
    send_control(kind_stream_cancel);
    return;
  }
  if (batch_items_ > 0)
    schedule_flush();
}

void stream_core::grant_initial(std::size_t items, std::size_t bytes) {
  send_items_limit_ = std::max<std::size_t>(items, 1);
  send_bytes_limit_ = std::max<std::size_t>(bytes, 1);
  granted_ = true;
  wake_writer();
}

void stream_core::arm_deadline(corodist::deadline by) {
  if (by.is_never())
    return;
  deadline_timer_ = std::make_unique<asio::steady_timer>(ex_, by.at());
  const auto length = std::chrono::ceil<std::chrono::milliseconds>(by.remaining());
  deadline_timer_->async_wait([w = weak_from_this(), length](std::error_code ec) {
    if (ec)
      return;
    auto s = w.lock();
    if (!s)
      return;
    const std::string why = "its deadline (" + std::to_string(length.count()) + " ms) passed";
    if (s->role_ == role::server && !s->write_done()) {
      // The client learns it as a timeout (its own timer may come later).
      s->write_closed_ = true;
      s->send_failure(encode_failure(failure::deadline, "rpc", "stream cancelled: " + why));
      s->fail(std::make_exception_ptr(timeout_error(s->what_ + ": " + why)), /*tell_peer=*/false);
    } else {
      // A client does not send a cancel: the server's own timer ends its
      // function at the same deadline, and its call_context::cancelled()
      // stays false (a timeout is not a cancel).
      s->fail(std::make_exception_ptr(timeout_error(s->what_ + ": " + why)), /*tell_peer=*/s->role_ == role::server);
    }
  });
}

// ---- writing -------------------------------------------------------------------

bool stream_core::write_done() const noexcept { return write_closed_ || write_error_ != nullptr; }

void stream_core::check_writable() const {
  if (write_error_)
    std::rethrow_exception(write_error_);
  if (write_closed_)
    throw usage_error(what_ + ": written after its writer was closed");
}

bool stream_core::has_credit() const noexcept {
  return granted_ && unacked_items_ < send_items_limit_ && unacked_bytes_ < send_bytes_limit_;
}

asio::awaitable<void> stream_core::wait_credit() {
  auto self = shared_from_this();
  ++credit_waits_;
  flush();
  if (!write_wake_)
    write_wake_ = std::make_unique<asio::steady_timer>(ex_);
  for (;;) {
    check_writable();
    if (has_credit())
      co_return;
    write_wake_->expires_at(clock::time_point::max());
    co_await write_wake_->async_wait(corodist::detail::use_tuple);
    const asio::cancellation_state cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none)
      throw std::system_error(asio::error::operation_aborted, what_ + ": write cancelled");
  }
}

stream_core::item_sink stream_core::begin_item() {
  if (batch_items_ == 0) {
    batch_.clear();
    batch_.reserve(batch_reserve_); // the size of the last batch: one allocation per frame
    batch_.resize(items_header);
    corodist::store_le(batch_.data(), id_);
  }
  item_start_ = batch_.size();
  item_attachments_ = out_ctx_.out_attachments.size();
  batch_.resize(item_start_ + 4);
  return item_sink{this};
}

void stream_core::abort_item() noexcept {
  batch_.resize(item_start_);
  out_ctx_.out_attachments.resize(item_attachments_);
  if (batch_items_ == 0)
    batch_.clear();
}

void stream_core::end_item() {
  const std::size_t len = batch_.size() - item_start_ - 4;
  if (len > max_item_length) {
    abort_item();
    throw usage_error(what_ + ": an item of " + std::to_string(len) + " bytes (its msgpack) is too large");
  }
  std::size_t att = 0;
  for (std::size_t i = item_attachments_; i < out_ctx_.out_attachments.size(); ++i)
    att += out_ctx_.out_attachments[i].data.size();
  auto word = static_cast<std::uint32_t>(len);
  if (att > 0) {
    word |= has_attachment_bytes;
    const std::size_t at = batch_.size();
    batch_.resize(at + 8);
    corodist::store_le(batch_.data() + at, static_cast<std::uint64_t>(att));
  }
  corodist::store_le(batch_.data() + item_start_, word);
  const std::size_t bytes = len + att;
  ++batch_items_;
  batch_bytes_ += bytes + 4;
  ++unacked_items_;
  unacked_bytes_ += bytes;
  // An idle connection takes the item at once (its latency); while it is busy
  // writing, items gather in the batch until the end of this turn of the loop.
  if (batch_bytes_ >= flush_at || !has_credit() || (conn_ && conn_->buffered_output() == 0))
    flush();
  else
    schedule_flush();
}

void stream_core::schedule_flush() {
  if (flush_posted_)
    return;
  flush_posted_ = true;
  asio::post(ex_, [self = shared_from_this()] {
    self->flush_posted_ = false;
    self->flush();
  });
}

void stream_core::flush() {
  if (batch_items_ == 0 || !conn_ || write_error_)
    return;
  auto& atts = out_ctx_.out_attachments;
  corodist::store_le(batch_.data() + 8, static_cast<std::uint32_t>(batch_items_));
  corodist::store_le(batch_.data() + 12, static_cast<std::uint32_t>(atts.size()));
  const std::size_t table = batch_.size();
  batch_.resize(table + 8 * atts.size());
  for (std::size_t i = 0; i < atts.size(); ++i)
    corodist::store_le(batch_.data() + table + 8 * i, static_cast<std::uint64_t>(atts[i].data.size()));
  batch_reserve_ = std::clamp<std::size_t>(batch_.size() + 64, 256, 2 * flush_at);
  auto ec = conn_->send(kind_stream_items, std::move(batch_), std::move(atts));
  items_sent_ += batch_items_;
  batch_ = {};
  atts.clear();
  out_ctx_.records.clear(); // (upper layers' records: the frame is queued)
  batch_items_ = 0;
  batch_bytes_ = 0;
  if (ec)
    fail(std::make_exception_ptr(connection_error(what_ + ": cannot send: " + ec.message())), false);
}

void stream_core::close_write() {
  if (write_done())
    return;
  flush();
  write_closed_ = true;
  send_control(kind_stream_end);
  wake_writer();
  maybe_release();
}

void stream_core::fail_write(const std::exception_ptr& e, const std::string& self_name) {
  if (write_done())
    return;
  flush();
  write_closed_ = true;
  send_failure(encode_exception(e, self_name));
  maybe_release();
}

void stream_core::send_failure(payload p) {
  if (!conn_ || !conn_->is_open())
    return;
  net::bytes frame(id_size + p.body.size());
  corodist::store_le(frame.data(), id_);
  std::memcpy(frame.data() + id_size, p.body.data(), p.body.size());
  conn_->send(kind_stream_error, std::move(frame), std::move(p.attachments));
}

void stream_core::send_control(std::uint16_t kind, const std::byte* extra, std::size_t n) {
  if (!conn_ || !conn_->is_open())
    return;
  net::bytes b(id_size + n);
  corodist::store_le(b.data(), id_);
  if (n > 0)
    std::memcpy(b.data() + id_size, extra, n);
  conn_->send(kind, std::move(b));
}

void stream_core::wake_writer() noexcept {
  if (write_wake_)
    write_wake_->cancel();
}

// ---- reading -------------------------------------------------------------------

bool stream_core::read_done() const noexcept { return !inbox_ || read_ended_ || read_error_ != nullptr; }

asio::awaitable<bool> stream_core::wait_readable() {
  auto self = shared_from_this();
  if (!read_wake_)
    read_wake_ = std::make_unique<asio::steady_timer>(ex_);
  for (;;) {
    if (read_error_ && read_error_now_)
      std::rethrow_exception(read_error_);
    if (inbox_->size() > 0)
      co_return true;
    if (read_error_)
      std::rethrow_exception(read_error_);
    if (read_ended_)
      co_return false;
    flush(); // a bidirectional client's items, before it waits for the answers
    read_wake_->expires_at(clock::time_point::max());
    co_await read_wake_->async_wait(corodist::detail::use_tuple);
    const asio::cancellation_state cs = co_await asio::this_coro::cancellation_state;
    if (cs.cancelled() != asio::cancellation_type::none)
      throw std::system_error(asio::error::operation_aborted, what_ + ": read cancelled");
  }
}

void stream_core::consumed(std::size_t bytes) {
  ++owed_items_;
  owed_bytes_ += bytes;
  if (read_done())
    return;
  if (owed_items_ >= std::max<std::size_t>(recv_items_window_ / 4, 1) ||
      owed_bytes_ >= std::max<std::size_t>(recv_bytes_window_ / 4, 1) || inbox_->size() == 0) {
    std::byte b[12];
    corodist::store_le(b, static_cast<std::uint32_t>(owed_items_));
    corodist::store_le(b + 4, static_cast<std::uint64_t>(owed_bytes_));
    send_control(kind_stream_credit, b, sizeof b);
    owed_items_ = 0;
    owed_bytes_ = 0;
  }
}

void stream_core::wake_reader() noexcept {
  if (read_wake_)
    read_wake_->cancel();
}

void stream_core::on_frame(std::uint16_t kind, net::bytes&& frame, const std::shared_ptr<net::connection>& conn) {
  attach(conn);
  switch (kind) {
  case kind_stream_items:
    on_items(std::move(frame));
    break;
  case kind_stream_credit:
    on_credit(frame);
    break;
  case kind_stream_end:
    if (!read_done()) {
      read_ended_ = true;
      wake_reader();
    }
    if (role_ == role::client && !write_done()) // the handler returned: nobody reads what this side writes
      write_error_ = std::make_exception_ptr(usage_error(what_ + ": the stream function has returned"));
    wake_writer();
    maybe_release();
    break;
  case kind_stream_error: {
    net::bytes rest(frame.begin() + static_cast<std::ptrdiff_t>(id_size), frame.end());
    auto e = decode_failure(peer_name_, what_, std::move(rest));
    if (!read_done())
      read_error_ = e;
    if (!write_done())
      write_error_ = e;
    wake_reader();
    wake_writer();
    maybe_release();
    break;
  }
  case kind_stream_cancel:
    if (call_state_ && !call_state_->deadline.expired()) // (the client's deadline sends one too)
      call_state_->cancelled.store(true, std::memory_order_relaxed);
    fail(std::make_exception_ptr(cancelled_error(what_, "worker '" + peer_name_ + "'")), false);
    break;
  default:
    fail(std::make_exception_ptr(protocol_error(what_ + ": a frame of unknown kind " + std::to_string(kind))), true);
    break;
  }
}

void stream_core::on_credit(const net::bytes& frame) {
  if (frame.size() < id_size + 12) {
    fail(std::make_exception_ptr(protocol_error(what_ + ": a short credit frame")), true);
    return;
  }
  const auto items = corodist::load_le<std::uint32_t>(frame.data() + id_size);
  const auto bytes = corodist::load_le<std::uint64_t>(frame.data() + id_size + 4);
  unacked_items_ -= std::min<std::size_t>(unacked_items_, items);
  unacked_bytes_ -= std::min<std::size_t>(unacked_bytes_, bytes);
  wake_writer();
}

void stream_core::on_items(net::bytes&& frame) {
  if (read_done())
    return; // (cancelled or failed here: late items are dropped)
  auto bad = [this](const std::string& why) {
    fail(std::make_exception_ptr(protocol_error(what_ + ": a malformed items frame: " + why)), true);
  };
  const std::size_t n = frame.size();
  if (n < items_header)
    return bad("shorter than its header");
  const auto count = corodist::load_le<std::uint32_t>(frame.data() + 8);
  const auto natt = corodist::load_le<std::uint32_t>(frame.data() + 12);
  struct extent {
    std::size_t at, len, bytes;
  };
  std::vector<extent> items;
  items.reserve(std::min<std::size_t>(count, n / 4));
  std::size_t pos = items_header;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (n - pos < 4)
      return bad("item " + std::to_string(i) + " passes its end");
    const auto word = corodist::load_le<std::uint32_t>(frame.data() + pos);
    pos += 4;
    const std::size_t len = word & ~has_attachment_bytes;
    if (len > n - pos)
      return bad("item " + std::to_string(i) + " passes its end");
    std::size_t bytes = len;
    const std::size_t at = pos;
    pos += len;
    if (word & has_attachment_bytes) {
      if (n - pos < 8)
        return bad("item " + std::to_string(i) + " passes its end");
      bytes += corodist::load_le<std::uint64_t>(frame.data() + pos);
      pos += 8;
    }
    items.push_back(extent{at, len, bytes});
  }
  if (natt > (n - pos) / 8)
    return bad("its attachment table passes its end");
  codec_context ctx;
  if (port_)
    port_->decode_context(peer_, ctx);
  ctx.direction = codec_context::mode::decode;
  const std::size_t table = pos;
  pos += 8 * std::size_t{natt};
  ctx.in_attachments.reserve(natt);
  for (std::uint32_t i = 0; i < natt; ++i) {
    const auto len = corodist::load_le<std::uint64_t>(frame.data() + table + 8 * i);
    if (len > n - pos)
      return bad("attachment " + std::to_string(i) + " passes its end");
    ctx.in_attachments.emplace_back(frame.data() + pos, static_cast<std::size_t>(len));
    pos += static_cast<std::size_t>(len);
  }
  auto owner = net::share_buffer(std::move(frame)); // (the spans above stay valid: the buffer moved, not its bytes)
  ctx.in_owner = owner;
  const auto* base = reinterpret_cast<const char*>(owner->data());
  try {
    // Count before building, as for a call's body: what the frame's items may
    // decode into is bounded by the frame.
    const std::size_t budget = object_budget(n);
    std::size_t objects = 0;
    for (auto& it : items) {
      objects += count_objects(base + it.at, it.len, budget - std::min(objects, budget));
      if (objects > budget)
        throw protocol_error("its " + std::to_string(n) + " bytes of items would decode into more than " +
                             std::to_string(budget) + " msgpack objects; send bulk data as rpc::attachment");
    }
    codec_scope scope(ctx);
    msgpack::zone zone(512); // (a small first chunk: msgpack's 8 KiB default is a "large" malloc)
    for (auto& it : items) {
      std::size_t off = 0;
      // Strings and binaries are viewed in the frame (alive through `owner`), not copied.
      msgpack::object o = msgpack::unpack(
          zone, base + it.at, it.len, off, [](msgpack::type::object_type, std::size_t, void*) { return true; },
          nullptr, msgpack::unpack_limit(it.len, it.len / 2, it.len, it.len, it.len, 256));
      if (off != it.len)
        throw protocol_error("an item has bytes after its msgpack value");
      inbox_->accept(o, it.bytes);
      ++items_received_;
    }
  } catch (const value_type_error& e) {
    fail(std::make_exception_ptr(bad_result_error(what_, peer_name_, std::string("an item: ") + e.what())), true,
         false);
    return;
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  wake_reader();
}

// ---- either end ------------------------------------------------------------------

bool stream_core::finished() const noexcept {
  if (role_ == role::server)
    return !handler_running_;
  return read_done() && (mode_ == stream_mode::server || write_done());
}

void stream_core::fail(std::exception_ptr e, bool tell_peer, bool at_once) {
  if (released_)
    return;
  if (tell_peer) {
    if (conn_)
      send_control(kind_stream_cancel);
    else
      cancelled_ = true; // sent once the connection is known (attach)
  }
  if (!read_done()) {
    read_error_ = e;
    read_error_now_ = at_once;
    if (at_once && inbox_)
      inbox_->clear();
  }
  if (!write_done()) {
    write_error_ = e;
    batch_.clear();
    out_ctx_.out_attachments.clear();
    out_ctx_.records.clear();
    batch_items_ = 0;
    batch_bytes_ = 0;
  }
  if (deadline_timer_)
    deadline_timer_->cancel();
  wake_reader();
  wake_writer();
  if (role_ == role::server && handler_running_)
    asio::post(ex_, [self = shared_from_this()] { self->handler_signal_.emit(asio::cancellation_type::terminal); });
  maybe_release();
}

void stream_core::cancel() {
  const auto* io = ex_.target<asio::io_context::executor_type>();
  if (io && !io->running_in_this_thread()) {
    // (A stream the agent's close has ended posts nothing: its loop may be gone.)
    if (!over_.load())
      asio::post(ex_, [self = shared_from_this()] { self->cancel(); });
    return;
  }
  if (released_ || finished())
    return;
  fail(std::make_exception_ptr(cancelled_error(what_, "this side")), /*tell_peer=*/true);
}

void stream_core::handler_done() noexcept {
  handler_running_ = false;
  maybe_release();
}

void stream_core::maybe_release() {
  if (released_ || !finished())
    return;
  released_ = true;
  over_ = true;
  if (deadline_timer_)
    deadline_timer_->cancel();
  if (auto t = table_.lock())
    t->release(*this);
}

stream_stats stream_core::stats() const noexcept {
  stream_stats s;
  s.items_sent = items_sent_;
  s.items_received = items_received_;
  s.credit_waits = credit_waits_;
  s.items_unacknowledged = unacked_items_;
  s.bytes_unacknowledged = unacked_bytes_;
  s.items_batched = batch_items_;
  s.items_buffered = inbox_ ? inbox_->size() : 0;
  return s;
}

} // namespace corodist::rpc::detail
