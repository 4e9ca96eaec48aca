#pragma once
/// \file
/// corodist::store::prefix_store: a key-prefix decorator (c10d's PrefixStore).

#include <corodist/core/config.hpp>

#include <corodist/store/basic_store.hpp>

#include <memory>
#include <string>

namespace corodist::store {

/// Forwards every operation to `underlying` with keys rewritten to
/// `prefix + "/" + key`, so that several groups can share one store.
/// `num_keys()` counts the underlying store's keys (as c10d does);
/// `list_keys` and watch events report keys without the prefix.
class prefix_store : public basic_store {
public:
  /// Wraps `underlying`; throws `usage_error` if it is null.
  prefix_store(std::string prefix, std::shared_ptr<store> underlying);
  ~prefix_store() override;

  /// The prefix (without the trailing "/").
  const std::string& prefix() const noexcept;
  /// The wrapped store.
  const std::shared_ptr<store>& underlying() const noexcept;

private:
  struct impl; // src/store/prefix_store.cpp
  /// Drops the first `n` bytes of the keys of `s`'s events (the prefix).
  static void strip_keys(watch_stream& s, std::size_t n) noexcept;
};

} // namespace corodist::store
