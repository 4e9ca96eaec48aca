#pragma once
/// \file
/// corodist::store::basic_store: the base of corodist's own stores, which
/// implements the store operations once, each by forwarding it to the
/// store's implementation inside the library.

#include <corodist/core/config.hpp>

#include <corodist/store/store.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace corodist::store {

/// The base of hash_store, file_store, tcp_store, torch_store and
/// prefix_store: every operation goes to the store's implementation, a
/// `store` of the library's own (in src/store) that overrides the `do_`
/// functions, so their headers declare only what is theirs (constructors,
/// accessors). A store of your own derives from `store` and overrides its
/// `do_` functions as those implementations do.
///
/// Cancellation: as `store`'s operations (see store.hpp): a forwarded
/// operation is the implementation's own, so it honours and leaves behind
/// exactly what that one does.
class basic_store : public store {
public:
  ~basic_store() override;

  /// The executor of the implementation, fixed at construction.
  asio::any_io_executor get_executor() final { return ex_; }

protected:
  /// Runs the operations on `impl` (not null), which nothing else uses.
  explicit basic_store(std::shared_ptr<store> impl);

  /// The implementation (the derived store knows its type).
  const std::shared_ptr<store>& implementation() const noexcept { return impl_; }

private:
  asio::awaitable<void> do_set(std::string key, std::string value) final;
  asio::awaitable<void> do_set_owned(std::string key, std::string value) final;
  asio::awaitable<std::string> do_get(std::string key, corodist::deadline by) final;
  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) final;
  asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) final;
  asio::awaitable<bool> do_delete_key(std::string key) final;
  asio::awaitable<bool> do_check(std::vector<std::string> keys) final;
  asio::awaitable<void> do_wait(std::vector<std::string> keys, corodist::deadline by) final;
  asio::awaitable<std::int64_t> do_num_keys() final;
  asio::awaitable<void> do_append(std::string key, std::string value) final;
  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> keys, corodist::deadline by) final;
  asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) final;
  asio::awaitable<std::vector<std::string>> do_list_keys(std::string prefix) final;
  asio::awaitable<watch_stream> do_watch_key(std::string key) final;

  std::shared_ptr<store> impl_;
  asio::any_io_executor ex_;
};

} // namespace corodist::store
