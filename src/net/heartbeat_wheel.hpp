#pragma once
// The heartbeat ticks of every started connection on a loop (private; used by
// heartbeat.cpp): one wheel per io_context and peer_timeout, with one timer,
// instead of a timer and a pending wait per connection. The wheel turns a
// slot every quarter of peer_timeout / slot_count; a connection sits in one
// slot and is looked at (connection::on_heartbeat) once per quarter of
// peer_timeout, as its own timer did. Spreading the connections over slots
// spreads their heartbeats over the quarter instead of sending them all in
// one turn of the loop.
//
// Loop-thread only, like the connections on it. A connection joins at
// start() and leaves at close() (or destruction); the wheel keeps a raw
// pointer in between, and a hole when one leaves, compacted when its slot is
// next looked at. The timer runs only while the wheel has members, so an
// idle loop can drain.
#include <corodist/net/connection.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/execution_context.hpp>
#include <asio/steady_timer.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace corodist::net::detail {

class heartbeat_wheel {
public:
  static constexpr std::size_t slot_count = 8;

  heartbeat_wheel(const asio::any_io_executor& ex, std::chrono::milliseconds peer_timeout);
  heartbeat_wheel(const heartbeat_wheel&) = delete;
  heartbeat_wheel& operator=(const heartbeat_wheel&) = delete;

  std::chrono::milliseconds peer_timeout() const noexcept { return peer_timeout_; }

  /// Puts `c` in the least full slot (c.wheel_ = this).
  void add(connection& c);
  /// Takes `c` off (c.wheel_ = nullptr). `c` must be on this wheel.
  void remove(connection& c) noexcept;
  /// Stops and destroys the timer for good (the context shuts down, its
  /// services still alive); add() and remove() still work.
  void shutdown() noexcept;

private:
  void arm();
  void on_tick();
  void compact(std::size_t slot);

  std::chrono::milliseconds peer_timeout_;
  std::chrono::steady_clock::duration step_; // quarter of peer_timeout / slot_count
  std::optional<asio::steady_timer> timer_; // reset at shutdown
  std::chrono::steady_clock::time_point next_tick_{};
  std::array<std::vector<connection*>, slot_count> slots_; // null: a hole
  std::array<std::uint32_t, slot_count> members_{};       // non-null entries per slot
  std::array<std::uint32_t, slot_count> holes_{};
  std::size_t live_ = 0;
  std::size_t turn_ = 0; // the slot the next tick looks at
  bool armed_ = false;
  bool ticking_ = false;
  bool stopped_ = false;
};

/// The wheels of one execution context, one per peer_timeout in use.
class heartbeat_service : public asio::execution_context::service {
public:
  using key_type = heartbeat_service;
  static asio::execution_context::id id;

  explicit heartbeat_service(asio::execution_context& ctx) : asio::execution_context::service(ctx) {}

  /// The wheel for `peer_timeout` (made on first use, its timer on executor `ex`).
  heartbeat_wheel& wheel(const asio::any_io_executor& ex, std::chrono::milliseconds peer_timeout);

private:
  void shutdown() override;

  std::vector<std::unique_ptr<heartbeat_wheel>> wheels_; // few: one per distinct peer_timeout
};

} // namespace corodist::net::detail
