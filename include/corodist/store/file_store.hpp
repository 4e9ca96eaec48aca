#pragma once
/// \file
/// corodist::store::file_store: a store backed by one shared file (c10d's
/// FileStore), usable by several processes on one machine.

#include <corodist/core/config.hpp>

#include <corodist/store/basic_store.hpp>

#include <asio/any_io_executor.hpp>

#include <string>

namespace corodist::store {

/// A store whose contents live in one file that any number of processes on
/// the same machine (and any number of `file_store`s in one process) open by
/// path.
///
/// The file is an append-only log of records
/// `[u8 op: 1=set, 2=delete][u32 LE key_len][key][u32 LE value_len][value]`.
/// Each file_store replays the log into a store engine of its own (the one
/// hash_store and store_server run on), which holds the data, the waits and
/// the watches. Every operation takes an OFD `fcntl` lock on the whole file
/// (shared for reads, exclusive for writes), first replays the records other
/// processes appended since its last read, then appends its own record(s)
/// with one `write()` and replays them. Read-modify-write operations (`add`,
/// `compare_set`, `append`, `delete_key`, `multi_set`) compute their records
/// with the engine's rules under one exclusive lock, so they are atomic across
/// processes. A torn trailing record (a writer that died mid-`write()`) is
/// ignored by readers and cut off by the next writer. The file only grows;
/// remove it when the job is done.
///
/// Waiting operations (`get`, `wait`, `multi_get`) wait on the engine (its
/// timers keep their deadlines); while any is pending, or a watch is open,
/// the store looks at the file again every 10 ms for other processes'
/// records; the thread only blocks inside the short locked sections. Watches
/// see every record in log order, so rapid successive changes by other
/// processes are not coalesced.
///
/// Thread rules: all state lives on `get_executor()`, which must run one
/// handler at a time (one thread, or a strand); the operations may be awaited
/// from any executor (they hop there). Construct one `file_store` per
/// process; do not use one across `fork()` (the child would share its open
/// file description, and so its locks).
class file_store : public basic_store {
public:
  /// Opens `path`, creating it (mode 0644) if missing. Does no I/O on `ex`.
  /// Throws `corodist::store::store_error` naming the path and the errno text if the
  /// file cannot be opened or created.
  file_store(asio::any_io_executor ex, std::string path);

  /// Closes the file. Open watch streams end with `store_error` (delivered on
  /// the executor). Operations must not be in flight.
  ~file_store() override;

  file_store(const file_store&) = delete;
  file_store& operator=(const file_store&) = delete;

  /// The path of the backing file.
  const std::string& path() const noexcept { return path_; }

private:
  std::string path_;
};

} // namespace corodist::store
