#pragma once
// The implementation of the stores that keep their state in an engine of
// their own (private): hash_store, whose engine is the store, and
// file_store, whose engine replays its file. Reads, waits and watches run on
// the engine here, once; the writes are each store's own.

#include <corodist/store/store.hpp>

#include "store/server/engine.hpp"
#include "store/wait_log.hpp"

#include <memory>
#include <string>
#include <vector>

namespace corodist::store::detail {

class engine_ops : public store {
public:
  asio::any_io_executor get_executor() final { return ex_; }

  asio::awaitable<std::string> do_get(std::string key, corodist::deadline by) final;
  asio::awaitable<bool> do_check(std::vector<std::string> keys) final;
  asio::awaitable<void> do_wait(std::vector<std::string> keys, corodist::deadline by) final;
  asio::awaitable<std::int64_t> do_num_keys() final;
  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> keys,
                                                         corodist::deadline by) final;
  asio::awaitable<std::vector<std::string>> do_list_keys(std::string prefix) final;
  /// The changes from now on: what `refresh()` finds first is history.
  asio::awaitable<watch_stream> do_watch_key(std::string key) final;

protected:
  /// An engine on `ex` without limits; `where` names the store in its wait warnings.
  engine_ops(asio::any_io_executor ex, std::string where);

  /// Brings the engine up to date before a read (file_store: the records
  /// other processes appended). Throws store_error.
  virtual void refresh() {}

  /// A wait or a watch was registered on the engine (file_store starts
  /// looking at its file for what other processes write).
  virtual void awaiting() {}

  /// The watch streams not yet gone (some may be closing), for a store that
  /// ends them itself. Any thread while no operation runs.
  std::vector<std::shared_ptr<watch_queue>> open_watches() const;

  asio::any_io_executor ex_;
  std::shared_ptr<engine> engine_;

private:
  /// Waits until every key exists, or throws timeout_error at `by`.
  asio::awaitable<void> until_present(const std::vector<std::string>& keys, corodist::deadline by);

  wait_log waits_;
  std::vector<std::weak_ptr<watch_queue>> watches_; // pruned as streams close
};

} // namespace corodist::store::detail
