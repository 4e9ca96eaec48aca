#pragma once
/// \file
/// A store that passes every operation to another one: the base of tests'
/// stores that change one operation (hold it at a gate, fail it at a chosen
/// moment) and leave the rest as they are.

#include <corodist/store/store.hpp>

#include <asio/awaitable.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace corodist::test {

class forwarding_store : public corodist::store::store {
public:
  explicit forwarding_store(std::shared_ptr<corodist::store::store> inner) : inner_(std::move(inner)) {}
  asio::any_io_executor get_executor() override { return inner_->get_executor(); }

protected:
  asio::awaitable<void> do_set(std::string k, std::string v) override {
    co_await inner_->set(std::move(k), std::move(v));
  }
  asio::awaitable<void> do_set_owned(std::string k, std::string v) override {
    co_await inner_->set_owned(std::move(k), std::move(v));
  }
  asio::awaitable<std::string> do_get(std::string k, corodist::deadline by) override {
    co_return co_await inner_->get(std::move(k), by.left());
  }
  asio::awaitable<std::int64_t> do_add(std::string k, std::int64_t delta) override {
    co_return co_await inner_->add(std::move(k), delta);
  }
  asio::awaitable<std::string> do_compare_set(std::string k, std::string e, std::string d) override {
    co_return co_await inner_->compare_set(std::move(k), std::move(e), std::move(d));
  }
  asio::awaitable<bool> do_delete_key(std::string k) override { co_return co_await inner_->delete_key(std::move(k)); }
  asio::awaitable<bool> do_check(std::vector<std::string> ks) override {
    co_return co_await inner_->check(std::move(ks));
  }
  asio::awaitable<void> do_wait(std::vector<std::string> ks, corodist::deadline by) override {
    co_await inner_->wait(std::move(ks), by.left());
  }
  asio::awaitable<std::int64_t> do_num_keys() override { co_return co_await inner_->num_keys(); }
  asio::awaitable<void> do_append(std::string k, std::string v) override {
    co_await inner_->append(std::move(k), std::move(v));
  }
  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> ks,
                                                         corodist::deadline by) override {
    co_return co_await inner_->multi_get(std::move(ks), by.left());
  }
  asio::awaitable<void> do_multi_set(std::vector<std::string> ks, std::vector<std::string> vs) override {
    co_await inner_->multi_set(std::move(ks), std::move(vs));
  }
  asio::awaitable<std::vector<std::string>> do_list_keys(std::string prefix) override {
    co_return co_await inner_->list_keys(std::move(prefix));
  }
  asio::awaitable<corodist::store::watch_stream> do_watch_key(std::string k) override {
    co_return co_await inner_->watch_key(std::move(k));
  }

  std::shared_ptr<corodist::store::store> inner_;
};

} // namespace corodist::test
