// corodist::unique_function: small callables held in place, large or
// throwing-move ones on the heap; moves, destruction and calls keep every
// callable alive exactly once.
#include <boost/test/unit_test.hpp>

#include <corodist/core/unique_function.hpp>

#include <array>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using corodist::unique_function;

namespace {

// Counts live instances, so every path can be checked for leaks and double
// destruction. `Pad` makes it small (held in place) or large (on the heap).
template <std::size_t Pad, bool NothrowMove = true>
struct counted {
  static inline int live = 0;
  std::shared_ptr<int> calls = std::make_shared<int>(0);
  std::array<char, Pad> pad{};
  counted() { ++live; }
  counted(const counted& o) : calls(o.calls) { ++live; }
  counted(counted&& o) noexcept(NothrowMove) : calls(std::move(o.calls)) { ++live; }
  ~counted() { --live; }
  int operator()(int x) {
    ++*calls;
    return x + 1;
  }
};

using small = counted<8>;
using large = counted<256>;
using throwing_move = counted<8, false>;

template <typename T>
void moves_calls_and_destroys_once() {
  BOOST_REQUIRE_EQUAL(T::live, 0);
  {
    T t;
    auto calls = t.calls;
    unique_function<int(int)> f(std::move(t));
    BOOST_TEST(static_cast<bool>(f));
    BOOST_TEST(f(1) == 2);
    unique_function<int(int)> g(std::move(f));
    BOOST_TEST(!static_cast<bool>(f));
    BOOST_TEST(g(2) == 3);
    unique_function<int(int)> h;
    h = std::move(g);
    BOOST_TEST(h(3) == 4);
    h = std::move(h); // self-move keeps it
    BOOST_TEST(h(4) == 5);
    BOOST_TEST(*calls == 4);
    std::vector<unique_function<int(int)>> many;
    for (int i = 0; i < 64; ++i) // moved around as the vector grows
      many.emplace_back(T{});
    for (auto& m : many)
      BOOST_TEST(m(0) == 1);
  }
  BOOST_TEST(T::live == 0);
}

} // namespace

BOOST_AUTO_TEST_SUITE(unique_function_suite)

BOOST_AUTO_TEST_CASE(a_small_callable_moves_calls_and_is_destroyed_once) { moves_calls_and_destroys_once<small>(); }

BOOST_AUTO_TEST_CASE(a_large_callable_moves_calls_and_is_destroyed_once) { moves_calls_and_destroys_once<large>(); }

BOOST_AUTO_TEST_CASE(a_callable_whose_move_may_throw_moves_calls_and_is_destroyed_once) {
  moves_calls_and_destroys_once<throwing_move>();
}

BOOST_AUTO_TEST_CASE(a_move_only_callable_with_reference_arguments) {
  auto owned = std::make_unique<std::string>("held");
  unique_function<std::string(std::string&&, const std::string&)> f =
      [owned = std::move(owned)](std::string&& a, const std::string& b) { return *owned + a + b; };
  std::string a = "-a";
  BOOST_TEST(f(std::move(a), std::string("-b")) == "held-a-b");
}

BOOST_AUTO_TEST_CASE(reassigning_destroys_the_old_callable) {
  BOOST_REQUIRE_EQUAL(small::live, 0);
  unique_function<int(int)> f = small{};
  BOOST_TEST(small::live == 1);
  f = large{};
  BOOST_TEST(small::live == 0);
  BOOST_TEST(large::live == 1);
  f = unique_function<int(int)>();
  BOOST_TEST(large::live == 0);
  BOOST_TEST(!static_cast<bool>(f));
}

BOOST_AUTO_TEST_CASE(a_throwing_call_propagates_and_keeps_the_callable) {
  int n = 0;
  unique_function<void()> f = [&n] {
    if (++n == 1)
      throw std::runtime_error("first");
  };
  BOOST_CHECK_THROW(f(), std::runtime_error);
  f();
  BOOST_TEST(n == 2);
}

BOOST_AUTO_TEST_SUITE_END()
