#pragma once
/// \file
/// What the rref<T> templates need of the RRef protocol, behind an interface
/// (implemented in src/rref/ by reference_tracker), and the two objects they share
/// with it: a handle (one UserRRef, or one reference to an OwnerRRef) and the
/// OwnerRRef's value.

#include <corodist/core/config.hpp>

#include <corodist/core/timeout.hpp>

#include <corodist/core/error.hpp>
#include <corodist/core/future.hpp>
#include <corodist/rpc/codec.hpp>
#include <corodist/rpc/decode_result.hpp>
#include <corodist/rpc/message_port.hpp>
#include <corodist/rref/rref_id.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <typeinfo>

namespace corodist::rpc {
class agent;
}

namespace corodist::rref::detail {

/// An RRef as it travels inside a message: which RRef, its owner, the new
/// fork made for the receiver, and who made it (the parent).
struct fork_info {
  rref_id id;
  std::int32_t owner = -1;
  fork_id fork;
  std::int32_t parent = -1;
};

class protocol;

/// The value of an OwnerRRef: as its function returned it (encoded), or as a
/// typed object once used as one (local_value(), a method). One mutex: methods
/// and encodings of one value take turns. Thread-safe.
class value_slot {
public:
  /// An encoded value (as remote()'s function returned it).
  explicit value_slot(rpc::payload encoded) : encoded_(std::move(encoded)) {}
  /// A typed value (make_rref).
  template <typename T>
  static std::shared_ptr<value_slot> of(T v) {
    auto s = std::make_shared<value_slot>(rpc::payload{});
    s->encoded_.reset();
    s->set_typed(std::make_shared<T>(std::move(v)));
    return s;
  }

  /// The value as a T (decoded once, then kept: changes made through it are
  /// what later readers see). Throws usage_error if it was used as another type,
  /// rpc::bad_result_error if it does not decode to T.
  template <typename T>
  std::shared_ptr<T> as(rpc::message_port* port, int self) {
    std::lock_guard lk(mutex_);
    if (typed_) {
      if (*type_ != typeid(T))
        throw usage_error("rref: the value is a " + rpc::demangle(type_->name()) + ", not a " +
                          rpc::demangle(typeid(T).name()));
      return std::static_pointer_cast<T>(typed_);
    }
    auto v = std::make_shared<T>(rpc::decode_result<T>(*port, self, flatten(), "local_value of an RRef"));
    set_typed(v);
    encoded_.reset();
    return v;
  }

  /// The value encoded for `peer` (any thread).
  rpc::payload encode_for(rpc::message_port* port, int self, int peer) {
    std::lock_guard lk(mutex_);
    if (typed_)
      return encode_typed_(typed_.get(), port, self, peer);
    rpc::payload copy;
    copy.body = encoded_->body;
    copy.attachments = encoded_->attachments;
    return copy;
  }

  /// Runs `f(value)` with the value locked (methods).
  template <typename T, typename F>
  auto with(rpc::message_port* port, int self, F&& f) {
    auto v = as<T>(port, self);
    std::lock_guard lk(mutex_);
    return f(*v);
  }

  /// Bytes held (statistics).
  std::size_t encoded_size() const {
    std::lock_guard lk(mutex_);
    return encoded_ ? encoded_->size() : 0;
  }

private:
  template <typename T>
  void set_typed(std::shared_ptr<T> v) {
    typed_ = std::move(v);
    type_ = &typeid(T);
    encode_typed_ = [](const void* p, rpc::message_port* port, int self, int peer) {
      rpc::encoder e(port, self, peer);
      return rpc::encode_value(e, *static_cast<const T*>(p));
    };
  }
  // The encoded value as one received payload (attachments appended).
  net::bytes flatten() const {
    net::bytes b = encoded_->body;
    for (auto& a : encoded_->attachments) {
      const auto* p = static_cast<const std::byte*>(a.data.data());
      b.insert(b.end(), p, p + a.data.size());
    }
    return b;
  }

  mutable std::mutex mutex_;
  std::optional<rpc::payload> encoded_;
  std::shared_ptr<void> typed_;
  const std::type_info* type_ = nullptr;
  rpc::payload (*encode_typed_)(const void*, rpc::message_port*, int, int) = nullptr;
};

/// One UserRRef, or one reference to an OwnerRRef (on the owner); every copy of
/// an rref<T> made from it shares it. Its destruction is what the protocol's
/// G1 reacts to.
class handle {
public:
  handle(std::weak_ptr<protocol> p, rref_id id, fork_id fork, std::int32_t owner, bool is_owner)
      : protocol_(std::move(p)), id_(id), fork_(fork), owner_(owner), is_owner_(is_owner) {}
  ~handle();
  handle(const handle&) = delete;
  handle& operator=(const handle&) = delete;

  rref_id id() const noexcept { return id_; }
  fork_id fork() const noexcept { return fork_; }
  std::int32_t owner() const noexcept { return owner_; }
  bool is_owner() const noexcept { return is_owner_; }
  /// True once the owner knows this UserRRef (always, on the owner).
  bool confirmed() const noexcept { return confirmed_.load(std::memory_order_acquire); }
  void set_confirmed() noexcept { confirmed_.store(true, std::memory_order_release); }
  /// The protocol it belongs to, with its worker's port kept alive as long
  /// as the pointer is held; throws usage_error naming `op` ("to_here") and
  /// the RRef once that is gone (agent destroyed, or being destroyed).
  std::shared_ptr<protocol> protocol_of(std::string_view op) const;

private:
  std::weak_ptr<protocol> protocol_;
  rref_id id_;
  fork_id fork_;
  std::int32_t owner_;
  bool is_owner_;
  std::atomic<bool> confirmed_{false};
};

/// The RRef protocol of one worker, as the templates see it. Implemented by
/// reference_tracker (src/rref/); thread-safe unless said otherwise.
class protocol {
public:
  virtual ~protocol() = default;

  /// The worker's message port and rank; its agent (null in a simulation).
  virtual rpc::message_port& port() = 0;
  virtual int self() const = 0;
  virtual rpc::agent* agent() = 0;
  /// A reference that keeps the worker's port alive while a call into this
  /// protocol runs on a thread of the application (null where the port
  /// outlives the protocol). Throws usage_error naming `op` once the port is
  /// gone: its agent was destroyed, perhaps while this call was on its way.
  virtual std::shared_ptr<const void> hold_port(std::string_view op) const = 0;
  /// The time limit of to_here() and of remote()'s creation without one.
  virtual corodist::timeout default_timeout() const = 0;

  /// A new RRef owned by `owner`, created by this worker: its handle (a
  /// UserRRef not yet confirmed, or the owner's own when `owner` is this worker).
  virtual std::shared_ptr<handle> new_remote(int owner) = 0;
  /// Sends remote()'s call of `fn` for `h` (a body `[R, F, fn, [args], timeout]`
  /// encoded for the owner).
  virtual void send_remote(const std::shared_ptr<handle>& h, std::string_view fn, rpc::payload call,
                           corodist::deadline by) = 0;
  /// A new OwnerRRef here holding `v` (make_rref).
  virtual std::shared_ptr<handle> new_owned(std::shared_ptr<value_slot> v) = 0;

  /// Forks `h` for worker `peer`: what to encode (records the fork: G2).
  virtual fork_info fork_to(const std::shared_ptr<handle>& h, int peer) = 0;
  /// Takes an RRef that arrived from `from`: the receiver's handle.
  virtual std::shared_ptr<handle> adopt(const fork_info& f, int from) = 0;

  /// The value's encoded bytes from its owner (to_here): a frame payload.
  virtual future<net::bytes> fetch(const std::shared_ptr<handle>& h, corodist::deadline by) = 0;
  /// The OwnerRRef's value slot, on the owner (usage_error elsewhere, or if
  /// the value is not there yet; remote_error if its function failed).
  virtual std::shared_ptr<value_slot> local_slot(const handle& h) = 0;

  /// A handle is gone (any thread; never throws).
  virtual void released(const handle& h) noexcept = 0;

  /// The protocol attached to `port` (rref::context::enable); usage_error if none.
  static protocol& of(rpc::message_port& port);
};

inline handle::~handle() {
  if (auto p = protocol_.lock())
    p->released(*this);
}

inline std::shared_ptr<protocol> handle::protocol_of(std::string_view op) const {
  auto p = protocol_.lock();
  const auto gone = [&] {
    return usage_error(std::string(op) + " of RRef R" + id_.str() +
                       ": this worker's RRef context is gone (its agent was destroyed)");
  };
  if (!p)
    throw gone();
  std::shared_ptr<const void> port;
  try {
    port = p->hold_port(op);
  } catch (const usage_error&) {
    throw gone();
  }
  if (!port)
    return p;
  // One pointer that holds both: the protocol and the port it calls into.
  struct both {
    std::shared_ptr<protocol> p;
    std::shared_ptr<const void> port;
  };
  auto b = std::make_shared<both>(both{p, std::move(port)});
  return std::shared_ptr<protocol>(b, b->p.get());
}

} // namespace corodist::rref::detail
