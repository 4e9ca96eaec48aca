#pragma once
/// \file
/// corodist::store::file_store: a store backed by one shared file (c10d's
/// FileStore), usable by several processes on one machine.

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

/// A store whose contents live in one file that any number of processes on
/// the same machine (and any number of `file_store`s in one process) open by
/// path.
///
/// The file is an append-only log of records
/// `[u8 op: 1=set, 2=delete][u32 LE key_len][key][u32 LE value_len][value]`.
/// Every operation takes an OFD `fcntl` lock on the whole file (shared for
/// reads, exclusive for writes), first applies the records other processes
/// appended since its last read to an in-memory cache, then appends its own
/// record(s) with one `write()`. Read-modify-write operations (`add`,
/// `compare_set`, `append`, `delete_key`, `multi_set`) read and write under
/// one exclusive lock, so they are atomic across processes. A torn trailing
/// record (a writer that died mid-`write()`) is ignored by readers and cut off
/// by the next writer. The file only grows; remove it when the job is done.
///
/// Waiting operations (`get`, `wait`, `multi_get`) and watches poll the file
/// every 10 ms with a timer; the thread only blocks inside the short locked
/// sections. Watches see every record in log order, so rapid successive
/// changes by other processes are not coalesced.
///
/// Thread rules: all state lives on `get_executor()`, which must run one
/// handler at a time (one thread, or a strand); the operations may be awaited
/// from any executor (they hop there). Construct one `file_store` per
/// process; do not use one across `fork()` (the child would share its open
/// file description, and so its locks).
class file_store : public store {
public:
  /// Opens `path`, creating it (mode 0644) if missing. Does no I/O on `ex`.
  /// Throws `corodist::store_error` naming the path and the errno text if the
  /// file cannot be opened or created.
  file_store(asio::any_io_executor ex, std::string path);

  /// Closes the file. Open watch streams end with `store_error` (delivered on
  /// the executor). Operations must not be in flight.
  ~file_store() override;

  file_store(const file_store&) = delete;
  file_store& operator=(const file_store&) = delete;

  /// The executor the store's state lives on (the one given to the constructor).
  asio::any_io_executor get_executor() override;

  /// The path of the backing file.
  const std::string& path() const noexcept { return path_; }

protected:
  asio::awaitable<void> do_set(std::string key, std::string value) override;
  asio::awaitable<std::string> do_get(std::string key, std::chrono::milliseconds timeout) override;
  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) override;
  asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) override;
  asio::awaitable<bool> do_delete_key(std::string key) override;
  asio::awaitable<bool> do_check(std::vector<std::string> keys) override;
  asio::awaitable<void> do_wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) override;
  asio::awaitable<std::int64_t> do_num_keys() override;
  asio::awaitable<void> do_append(std::string key, std::string value) override;
  asio::awaitable<std::vector<std::string>> do_multi_get(std::vector<std::string> keys,
                                                         std::chrono::milliseconds timeout) override;
  asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) override;
  asio::awaitable<std::vector<std::string>> do_list_keys(std::string prefix) override;
  asio::awaitable<watch_stream> do_watch_key(std::string key) override;

private:
  struct state; // fd, read offset, cache and watchers; shared with the watch poller

  /// Polls until every key exists or `timeout` (zero: never) passes, then throws timeout_error.
  asio::awaitable<void> wait_for_keys(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  asio::any_io_executor executor_;
  std::string path_;
  std::shared_ptr<state> state_;
};

} // namespace corodist::store
