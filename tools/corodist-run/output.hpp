#pragma once
/// \file
/// corodist-run's own messages: whole writes to a descriptor and the
/// launcher's "corodist-run: ..." lines on stderr.

#include <cstddef>
#include <string>

namespace corodist::tools::launch {

/// Writes all of [p, p+n) to `fd`, retrying on EINTR; stops quietly when the
/// descriptor is gone (EPIPE): the launcher keeps supervising the ranks.
void write_all(int fd, const char* p, std::size_t n);

/// Writes "corodist-run: TEXT\n" to stderr in one write.
void say(const std::string& text);

/// "1.5 s" for 1.5.
std::string fmt_seconds(double s);

} // namespace corodist::tools::launch
