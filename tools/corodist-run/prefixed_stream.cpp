#include "prefixed_stream.hpp"

#include "output.hpp"

#include <algorithm>
#include <cerrno>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

namespace corodist::tools::launch {

prefixed_stream::prefixed_stream(int fd, int dest_fd, std::string prefix, std::size_t keep_lines, int log_fd)
    : fd_(fd), dest_fd_(dest_fd), log_fd_(log_fd), prefix_(std::move(prefix)), keep_lines_(keep_lines) {
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
}

prefixed_stream::~prefixed_stream() { close(); }

void prefixed_stream::on_readable() {
  char chunk[16384];
  for (;;) {
    auto n = ::read(fd_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (n <= 0) {
      finish();
      return;
    }
    pending_.append(chunk, static_cast<std::size_t>(n));
    emit_lines();
  }
}

void prefixed_stream::finish() {
  if (!pending_.empty()) {
    pending_ += '\n';
    emit_lines();
  }
  close();
}

void prefixed_stream::emit_lines() {
  std::string out;
  std::size_t start = 0;
  for (;;) {
    auto nl = pending_.find('\n', start);
    if (nl == std::string::npos) {
      if (pending_.size() - start < max_line_bytes)
        break;
      nl = start + max_line_bytes - 1; // an overlong line: pass this piece on as a line of its own
      out += prefix_;
      out.append(pending_, start, nl + 1 - start);
      out += '\n';
      keep(start, nl + 1);
      start = nl + 1;
      continue;
    }
    out += prefix_;
    out.append(pending_, start, nl + 1 - start);
    keep(start, nl);
    start = nl + 1;
  }
  if (log_fd_ >= 0)
    write_all(log_fd_, pending_.data(), start); // as the rank wrote it (a cut overlong line stays whole)
  pending_.erase(0, start);
  write_all(dest_fd_, out.data(), out.size());
}

void prefixed_stream::keep(std::size_t from, std::size_t to) {
  if (keep_lines_ == 0)
    return;
  tail_.push_back(pending_.substr(from, std::min(to - from, tail_line_bytes)));
  if (tail_.size() > keep_lines_)
    tail_.pop_front();
}

void prefixed_stream::close() {
  if (fd_ >= 0)
    ::close(std::exchange(fd_, -1));
  if (log_fd_ >= 0)
    ::close(std::exchange(log_fd_, -1));
}

} // namespace corodist::tools::launch
