#pragma once
// Test helper: the library's log lines captured while a log_capture lives,
// with a wait for lines that contain a text (woken by each line, not polling).

#include "core/log.hpp"

#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace corodist::test {

/// Captures the library's log lines (their text, without the pattern) from
/// construction to destruction. Construct and destroy it while no other
/// thread logs (before the test's loops start, after they stop).
class log_capture {
public:
  log_capture() : sink_(std::make_shared<sink>()) { corodist::detail::logger().sinks().push_back(sink_); }
  ~log_capture() { std::erase(corodist::detail::logger().sinks(), sink_); }
  log_capture(const log_capture&) = delete;
  log_capture& operator=(const log_capture&) = delete;

  /// Waits up to `limit` until `count` lines contain `text`; returns the
  /// lines that do (fewer when the limit passed first).
  std::vector<std::string> wait_for(const std::string& text, std::size_t count = 1,
                                    std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::unique_lock lock(sink_->mutex);
    sink_->changed.wait_for(lock, limit, [&] { return matching(text).size() >= count; });
    return matching(text);
  }

  /// The lines so far that contain `text`.
  std::vector<std::string> lines(const std::string& text) {
    std::lock_guard lock(sink_->mutex);
    return matching(text);
  }

private:
  struct sink : spdlog::sinks::base_sink<spdlog::details::null_mutex> {
    void sink_it_(const spdlog::details::log_msg& msg) override {
      {
        std::lock_guard lock(mutex);
        lines.emplace_back(msg.payload.data(), msg.payload.size());
      }
      changed.notify_all();
    }
    void flush_() override {}

    std::mutex mutex;
    std::condition_variable changed;
    std::vector<std::string> lines;
  };

  // Call with the sink's mutex held.
  std::vector<std::string> matching(const std::string& text) const {
    std::vector<std::string> out;
    for (auto& l : sink_->lines)
      if (l.find(text) != std::string::npos)
        out.push_back(l);
    return out;
  }

  std::shared_ptr<sink> sink_;
};

} // namespace corodist::test
