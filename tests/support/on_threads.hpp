#pragma once
// Ranks as threads of this process, for tests, benchmarks and the GPU checks
// (no Boost.Test here).

#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace corodist::test {

/// Runs `body(rank)` on `n` threads at once; returns each rank's error
/// ("rank r: what()", "" when it returned normally).
inline std::vector<std::string> run_on_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = "rank " + std::to_string(r) + ": " + e.what();
      }
    });
  for (auto& t : threads)
    t.join();
  return errors;
}

/// As run_on_threads; throws std::runtime_error with the first rank's error.
inline void run_on_threads_or_throw(int n, const std::function<void(int)>& body) {
  for (auto& e : run_on_threads(n, body))
    if (!e.empty())
      throw std::runtime_error(e);
}

} // namespace corodist::test
