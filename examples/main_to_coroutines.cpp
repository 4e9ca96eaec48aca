// From main() into coroutines: corodist::run_blocking(executor, awaitable)
// runs a coroutine on a started event_loop and hands its result (or its
// exception) back to the plain thread that called it.
//
//   main_to_coroutines
#include "usage.hpp"

#include <corodist/core/error.hpp>
#include <corodist/core/event_loop.hpp>
#include <corodist/core/run_blocking.hpp>
#include <corodist/store/hash_store.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

using namespace std::chrono_literals;

asio::awaitable<long> count_to(corodist::store::store& s, int n) {
  long last = 0;
  for (int i = 0; i < n; ++i)
    last = co_await s.add("counter", 1); // each co_await lets the loop run other work
  co_return last;
}

asio::awaitable<std::string> get_missing(corodist::store::store& s) {
  co_return co_await s.get("never-set", 50ms); // throws corodist::timeout_error after 50 ms
}

int main(int argc, char** argv) {
  if (auto status = examples::no_arguments(argc, argv, "From main() into coroutines with corodist::run_blocking (one process, no launcher)."))
    return *status;
  corodist::event_loop loop;
  loop.start(); // the loop runs on its own thread; main() stays a plain thread
  auto store = std::make_shared<corodist::store::hash_store>(loop.get_executor());

  long n = corodist::run_blocking(loop.get_executor(), count_to(*store, 3));
  std::printf("counted to %ld\n", n);

  try {
    corodist::run_blocking(loop.get_executor(), get_missing(*store));
  } catch (const corodist::timeout_error& e) { // a coroutine's exception reaches main()
    std::printf("as expected: %s\n", e.what());
  }
}
