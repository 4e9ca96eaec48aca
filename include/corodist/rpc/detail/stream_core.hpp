#pragma once
/// \file
/// One end of an RPC stream, type-erased (the templates of stream_reader,
/// stream_writer and bidi_stream build on it; src/rpc/stream_core.cpp has the
/// rest): the items batched for the connection, the credit window each way,
/// the items received (decoded by the reader's typed inbox), and how the
/// stream ends. Loop-affine: every member runs on the agent's loop, except
/// where noted.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>
#include <corodist/net/connection.hpp>
#include <corodist/rpc/codec.hpp>
#include <corodist/rpc/detail/call_state.hpp>
#include <corodist/rpc/stream_stats.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/steady_timer.hpp>

#include <atomic>

#include <msgpack.hpp>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace corodist::rpc::detail {

class stream_table;

/// The items that arrived and are not yet read, decoded by the reader's type.
class stream_inbox {
public:
  virtual ~stream_inbox() = default;
  /// Decodes one item (its codec_context current) and queues it; throws
  /// value_type_error when it does not decode.
  virtual void accept(const msgpack::object& item, std::size_t bytes) = 0;
  virtual void clear() noexcept = 0;
  virtual std::size_t size() const noexcept = 0;
};

/// The inbox of a reader of T.
template <typename T>
class typed_inbox final : public stream_inbox {
public:
  struct entry {
    T value;
    std::size_t bytes;
  };
  void accept(const msgpack::object& item, std::size_t bytes) override {
    items.push_back(entry{decode_value<T>(item), bytes});
  }
  void clear() noexcept override { items.clear(); }
  std::size_t size() const noexcept override { return items.size(); }
  std::deque<entry> items;
};

/// How a stream was opened: items from the server only, or both ways.
enum class stream_mode : std::uint8_t { server = 0, bidi = 1 };

class stream_core : public std::enable_shared_from_this<stream_core> {
public:
  enum class role : std::uint8_t { client, server };

  /// `what` names the stream in errors ("stream 'f' on worker 'w1'");
  /// `window_items` / `window_bytes`: this end's receive window.
  stream_core(asio::any_io_executor ex, role r, std::uint64_t id, int peer, std::string what, stream_mode mode,
              std::size_t window_items, std::size_t window_bytes);
  ~stream_core();
  stream_core(const stream_core&) = delete;
  stream_core& operator=(const stream_core&) = delete;

  // ---- set up by the stream table ----
  void set_table(std::weak_ptr<stream_table> t) { table_ = std::move(t); }
  /// The port items are encoded and decoded for (attachments, upper layers'
  /// values), this worker's rank, and the peer's worker name (for errors).
  void set_port(message_port* port, int self, std::string peer_name);
  void set_inbox(std::unique_ptr<stream_inbox> in) { inbox_ = std::move(in); }
  /// The server function's call state: a cancel from the client sets its
  /// `cancelled` (call_context::cancelled()).
  void set_call_state(std::shared_ptr<call_state> s) { call_state_ = std::move(s); }
  /// The connection frames go on (the client learns it from the open's reply
  /// or the first frame that arrives).
  void attach(const std::shared_ptr<net::connection>& conn);
  const std::shared_ptr<net::connection>& connection() const noexcept { return conn_; }
  /// The peer's receive window: what this end's writer may have unacknowledged.
  void grant_initial(std::size_t items, std::size_t bytes);
  /// Fails the stream at `by` with timeout_error (and cancels it at the peer).
  void arm_deadline(corodist::deadline by);
  /// The signal that cancels the server's handler coroutine.
  asio::cancellation_signal& handler_signal() noexcept { return handler_signal_; }
  void set_handler_running(bool r) noexcept { handler_running_ = r; }

  // ---- writing ----
  /// Throws the error that ended writing (cancelled_error, timeout_error,
  /// connection_error, usage_error after close), if any.
  void check_writable() const;
  /// Whether the window allows one more item now.
  bool has_credit() const noexcept;
  /// Sends what is batched, then waits until has_credit() or the stream
  /// fails (throws its error); the awaiting coroutine's cancellation ends the
  /// wait with operation_aborted.
  asio::awaitable<void> wait_credit();
  /// The msgpack sink an item is packed into (between begin_item and end_item).
  struct item_sink {
    stream_core* core;
    void write(const char* p, std::size_t n) {
      const auto* b = reinterpret_cast<const std::byte*>(p);
      core->batch_.insert(core->batch_.end(), b, b + n);
    }
  };
  /// Starts packing an item: its codec_context must be made current (codec_scope) while packing.
  item_sink begin_item();
  codec_context& encode_context() noexcept { return out_ctx_; }
  /// Ends it: counted against the window and sent now or at the end of this turn of the loop.
  void end_item();
  /// Drops a partly packed item (its packing threw).
  void abort_item() noexcept;
  /// Ends this end's writing: what is batched, then the end frame. Idempotent.
  void close_write();
  /// Ends this end's writing with `e` (the server's handler threw): the
  /// reader gets it as remote_error after the items.
  void fail_write(const std::exception_ptr& e, const std::string& self_name);

  // ---- reading ----
  stream_inbox* inbox() noexcept { return inbox_.get(); }
  /// Waits until an item is buffered (true) or the stream ended normally
  /// (false); throws the stream's error once the items before it are read.
  /// The awaiting coroutine's cancellation ends the wait with operation_aborted.
  asio::awaitable<bool> wait_readable();
  /// The reader took an item of `bytes`: its credit goes back to the writer.
  void consumed(std::size_t bytes);

  // ---- either ----
  /// Cancels the stream from this end: the peer is told, and both ends' next
  /// reads and writes throw cancelled_error. Any thread. No-op once finished.
  void cancel();
  /// A frame for this stream arrived on `conn` (its 8-byte stream id already read).
  void on_frame(std::uint16_t kind, net::bytes&& frame, const std::shared_ptr<net::connection>& conn);
  /// Fails the stream here with `e` (a timeout, a lost peer, the agent's
  /// shutdown); `tell_peer`: send the peer a cancel frame.
  /// `at_once`: the reader sees it before the items still buffered (they
  /// are dropped); else after them.
  void fail(std::exception_ptr e, bool tell_peer, bool at_once = true);
  /// The server's handler returned (or threw): nothing more is written.
  void handler_done() noexcept;
  /// Nothing more will happen on this end (both directions ended).
  bool finished() const noexcept;
  stream_stats stats() const noexcept;
  std::uint64_t id() const noexcept { return id_; }
  int peer() const noexcept { return peer_; }
  role side() const noexcept { return role_; }
  stream_mode mode() const noexcept { return mode_; }
  const std::string& what() const noexcept { return what_; }
  const asio::any_io_executor& executor() const noexcept { return ex_; }
  /// Throws usage_error unless called on the agent's loop.
  void require_loop(const char* op) const;

private:
  void flush();
  void schedule_flush();
  void send_control(std::uint16_t kind, const std::byte* extra = nullptr, std::size_t n = 0);
  /// Sends an error frame (an error reply's payload) to the reader.
  void send_failure(payload p);
  void on_items(net::bytes&& frame);
  void on_credit(const net::bytes& frame);
  void wake_reader() noexcept;
  void wake_writer() noexcept;
  void maybe_release();
  bool read_done() const noexcept;
  bool write_done() const noexcept;

  const asio::any_io_executor ex_;
  const role role_;
  const std::uint64_t id_;
  const int peer_;
  const std::string what_;
  const stream_mode mode_;
  std::weak_ptr<stream_table> table_;
  std::shared_ptr<net::connection> conn_;
  message_port* port_ = nullptr;
  int self_ = -1;
  std::string peer_name_;
  std::shared_ptr<call_state> call_state_; // the server's; null on a client

  // writing
  std::size_t send_items_limit_ = 0; // the peer's window
  std::size_t send_bytes_limit_ = 0;
  std::size_t unacked_items_ = 0;
  std::size_t unacked_bytes_ = 0;
  bool granted_ = false;             // the peer's window is known
  net::bytes batch_;                 // the items frame being filled
  codec_context out_ctx_;            // its attachments and records
  std::size_t batch_items_ = 0;
  std::size_t batch_reserve_ = 256; // what the next batch reserves (the last one's size)
  std::size_t batch_bytes_ = 0;      // with attachments
  std::size_t item_start_ = 0;
  std::size_t item_attachments_ = 0;
  bool flush_posted_ = false;
  bool write_closed_ = false;
  std::exception_ptr write_error_;
  std::uint64_t items_sent_ = 0;
  std::uint64_t credit_waits_ = 0;
  std::unique_ptr<asio::steady_timer> write_wake_;

  // reading
  std::unique_ptr<stream_inbox> inbox_;
  std::size_t recv_items_window_;
  std::size_t recv_bytes_window_;
  std::size_t owed_items_ = 0; // consumed, not yet returned as credit
  std::size_t owed_bytes_ = 0;
  bool read_ended_ = false;    // end frame received
  std::exception_ptr read_error_;
  bool read_error_now_ = false; // delivered before the buffered items (local cancel, timeout)
  std::uint64_t items_received_ = 0;
  std::unique_ptr<asio::steady_timer> read_wake_;

  std::unique_ptr<asio::steady_timer> deadline_timer_;
  asio::cancellation_signal handler_signal_;
  bool handler_running_ = false;
  bool cancelled_ = false;
  bool released_ = false;
  std::atomic<bool> over_{false}; // released (any thread): cancel() from elsewhere posts nothing then
};

} // namespace corodist::rpc::detail
