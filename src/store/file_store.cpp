#include <corodist/store/file_store.hpp>

#include <corodist/core/error.hpp>

#include "core/log.hpp"
#include "store/engine.hpp"   // the store's rules, applied to what the file holds
#include "store/wait_log.hpp"

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>

namespace corodist::store {

namespace {

using clock_type = std::chrono::steady_clock;

/// How often waiting operations and watches look at the file again.
constexpr auto poll_interval = std::chrono::milliseconds(10);

constexpr std::uint8_t op_set = 1;
constexpr std::uint8_t op_delete = 2;
/// op byte + key length.
constexpr std::size_t key_header_size = 1 + 4;
/// value length.
constexpr std::size_t value_header_size = 4;

// Open-file-description locks: owned by the open() (not the process), so two
// file_stores in one process exclude each other, and closing one descriptor
// does not drop another's lock (both are broken with classic POSIX locks).
// They conflict with classic fcntl locks, so foreign lockers still interoperate.
#ifdef F_OFD_SETLKW
constexpr int lock_wait_cmd = F_OFD_SETLKW;
constexpr int unlock_cmd = F_OFD_SETLK;
#else
constexpr int lock_wait_cmd = F_SETLKW;
constexpr int unlock_cmd = F_SETLK;
#endif

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err) {
  throw store_error("file_store: " + what + " '" + path + "': " + std::system_category().message(err));
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}

std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<std::uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

/// Appends one record to `out`; throws store_error if a field exceeds 4 GiB.
void encode_record(std::string& out, std::uint8_t op, std::string_view key, std::string_view value) {
  constexpr std::size_t max_len = std::numeric_limits<std::uint32_t>::max();
  if (key.size() > max_len)
    throw store_error("file_store: key of " + std::to_string(key.size()) + " bytes exceeds the 4 GiB limit");
  if (value.size() > max_len)
    throw store_error("file_store: value of " + std::to_string(value.size()) + " bytes exceeds the 4 GiB limit");
  out.reserve(out.size() + key_header_size + key.size() + value_header_size + value.size());
  out.push_back(static_cast<char>(op));
  put_u32(out, static_cast<std::uint32_t>(key.size()));
  out.append(key);
  put_u32(out, static_cast<std::uint32_t>(value.size()));
  out.append(value);
}

/// now + timeout; never for a zero (or negative) timeout, as every store;
/// saturating instead of overflowing for huge timeouts.
clock_type::time_point deadline_after(std::chrono::milliseconds timeout) {
  auto now = clock_type::now();
  if (timeout <= std::chrono::milliseconds::zero())
    return clock_type::time_point::max();
  auto room = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::time_point::max() - now);
  if (timeout >= room)
    return clock_type::time_point::max();
  return now + timeout;
}

} // namespace

/// Everything the store keeps about the file. Touched only on the executor;
/// shared with the watch poller (and the unwatch handlers, weakly) so that a
/// file_store may be destroyed while watch streams are still open.
struct file_store::state {
  /// An OFD fcntl lock on the whole file, held for the object's lifetime.
  /// Never held across a co_await (other coroutines of this store share the
  /// open file description, so they would not be excluded).
  class file_lock {
  public:
    file_lock(state& s, short type) : state_(s) {
      struct flock fl {};
      fl.l_type = type;
      fl.l_whence = SEEK_SET; // l_start = l_len = 0: the whole file, however long
      while (::fcntl(state_.fd_, lock_wait_cmd, &fl) != 0) {
        if (errno != EINTR)
          throw_errno("cannot lock", state_.path_, errno);
      }
    }
    ~file_lock() {
      struct flock fl {};
      fl.l_type = F_UNLCK;
      fl.l_whence = SEEK_SET;
      if (::fcntl(state_.fd_, unlock_cmd, &fl) != 0)
        CORODIST_LOG_ERROR("file_store '{}': unlock failed: {}", state_.path_,
                           std::system_category().message(errno));
    }
    file_lock(const file_lock&) = delete;
    file_lock& operator=(const file_lock&) = delete;

  private:
    state& state_;
  };

  struct watcher {
    std::uint64_t id;
    std::shared_ptr<detail::watch_queue> queue;
  };

  state(asio::any_io_executor ex, std::string path, int fd)
      : executor_(ex), path_(std::move(path)), fd_(fd), waits_(ex, "file_store '" + path_ + "'") {}
  ~state() { ::close(fd_); }
  state(const state&) = delete;
  state& operator=(const state&) = delete;

  /// Applies the records appended since the last read, taking a shared lock
  /// only if the file has grown (or shrunk) since then.
  void refresh() {
    if (file_size() == offset_)
      return;
    file_lock lock(*this, F_RDLCK);
    read_new(false);
  }

  /// Applies the records appended since the last read. Call under a lock; with
  /// `exclusive`, a torn tail (which no live writer can be producing, since
  /// writers hold the exclusive lock) is cut off so that appends follow valid data.
  void read_new(bool exclusive) {
    auto size = file_size();
    if (size < offset_) {
      CORODIST_LOG_WARN("file_store '{}': the file shrank from {} to {} bytes behind our back; reloading it", path_,
                        offset_, size);
      cache_.clear();
      offset_ = 0;
    }
    if (size == offset_)
      return;
    std::string buf(static_cast<std::size_t>(size - offset_), '\0');
    std::size_t got = 0;
    while (got < buf.size()) {
      auto n = ::pread(fd_, buf.data() + got, buf.size() - got, static_cast<off_t>(offset_ + got));
      if (n < 0) {
        if (errno == EINTR)
          continue;
        throw_errno("cannot read", path_, errno);
      }
      if (n == 0)
        break;
      got += static_cast<std::size_t>(n);
    }
    buf.resize(got);
    auto used = apply_records(buf);
    if (used == buf.size())
      return;
    // An incomplete record at the end: a writer died inside write().
    if (exclusive) {
      CORODIST_LOG_WARN("file_store '{}': dropping a torn record of {} bytes at offset {}", path_,
                        buf.size() - used, offset_);
      while (::ftruncate(fd_, static_cast<off_t>(offset_)) != 0) {
        if (errno != EINTR)
          throw_errno("cannot truncate a torn record of", path_, errno);
      }
    } else if (torn_warned_at_ != offset_) {
      torn_warned_at_ = offset_;
      CORODIST_LOG_WARN("file_store '{}': ignoring an incomplete record of {} bytes at offset {} "
                        "(the next write removes it)",
                        path_, buf.size() - used, offset_);
    }
  }

  /// Appends `records` with one write() and applies them. Call under the
  /// exclusive lock, after read_new(true) (so the file ends at offset_).
  void write_records(const std::string& records) {
    std::size_t done = 0;
    while (done < records.size()) {
      auto n = ::write(fd_, records.data() + done, records.size() - done);
      if (n < 0) {
        if (errno == EINTR)
          continue;
        int err = errno;
        if (done > 0 && ::ftruncate(fd_, static_cast<off_t>(offset_)) != 0)
          CORODIST_LOG_ERROR("file_store '{}': cannot remove a partial write: {}", path_,
                             std::system_category().message(errno));
        throw_errno("cannot write to", path_, err);
      }
      done += static_cast<std::size_t>(n);
    }
    apply_records(records);
  }

  /// Applies the complete records at the start of `buf` (which begins at
  /// offset_), advancing offset_ past each; returns the bytes consumed.
  std::size_t apply_records(std::string_view buf) {
    std::size_t pos = 0;
    while (pos < buf.size()) {
      auto op = static_cast<std::uint8_t>(buf[pos]);
      if (op != op_set && op != op_delete)
        throw store_error("file_store: '" + path_ + "' is corrupt: bad record type " + std::to_string(op) +
                          " at offset " + std::to_string(offset_));
      auto rest = buf.size() - pos;
      if (rest < key_header_size)
        break;
      std::uint64_t key_len = get_u32(buf.data() + pos + 1);
      if (rest < key_header_size + key_len + value_header_size)
        break;
      std::uint64_t value_len = get_u32(buf.data() + pos + key_header_size + key_len);
      std::uint64_t total = key_header_size + key_len + value_header_size + value_len;
      if (rest < total)
        break;
      std::string key(buf.substr(pos + key_header_size, key_len));
      std::string value(buf.substr(pos + key_header_size + key_len + value_header_size, value_len));
      pos += total;
      offset_ += total;
      apply(op, std::move(key), std::move(value));
    }
    return pos;
  }

  /// Applies one record to the cache and tells the key's watchers.
  void apply(std::uint8_t op, std::string key, std::string value) {
    if (op == op_set) {
      auto it = cache_.find(key);
      bool existed = it != cache_.end();
      if (existed)
        it->second = value;
      else
        it = cache_.emplace(key, value).first;
      notify(it->first, existed ? watch_event::kind::updated : watch_event::kind::created, std::move(value));
    } else if (cache_.erase(key) > 0) {
      notify(key, watch_event::kind::deleted, {});
    }
  }

  void notify(const std::string& key, watch_event::kind kind, std::string value) {
    if (watchers_.empty())
      return;
    auto it = watchers_.find(key);
    if (it == watchers_.end())
      return;
    auto targets = it->second; // a push may close a stream, which edits watchers_
    for (auto& w : targets) {
      if (!w.queue->closed)
        w.queue->push(watch_event{kind, key, value});
    }
  }

  void unwatch(const std::string& key, std::uint64_t id) {
    auto it = watchers_.find(key);
    if (it == watchers_.end())
      return;
    std::erase_if(it->second, [id](const watcher& w) { return w.id == id; });
    if (it->second.empty())
      watchers_.erase(it);
  }

  /// Ends every open watch stream with `error`.
  void fail_watchers(std::exception_ptr error) {
    auto all = std::exchange(watchers_, {});
    for (auto& [key, list] : all)
      for (auto& w : list)
        w.queue->fail(error);
  }

  /// Feeds the watch streams: re-reads the file every poll_interval while any is open.
  static asio::awaitable<void> poll_watches(std::shared_ptr<state> self) {
    asio::steady_timer timer(self->executor_);
    while (!self->closed_ && !self->watchers_.empty()) {
      timer.expires_after(poll_interval);
      co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
      if (self->closed_ || self->watchers_.empty())
        break;
      try {
        self->refresh();
      } catch (const std::exception& e) {
        CORODIST_LOG_ERROR("file_store '{}': watch poll failed, ending watch streams: {}", self->path_, e.what());
        self->fail_watchers(std::current_exception());
      }
    }
    self->poller_running_ = false;
  }

  std::uint64_t file_size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
      throw_errno("cannot stat", path_, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }

  /// The cached value of `key`, or null.
  const std::string* find(const std::string& key) const {
    auto it = cache_.find(key);
    return it == cache_.end() ? nullptr : &it->second;
  }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys)
      if (!cache_.contains(k))
        out.push_back(k);
    return out;
  }

  asio::any_io_executor executor_;
  std::string path_;
  int fd_;
  std::uint64_t offset_ = 0; ///< bytes of the log applied to cache_ (always a record boundary)
  std::uint64_t torn_warned_at_ = std::numeric_limits<std::uint64_t>::max();
  std::unordered_map<std::string, std::string> cache_;
  std::unordered_map<std::string, std::vector<watcher>> watchers_;
  std::uint64_t next_watch_id_ = 1;
  bool poller_running_ = false;
  bool closed_ = false;
  detail::wait_log waits_;
};

file_store::file_store(asio::any_io_executor ex, std::string path) : executor_(std::move(ex)), path_(std::move(path)) {
  int fd;
  do {
    fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0)
    throw_errno("cannot open", path_, errno);
  state_ = std::make_shared<state>(executor_, path_, fd);
  CORODIST_LOG_DEBUG("file_store: opened '{}'", path_);
}

file_store::~file_store() {
  if (!state_ || state_.use_count() == 1)
    return; // no poller: nothing else refers to the state; the fd closes here
  // A watch poller still shares the state: end its streams on the executor.
  try {
    asio::post(executor_, [s = std::move(state_)] {
      s->closed_ = true;
      s->fail_watchers(std::make_exception_ptr(store_error("file_store '" + s->path_ + "' was destroyed")));
    });
  } catch (const std::exception& e) {
    CORODIST_LOG_ERROR("file_store '{}': cannot end its watch streams: {}", path_, e.what());
  }
}

asio::any_io_executor file_store::get_executor() { return executor_; }

asio::awaitable<void> file_store::wait_for_keys(const std::vector<std::string>& keys,
                                                std::chrono::milliseconds timeout) {
  auto deadline = deadline_after(timeout);
  detail::wait_log::entry logged(state_->waits_, keys, timeout);
  asio::steady_timer timer(executor_);
  for (;;) {
    state_->refresh();
    auto missing = state_->missing(keys);
    if (missing.empty())
      co_return;
    auto now = clock_type::now();
    if (now >= deadline)
      throw timeout_error(detail::rules::timeout_message(missing, timeout));
    timer.expires_at(deadline - now < poll_interval ? deadline : now + poll_interval);
    co_await timer.async_wait(asio::use_awaitable);
  }
}

asio::awaitable<void> file_store::do_set(std::string key, std::string value) {
  std::string record;
  encode_record(record, op_set, key, value);
  state::file_lock lock(*state_, F_WRLCK);
  state_->read_new(true);
  state_->write_records(record);
  co_return;
}

asio::awaitable<std::string> file_store::do_get(std::string key, std::chrono::milliseconds timeout) {
  std::vector<std::string> keys;
  keys.push_back(key);
  co_await wait_for_keys(keys, timeout);
  co_return state_->cache_.at(key);
}

asio::awaitable<std::int64_t> file_store::do_add(std::string key, std::int64_t delta) {
  state::file_lock lock(*state_, F_WRLCK);
  state_->read_new(true);
  const auto next = detail::rules::added(key, state_->find(key), delta);
  std::string record;
  encode_record(record, op_set, key, std::to_string(next));
  state_->write_records(record);
  co_return next;
}

asio::awaitable<std::string> file_store::do_compare_set(std::string key, std::string expected, std::string desired) {
  state::file_lock lock(*state_, F_WRLCK);
  state_->read_new(true);
  auto* current = state_->find(key);
  if (!detail::rules::compare_set_stores(current, expected))
    co_return detail::rules::compare_set_unchanged(current, expected);
  std::string record;
  encode_record(record, op_set, key, desired);
  state_->write_records(record);
  co_return desired;
}

asio::awaitable<bool> file_store::do_delete_key(std::string key) {
  state::file_lock lock(*state_, F_WRLCK);
  state_->read_new(true);
  if (!state_->cache_.contains(key))
    co_return false;
  std::string record;
  encode_record(record, op_delete, key, {});
  state_->write_records(record);
  co_return true;
}

asio::awaitable<bool> file_store::do_check(std::vector<std::string> keys) {
  state_->refresh();
  co_return state_->missing(keys).empty();
}

asio::awaitable<void> file_store::do_wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) {
  co_await wait_for_keys(keys, timeout);
}

asio::awaitable<std::int64_t> file_store::do_num_keys() {
  state_->refresh();
  co_return static_cast<std::int64_t>(state_->cache_.size());
}

asio::awaitable<void> file_store::do_append(std::string key, std::string value) {
  state::file_lock lock(*state_, F_WRLCK);
  state_->read_new(true);
  std::string record;
  encode_record(record, op_set, key, detail::rules::appended(key, state_->find(key), value, {}));
  state_->write_records(record);
  co_return;
}

asio::awaitable<std::vector<std::string>> file_store::do_multi_get(std::vector<std::string> keys,
                                                                   std::chrono::milliseconds timeout) {
  co_await wait_for_keys(keys, timeout);
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& k : keys)
    values.push_back(state_->cache_.at(k));
  co_return values;
}

asio::awaitable<void> file_store::do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) {
  detail::rules::check_multi_set(keys, values);
  if (keys.empty())
    co_return;
  std::string records;
  for (std::size_t i = 0; i < keys.size(); ++i)
    encode_record(records, op_set, keys[i], values[i]);
  state::file_lock lock(*state_, F_WRLCK);
  state_->read_new(true);
  state_->write_records(records); // one write(): other processes see all or none
}

asio::awaitable<std::vector<std::string>> file_store::do_list_keys(std::string prefix) {
  state_->refresh();
  std::vector<std::string> out;
  for (const auto& [k, v] : state_->cache_)
    if (k.starts_with(prefix))
      out.push_back(k);
  std::sort(out.begin(), out.end());
  co_return out;
}

asio::awaitable<watch_stream> file_store::do_watch_key(std::string key) {
  auto& s = *state_;
  s.refresh(); // changes already in the file are history, not events
  auto queue = std::make_shared<detail::watch_queue>(executor_);
  auto id = s.next_watch_id_++;
  queue->on_close = [weak = std::weak_ptr<state>(state_), ex = executor_, key, id] {
    asio::post(ex, [weak, key, id] {
      if (auto st = weak.lock())
        st->unwatch(key, id);
    });
  };
  s.watchers_[key].push_back(state::watcher{id, queue});
  if (!s.poller_running_) {
    s.poller_running_ = true;
    asio::co_spawn(executor_, state::poll_watches(state_), asio::detached);
  }
  co_return watch_stream(std::move(queue));
}

} // namespace corodist::store
