#pragma once
/// \file
/// corodist::unique_function: a move-only type-erased callable (what C++23
/// names std::move_only_function), for callbacks that own move-only state
/// (a promise, a connection's buffers). Used by every layer's callbacks.

#include <corodist/core/config.hpp>

#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace corodist {

/// A move-only callable of signature `Signature`; empty when default-made or
/// moved from (calling it then is undefined). A callable of up to
/// `inline_size` bytes that moves without throwing is held in place (most
/// lambdas: no allocation); a larger one on the heap.
/// Not thread-safe: one thread at a time, like the callable it holds.
template <typename Signature>
class unique_function;

template <typename R, typename... Args>
class unique_function<R(Args...)> {
public:
  /// The largest callable held without an allocation.
  static constexpr std::size_t inline_size = 6 * sizeof(void*);

  /// Empty.
  unique_function() noexcept = default;

  /// Holds `f` (moved or copied in). Throws std::bad_alloc (for a callable
  /// held on the heap), or what moving or copying `f` throws.
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, unique_function>>>
  unique_function(F&& f) {
    using T = std::decay_t<F>;
    if constexpr (fits_inline<T>) {
      ::new (static_cast<void*>(buf_)) T(std::forward<F>(f));
      ops_ = &inline_ops<T>;
    } else {
      T* p = new T(std::forward<F>(f));
      ::new (static_cast<void*>(buf_)) T*(p);
      ops_ = &heap_ops<T>;
    }
  }

  unique_function(unique_function&& other) noexcept { take(other); }

  unique_function& operator=(unique_function&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }

  ~unique_function() { reset(); }

  /// True when it holds a callable.
  explicit operator bool() const noexcept { return ops_ != nullptr; }

  /// Calls the held callable (it must hold one); throws what it throws.
  R operator()(Args... args) { return ops_->call(buf_, std::forward<Args>(args)...); }

private:
  struct ops_t {
    R (*call)(void* self, Args&&... args);
    void (*move)(void* from, void* to) noexcept; // move-constructs at `to`, destroys `from`
    void (*destroy)(void* self) noexcept;
  };

  template <typename T>
  static constexpr bool fits_inline = sizeof(T) <= inline_size && alignof(T) <= alignof(std::max_align_t) &&
                                      std::is_nothrow_move_constructible_v<T>;

  template <typename T>
  static constexpr ops_t inline_ops{
      [](void* self, Args&&... args) -> R { return (*static_cast<T*>(self))(std::forward<Args>(args)...); },
      [](void* from, void* to) noexcept {
        ::new (to) T(std::move(*static_cast<T*>(from)));
        static_cast<T*>(from)->~T();
      },
      [](void* self) noexcept { static_cast<T*>(self)->~T(); }};

  template <typename T>
  static constexpr ops_t heap_ops{
      [](void* self, Args&&... args) -> R { return (**static_cast<T**>(self))(std::forward<Args>(args)...); },
      [](void* from, void* to) noexcept { ::new (to) T*(*static_cast<T**>(from)); },
      [](void* self) noexcept { delete *static_cast<T**>(self); }};

  void take(unique_function& other) noexcept {
    if (other.ops_) {
      other.ops_->move(other.buf_, buf_);
      ops_ = std::exchange(other.ops_, nullptr);
    }
  }

  void reset() noexcept {
    if (ops_)
      std::exchange(ops_, nullptr)->destroy(buf_);
  }

  alignas(std::max_align_t) unsigned char buf_[inline_size];
  const ops_t* ops_ = nullptr;
};

} // namespace corodist
