#pragma once
/// \file
/// One output stream of a rank (a pipe, or the master side of the rank's
/// pseudo-terminal): what the rank wrote, copied to the launcher's stdout or
/// stderr line by line, each line prefixed with "[RANK] ", and, with
/// --log-dir, to the rank's log file as written.

#include <cstddef>
#include <deque>
#include <string>

namespace corodist::tools::launch {

/// A line longer than this is cut into pieces of this size.
inline constexpr std::size_t max_line_bytes = 64 * 1024;
/// Each line kept for a failure report is cut at this size.
inline constexpr std::size_t tail_line_bytes = 1024;

/// Reads a rank's output descriptor (non-blocking, owned) and copies it to
/// `dest_fd` line by line, each line prefixed. Used from the supervisor's
/// thread only.
class prefixed_stream {
public:
  /// Takes `fd` (made non-blocking, closed by this object); keeps the last
  /// `keep_lines` lines for tail(). `log_fd` (owned; -1 for none) receives
  /// every complete line without the prefix.
  prefixed_stream(int fd, int dest_fd, std::string prefix, std::size_t keep_lines = 0, int log_fd = -1);
  prefixed_stream(const prefixed_stream&) = delete;
  prefixed_stream& operator=(const prefixed_stream&) = delete;
  ~prefixed_stream();

  /// The descriptor to poll (-1 once closed).
  int fd() const noexcept { return fd_; }
  /// The last `keep_lines` lines passed on (without prefix or newline), oldest first.
  const std::deque<std::string>& tail() const noexcept { return tail_; }
  /// False once the stream ended.
  bool open() const noexcept { return fd_ >= 0; }

  /// Reads what is there; at end of stream (or EIO: a pseudo-terminal whose
  /// last writer closed) emits the partial last line and closes.
  void on_readable();
  /// Emits the partial last line (with a newline added) and closes the stream.
  void finish();

private:
  void emit_lines();
  // Keeps pending_[from, to) as the newest line of the tail (cut at tail_line_bytes).
  void keep(std::size_t from, std::size_t to);
  void close();

  int fd_;
  int dest_fd_;
  int log_fd_;
  std::string prefix_;
  std::string pending_;
  std::size_t keep_lines_;
  std::deque<std::string> tail_;
};

} // namespace corodist::tools::launch
