#include "collective/gloo/gloo_store.hpp"

#include <corodist/core/run_blocking.hpp>

namespace corodist::collective::detail {

gloo_store::gloo_store(std::shared_ptr<store::store> store, std::chrono::milliseconds timeout)
    : store_(std::move(store)), timeout_(timeout) {}

void gloo_store::set(const std::string& key, const std::vector<char>& data) {
  run_blocking(store_->get_executor(), store_->set(key, std::string(data.begin(), data.end())),
               "gloo rendezvous store set");
}

std::vector<char> gloo_store::get(const std::string& key) {
  auto v = run_blocking(store_->get_executor(), store_->get(key, timeout_), "gloo rendezvous store get");
  return std::vector<char>(v.begin(), v.end());
}

void gloo_store::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void gloo_store::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  run_blocking(store_->get_executor(), store_->wait(keys, timeout), "gloo rendezvous store wait");
}

std::vector<std::string> gloo_store::multi_get(const std::vector<std::string>& keys) {
  return run_blocking(store_->get_executor(), store_->multi_get(keys, timeout_), "gloo rendezvous store multi_get");
}

} // namespace corodist::collective::detail
