#include <corodist/store/file_store.hpp>

#include <corodist/core/error.hpp>
#include <corodist/store/errors.hpp>

#include "core/log.hpp"
#include "store/local/engine_ops.hpp" // the engine the file's log is replayed into, and its rules

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

/// How often pending waits and open watches look at the file again.
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

/// The file's log replayed into the engine: the file_store's implementation.
/// Touched only on the executor; the poller holds it weakly.
class file_ops final : public detail::engine_ops {
public:
  file_ops(asio::any_io_executor ex, std::string path, int fd)
      : engine_ops(std::move(ex), "file_store '" + path + "'"), path_(std::move(path)), fd_(fd) {}
  /// Closes the file; the watch streams still open end with store_error (on the executor).
  ~file_ops() override {
    ::close(fd_);
    auto open = open_watches();
    if (open.empty())
      return;
    try {
      asio::post(ex_, [open = std::move(open),
                       gone = std::make_exception_ptr(store_error("file_store '" + path_ + "' was destroyed"))] {
        for (auto& q : open)
          q->fail(gone);
      });
    } catch (const std::exception& e) {
      CORODIST_LOG_ERROR("file_store '{}': cannot end its watch streams: {}", path_, e.what());
    }
  }
  file_ops(const file_ops&) = delete;
  file_ops& operator=(const file_ops&) = delete;

  asio::awaitable<void> do_set_owned(std::string key, std::string) override {
    throw usage_error("file_store: set_owned('" + key + "'): a file has no connections to tie a key to; owned keys "
                      "need a tcp_store");
    co_return;
  }

  asio::awaitable<void> do_set(std::string key, std::string value) override {
    std::string record;
    encode_record(record, op_set, key, value);
    file_lock lock(*this, F_WRLCK);
    read_new(true);
    write_records(record);
    co_return;
  }

  asio::awaitable<std::int64_t> do_add(std::string key, std::int64_t delta) override {
    file_lock lock(*this, F_WRLCK);
    read_new(true);
    const auto next = detail::rules::added(key, engine_->get(key), delta);
    std::string record;
    encode_record(record, op_set, key, std::to_string(next));
    write_records(record);
    co_return next;
  }

  asio::awaitable<std::string> do_compare_set(std::string key, std::string expected, std::string desired) override {
    file_lock lock(*this, F_WRLCK);
    read_new(true);
    auto* current = engine_->get(key);
    if (!detail::rules::compare_set_stores(current, expected))
      co_return detail::rules::compare_set_unchanged(current, expected);
    std::string record;
    encode_record(record, op_set, key, desired);
    write_records(record);
    co_return desired;
  }

  asio::awaitable<bool> do_delete_key(std::string key) override {
    file_lock lock(*this, F_WRLCK);
    read_new(true);
    if (!engine_->get(key))
      co_return false;
    std::string record;
    encode_record(record, op_delete, key, {});
    write_records(record);
    co_return true;
  }

  asio::awaitable<void> do_append(std::string key, std::string value) override {
    file_lock lock(*this, F_WRLCK);
    read_new(true);
    std::string record;
    encode_record(record, op_set, key, detail::rules::appended(key, engine_->get(key), value, engine_->limits()));
    write_records(record);
    co_return;
  }

  asio::awaitable<void> do_multi_set(std::vector<std::string> keys, std::vector<std::string> values) override {
    detail::rules::check_multi_set(keys, values);
    if (keys.empty())
      co_return;
    std::string records;
    for (std::size_t i = 0; i < keys.size(); ++i)
      encode_record(records, op_set, keys[i], values[i]);
    file_lock lock(*this, F_WRLCK);
    read_new(true);
    write_records(records); // one write(): other processes see all or none
  }

private:
  /// An OFD fcntl lock on the whole file, held for the object's lifetime.
  /// Never held across a co_await (other coroutines of this store share the
  /// open file description, so they would not be excluded).
  class file_lock {
  public:
    file_lock(file_ops& f, short type) : f_(f) {
      struct flock fl {};
      fl.l_type = type;
      fl.l_whence = SEEK_SET; // l_start = l_len = 0: the whole file, however long
      while (::fcntl(f_.fd_, lock_wait_cmd, &fl) != 0) {
        if (errno != EINTR)
          throw_errno("cannot lock", f_.path_, errno);
      }
    }
    ~file_lock() {
      struct flock fl {};
      fl.l_type = F_UNLCK;
      fl.l_whence = SEEK_SET;
      if (::fcntl(f_.fd_, unlock_cmd, &fl) != 0)
        CORODIST_LOG_ERROR("file_store '{}': unlock failed: {}", f_.path_, std::system_category().message(errno));
    }
    file_lock(const file_lock&) = delete;
    file_lock& operator=(const file_lock&) = delete;

  private:
    file_ops& f_;
  };

  /// Replays the records appended since the last read, taking a shared lock
  /// only if the file has grown (or shrunk) since then.
  void refresh() override {
    if (file_size() == offset_)
      return;
    file_lock lock(*this, F_RDLCK);
    read_new(false);
  }

  /// Something awaits the file: looks at it every poll_interval while a wait
  /// is pending or a watch is open.
  void awaiting() override {
    if (polling_)
      return;
    polling_ = true;
    asio::co_spawn(ex_, poll(weak_from_this()), asio::detached);
  }

  static asio::awaitable<void> poll(std::weak_ptr<store> weak) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (;;) {
      timer.expires_after(poll_interval);
      co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
      auto self = std::static_pointer_cast<file_ops>(weak.lock());
      if (!self)
        co_return;
      if (!self->awaited()) {
        self->polling_ = false;
        co_return;
      }
      try {
        self->refresh();
      } catch (const std::exception& e) {
        CORODIST_LOG_ERROR("file_store '{}': reading the file failed, ending the watch streams: {}", self->path_,
                           e.what());
        auto error = std::current_exception();
        for (auto& q : self->open_watches())
          q->fail(error);
      }
    }
  }

  /// Whether a wait is pending or a watch is open.
  bool awaited() const { return engine_->pending_waits() > 0 || engine_->watch_count() > 0; }

  /// Replays the records appended since the last read. Call under a lock; with
  /// `exclusive`, a torn tail (which no live writer can be producing, since
  /// writers hold the exclusive lock) is cut off so that appends follow valid data.
  void read_new(bool exclusive) {
    auto size = file_size();
    if (size < offset_) {
      CORODIST_LOG_WARN("file_store '{}': the file shrank from {} to {} bytes behind our back; reloading it", path_,
                        offset_, size);
      for (auto& k : engine_->list({})) // (watchers see the keys go, and come back with the reload)
        engine_->erase(k);
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
    auto used = replay(buf);
    if (used == buf.size())
      return;
    // An incomplete record at the end: a writer died inside write().
    if (exclusive) {
      CORODIST_LOG_WARN("file_store '{}': dropping a torn record of {} bytes at offset {}", path_, buf.size() - used,
                        offset_);
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

  /// Appends `records` with one write() and replays them. Call under the
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
    replay(records);
  }

  /// Replays the complete records at the start of `buf` (which begins at
  /// offset_) into the engine, advancing offset_ past each: waiters and
  /// watchers of their keys hear of them there. Returns the bytes consumed.
  std::size_t replay(std::string_view buf) {
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
      pos += total;
      offset_ += total;
      if (op == op_set)
        engine_->set(std::move(key), std::string(buf.substr(pos - value_len, value_len)));
      else
        engine_->erase(key);
    }
    return pos;
  }

  std::uint64_t file_size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0)
      throw_errno("cannot stat", path_, errno);
    return static_cast<std::uint64_t>(st.st_size);
  }

  std::string path_;
  int fd_;
  std::uint64_t offset_ = 0; ///< bytes of the log replayed into the engine (always a record boundary)
  std::uint64_t torn_warned_at_ = std::numeric_limits<std::uint64_t>::max();
  bool polling_ = false;
};

int open_file(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0)
    throw_errno("cannot open", path, errno);
  return fd;
}

} // namespace

file_store::file_store(asio::any_io_executor ex, std::string path)
    : basic_store(std::make_shared<file_ops>(ex, path, open_file(path))), path_(std::move(path)) {
  CORODIST_LOG_DEBUG("file_store: opened '{}'", path_);
}

file_store::~file_store() = default;

} // namespace corodist::store
