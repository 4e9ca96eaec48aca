#pragma once
/// \file
/// corodist::rpc::stream_writer: the writing end of an RPC stream (a server
/// streaming handler's output, a bidirectional stream's either side).

#include <corodist/core/config.hpp>

#include <corodist/rpc/detail/stream_core.hpp>
#include <corodist/rpc/stream_stats.hpp>

#include <asio/awaitable.hpp>

#include <memory>
#include <utility>

namespace corodist::rpc {

/// Writes items of type T (msgpack-encoded as call arguments are;
/// `rpc::attachment` values inside travel as zero-copy attachments) to the
/// other end of a stream, within the window of items and bytes that end's
/// reader grants (agent_options::stream_window_items / stream_window_bytes of
/// the reading agent): a writer whose window is spent waits in write() until
/// the reader has taken items. Small items written in one turn of the loop go
/// out together in one frame.
///
/// Loop-affine: use it on the agent's loop (a stream function runs there; a
/// client coroutine is spawned on the agent's loop). Move-only.
template <typename T>
class stream_writer {
public:
  stream_writer() = default;
  explicit stream_writer(std::shared_ptr<detail::stream_core> core) : core_(std::move(core)) {}
  stream_writer(stream_writer&&) noexcept = default;
  stream_writer& operator=(stream_writer&&) noexcept = default;

  /// Writes `v`: encoded at once, sent now or at the end of this turn of the
  /// loop. Waits first while the reader's window is spent. Throws
  /// cancelled_error (the stream was cancelled at either end),
  /// timeout_error (its deadline passed), connection_error /
  /// peer_lost_error (the connection is gone), usage_error (after close()
  /// or off the loop), or what packing `v` throws (nothing is sent then).
  /// Cancellation: terminal, partial and total through the awaiting
  /// coroutine's cancellation slot: a wait for credit ends with
  /// `operation_aborted` and `v` is not sent; the stream stays usable.
  [[nodiscard]] asio::awaitable<void> write(const T& v) {
    core_->require_loop("stream_writer::write");
    core_->check_writable();
    if (!core_->has_credit())
      co_await core_->wait_credit();
    auto sink = core_->begin_item();
    try {
      codec_scope scope(core_->encode_context());
      msgpack::packer<detail::stream_core::item_sink> pk(sink);
      pack_value(pk, v);
    } catch (...) {
      core_->abort_item();
      throw;
    }
    core_->end_item();
  }

  /// Ends the writing: the reader's next() returns nullopt after the items
  /// written. A server handler's writer is closed when the handler returns;
  /// a bidirectional stream's client closes its side with close_write().
  /// Idempotent. Loop only.
  void close() { core_->close_write(); }

  /// Cancels the stream: the other end's next read or write throws
  /// cancelled_error (a server's handler is cancelled: its pending operation
  /// ends with `operation_aborted`). Any thread.
  void cancel() { core_->cancel(); }

  /// Whether write() would not wait for credit now. Loop only.
  bool has_credit() const noexcept { return core_->has_credit(); }
  /// This end's counters. Loop only.
  stream_stats stats() const noexcept { return core_->stats(); }

private:
  std::shared_ptr<detail::stream_core> core_;
};

} // namespace corodist::rpc
