#pragma once
// gloo_store: Gloo's rendezvous store interface over a corodist store, so that
// a gloo_group's full-mesh connect (mesh_context) publishes and finds addresses through our store.
// Calls block the calling thread (a Gloo communication thread, never a loop).

#include <corodist/store/store.hpp>

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace corodist::collective::detail {

class gloo_store final : public gloo::rendezvous::Store {
public:
  /// Keys go to `store` unchanged (wrap it in a prefix_store to scope them);
  /// `get` and `wait` without a deadline use `timeout`.
  gloo_store(std::shared_ptr<store::store> store, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  /// Waits for `key` up to the timeout, as Gloo's own stores do.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  /// The values of `keys` in one round trip (each waited for up to the timeout).
  std::vector<std::string> multi_get(const std::vector<std::string>& keys);

private:
  std::shared_ptr<store::store> store_;
  std::chrono::milliseconds timeout_;
};

} // namespace corodist::collective::detail
