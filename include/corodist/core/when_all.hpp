#pragma once
/// \file
/// corodist::when_all: one future for many.

#include <corodist/core/config.hpp>

#include <corodist/core/future.hpp>

#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace corodist {

/// The result of when_all over futures of T: the values in order, or nothing for void.
template <typename T>
using when_all_result = std::conditional_t<std::is_void_v<T>, void, std::vector<T>>;

/// Returns a future that is ready once every future in `fs` is: with their
/// values in order (`future<void>` for void futures), or, once all have
/// finished, with the exception of the first of them (in order) that failed.
/// Takes the futures' results; callable from any thread. Empty `fs`: ready at once.
template <typename T>
future<when_all_result<T>> when_all(std::vector<future<T>> fs) {
  using slot_t = std::optional<std::conditional_t<std::is_void_v<T>, char, T>>;
  struct gather {
    promise<when_all_result<T>> p;
    std::mutex m;
    std::size_t left = 0;
    std::vector<std::exception_ptr> errors;
    std::vector<slot_t> values;
    void finish() {
      for (auto& e : errors)
        if (e) {
          p.set_exception(e);
          return;
        }
      if constexpr (std::is_void_v<T>) {
        p.set_value();
      } else {
        std::vector<T> out;
        out.reserve(values.size());
        for (auto& v : values)
          out.push_back(std::move(*v));
        p.set_value(std::move(out));
      }
    }
  };
  auto g = std::make_shared<gather>();
  auto result = g->p.get_future();
  g->left = fs.size();
  g->errors.resize(fs.size());
  g->values.resize(fs.size());
  if (fs.empty()) {
    g->finish();
    return result;
  }
  for (auto& f : fs)
    if (!detail::future_access::state(f))
      throw usage_error("corodist::when_all: an invalid future");
  for (std::size_t i = 0; i < fs.size(); ++i) {
    auto st = detail::future_access::state(fs[i]); // the continuation keeps the state alive
    st->on_ready([g, i, st] {
      bool last = false;
      {
        std::lock_guard lk(g->m);
        try {
          if constexpr (std::is_void_v<T>) {
            st->take();
            g->values[i].emplace('\0');
          } else {
            g->values[i].emplace(st->take());
          }
        } catch (...) {
          g->errors[i] = std::current_exception();
        }
        last = --g->left == 0;
      }
      if (last)
        g->finish();
    });
  }
  return result;
}

} // namespace corodist
