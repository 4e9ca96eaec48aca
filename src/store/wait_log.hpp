#pragma once
// Waiting made visible (private): when a long wait warns, and the log of one
// store's waits in progress, which warns about each wait while it lasts,
// naming its keys and where they are awaited.

#include <asio/any_io_executor.hpp>

#include <chrono>
#include <span>
#include <string>

namespace corodist::store::detail {

/// When a wait that lasts (connecting, a rendezvous, a store wait) warns,
/// naming what it awaits: once after `first`, early enough to tell a wrong
/// address or a missing rank at once, then every `every`.
struct warning_schedule {
  static constexpr std::chrono::milliseconds default_first{std::chrono::seconds(5)};
  static constexpr std::chrono::milliseconds default_every{std::chrono::seconds(30)};
  std::chrono::milliseconds first = default_first;
  std::chrono::milliseconds every = default_every;
};

/// The schedule of the waits that start now (5 s, then every 30 s). Any thread.
warning_schedule warnings() noexcept;

/// Sets the schedule of the waits that start from now on (tests shorten it);
/// returns the one it replaces. Any thread.
warning_schedule set_warnings(warning_schedule s) noexcept;

/// The long waits of one store. It holds no I/O object of its own (a store
/// may outlive its event loop): the waits of every store on one execution
/// context share one timer, kept by a service of that context. Use it on its
/// executor only.
class wait_log {
public:
  class monitor; // the context's service (wait_log.cpp)

  /// `where`: what the waits are on ("127.0.0.1:29500", "file_store '/tmp/x'"). Any thread.
  wait_log(asio::any_io_executor ex, std::string where);
  wait_log(const wait_log&) = delete;
  wait_log& operator=(const wait_log&) = delete;

  /// One wait, logged from its construction to its destruction on the
  /// schedule `warnings()` gives then. A wait whose deadline comes before its
  /// first warning never warns and costs nothing; a longer one (or one
  /// without deadline, `timeout` zero) costs a clock read and a place in the
  /// monitor's index of due times (O(log waits) in and out). The waits due
  /// together (within a fifth of the first delay, at most 1 s, the later
  /// ones a little late) for the same keys at the same place, in one store
  /// or many, warn in one line that counts them ("12288 waits still waiting
  /// for key rdzv/done at ..."); a
  /// warning round costs the waits due, not the waits pending. `keys` and the
  /// log must outlive the entry. Not movable: keep it in the waiting
  /// coroutine's frame.
  class entry {
  public:
    entry(wait_log& log, std::span<const std::string> keys, std::chrono::milliseconds timeout);
    ~entry();
    entry(const entry&) = delete;
    entry& operator=(const entry&) = delete;

  private:
    friend class monitor;
    monitor* monitor_ = nullptr; // null: not logged
    const wait_log* log_ = nullptr;
    std::size_t slot_ = 0; // its place in the monitor's index
    std::span<const std::string> keys_;
    std::chrono::milliseconds timeout_{0};
    std::chrono::milliseconds every_{0};
    std::chrono::steady_clock::time_point since_;
    std::chrono::steady_clock::time_point due_; // of the next warning
  };

private:
  asio::any_io_executor ex_;
  monitor* monitor_;
  std::string where_;
};

/// "a, b, c" (at most `max` names, then "... (N in all)").
std::string key_list(std::span<const std::string> keys, std::size_t max = 8);

/// "300 s" or "250 ms": a duration for a log line or an error message.
std::string duration_text(std::chrono::milliseconds d);

} // namespace corodist::store::detail
