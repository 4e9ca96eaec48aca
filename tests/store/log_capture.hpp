#pragma once
// Test helpers for what the store layer logs: the lines logged while a
// log_capture lives (tests/support/log_capture.hpp), and a shorter warning
// schedule for the test's waits.

#include "store/wait_log.hpp"
#include "support/log_capture.hpp"

#include <chrono>

namespace corodist::test {

/// Sets the store layer's warning schedule for the scope (then restores it):
/// the test's long waits warn after `first`, then every `every`.
class warning_schedule_for_test {
public:
  warning_schedule_for_test(std::chrono::milliseconds first, std::chrono::milliseconds every)
      : old_(corodist::store::detail::set_warnings({first, every})) {}
  ~warning_schedule_for_test() { corodist::store::detail::set_warnings(old_); }
  warning_schedule_for_test(const warning_schedule_for_test&) = delete;
  warning_schedule_for_test& operator=(const warning_schedule_for_test&) = delete;

private:
  corodist::store::detail::warning_schedule old_;
};

} // namespace corodist::test
