#pragma once
/// \file
/// Where a rank's output goes before the launcher reads it: its stdout is a
/// pseudo-terminal of its own (so that C stdio, which fully buffers a pipe,
/// line-buffers it and a killed rank's printed lines are not lost), its
/// stderr a pipe; and, with --log-dir, the files each stream is copied to.

#include <string>

namespace corodist::tools::launch {

/// The two ends of a rank's output channel; each end closes at scope exit.
class output_channel {
public:
  /// A pseudo-terminal in raw mode (no "\r\n", no echo) when `terminal` is
  /// true and the system has one (/dev/ptmx), else a pipe. Throws
  /// std::system_error when not even a pipe can be made.
  explicit output_channel(bool terminal);
  ~output_channel();
  output_channel(const output_channel&) = delete;
  output_channel& operator=(const output_channel&) = delete;

  /// The end the rank writes (close-on-exec; the spawn dup2s it onto 1 or 2).
  int write_end() const noexcept { return write_; }
  /// Gives up the end the launcher reads (close-on-exec; the caller owns it).
  int release_read_end() noexcept;
  /// True when the channel is a pseudo-terminal.
  bool terminal() const noexcept { return terminal_; }

private:
  int read_ = -1;
  int write_ = -1;
  bool terminal_ = false;
};

/// Opens (creating the folders) DIR/attempt_GENERATION/RANK/NAME for
/// appending, close-on-exec; returns the descriptor. Throws std::system_error
/// naming the path when it cannot be created.
int open_rank_log(const std::string& dir, long long generation, int rank, const std::string& name);

} // namespace corodist::tools::launch
