#pragma once
/// \file
/// corodist::rpc::bidi_stream: the client's end of a bidirectional stream
/// (agent::open_bidi): it writes items of W and reads items of R.

#include <corodist/core/config.hpp>

#include <corodist/rpc/stream_reader.hpp>
#include <corodist/rpc/stream_writer.hpp>

#include <memory>
#include <optional>
#include <utility>

namespace corodist::rpc {

/// One stream object with both directions: write() / close_write() as
/// stream_writer<W>, next() / next_sync() as stream_reader<R>; each
/// direction has its own credit window. Client streaming is this with a
/// handler that reads to the end and then writes its one result. Dropping it
/// before both directions ended cancels the stream. Move-only.
template <typename W, typename R>
class bidi_stream {
public:
  bidi_stream() = default;
  explicit bidi_stream(std::shared_ptr<detail::stream_core> core)
      : writer_(core), reader_(std::move(core), /*owning=*/true) {}

  /// As stream_writer::write (loop only). Cancellation: as there (terminal,
  /// partial, total): a wait for credit ends with `operation_aborted`, `v` is
  /// not sent, and the stream stays usable.
  [[nodiscard]] asio::awaitable<void> write(const W& v) { return writer_.write(v); }
  /// Ends this side's writing: the handler's reader returns nullopt after the
  /// items written. Idempotent. Loop only.
  void close_write() { writer_.close(); }
  /// As stream_reader::next (loop only). Cancellation: as there (terminal,
  /// partial, total): the wait ends with `operation_aborted`, no item is
  /// taken, and the stream stays usable.
  [[nodiscard]] asio::awaitable<std::optional<R>> next() { return reader_.next(); }
  /// As stream_reader::next_sync (plain threads).
  std::optional<R> next_sync() { return reader_.next_sync(); }
  /// Cancels both directions (as stream_reader::cancel). Any thread.
  void cancel() { reader_.cancel(); }
  /// This end's counters (both directions). Loop only.
  stream_stats stats() const noexcept { return reader_.stats(); }

private:
  stream_writer<W> writer_;
  stream_reader<R> reader_;
};

} // namespace corodist::rpc
