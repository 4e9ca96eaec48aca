#include <corodist/core/error.hpp>
#include <corodist/store/prefix_store.hpp>


namespace corodist::store {

/// Each operation is the underlying store's, with the prefix put before its keys.
struct prefix_store::impl final : store {
  impl(std::string p, std::shared_ptr<store> s) : prefix(std::move(p)), inner(std::move(s)) {
    if (!inner)
      throw usage_error("prefix_store: the underlying store is null");
  }

  std::string key(const std::string& k) const { return prefix + "/" + k; }

  std::vector<std::string> keys(std::vector<std::string> ks) const {
    for (auto& k : ks)
      k = key(k);
    return ks;
  }

  asio::any_io_executor get_executor() override { return inner->get_executor(); }

  asio::awaitable<void> do_set(std::string k, std::string value) override {
    co_await inner->set(key(k), std::move(value));
  }

  asio::awaitable<void> do_set_owned(std::string k, std::string value) override {
    co_await inner->set_owned(key(k), std::move(value));
  }

  asio::awaitable<std::string> do_get(std::string k, corodist::deadline by) override {
    co_return co_await inner->get(key(k), by.left());
  }

  asio::awaitable<std::int64_t> do_add(std::string k, std::int64_t delta) override {
    co_return co_await inner->add(key(k), delta);
  }

  asio::awaitable<std::string> do_compare_set(std::string k, std::string expected, std::string desired) override {
    co_return co_await inner->compare_set(key(k), std::move(expected), std::move(desired));
  }

  asio::awaitable<bool> do_delete_key(std::string k) override { co_return co_await inner->delete_key(key(k)); }

  asio::awaitable<bool> do_check(std::vector<std::string> ks) override {
    co_return co_await inner->check(keys(std::move(ks)));
  }

  asio::awaitable<void> do_wait(std::vector<std::string> ks, corodist::deadline by) override {
    co_await inner->wait(keys(std::move(ks)), by.left());
  }

  asio::awaitable<std::int64_t> do_num_keys() override { co_return co_await inner->num_keys(); }

  asio::awaitable<void> do_append(std::string k, std::string value) override {
    co_await inner->append(key(k), std::move(value));
  }

  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> ks,
                                                         corodist::deadline by) override {
    co_return co_await inner->multi_get(keys(std::move(ks)), by.left());
  }

  asio::awaitable<void> do_multi_set(std::vector<std::string> ks, std::vector<std::string> values) override {
    co_await inner->multi_set(keys(std::move(ks)), std::move(values));
  }

  asio::awaitable<std::vector<std::string>> do_list_keys(std::string p) override {
    auto found = co_await inner->list_keys(key(p));
    for (auto& k : found)
      k.erase(0, prefix.size() + 1);
    co_return found;
  }

  asio::awaitable<watch_stream> do_watch_key(std::string k) override {
    auto s = co_await inner->watch_key(key(k));
    strip_keys(s, prefix.size() + 1);
    co_return s;
  }

  std::string prefix;
  std::shared_ptr<store> inner;
};

prefix_store::prefix_store(std::string prefix, std::shared_ptr<store> underlying)
    : basic_store(std::make_shared<impl>(std::move(prefix), std::move(underlying))) {
  set_timeout(this->underlying()->timeout());
}

prefix_store::~prefix_store() = default;

const std::string& prefix_store::prefix() const noexcept {
  return static_cast<const impl&>(*implementation()).prefix;
}

const std::shared_ptr<store>& prefix_store::underlying() const noexcept {
  return static_cast<const impl&>(*implementation()).inner;
}

void prefix_store::strip_keys(watch_stream& s, std::size_t n) noexcept { s.q_->key_strip += n; }

} // namespace corodist::store
