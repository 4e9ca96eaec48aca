#pragma once
// A private liburing-native I/O service for sockets: one
// per asio::io_context, made on first use from the loop thread
// (asio::use_service<uring_service>(ctx)). It keeps Asio's executor model for
// everything above it: operations are started with asio::async_initiate (so a
// coroutine co_awaits them with asio::use_awaitable, or with
// asio::experimental::as_tuple(asio::use_awaitable)), and their handlers run on
// the loop, dispatched through their associated executor.
//
// Sockets are *adopted*: the descriptor goes into a free slot of a ring's
// sparse registered-file table and the ordinary descriptor is closed, so an
// adopted socket no longer counts against RLIMIT_NOFILE. Each ring's table may
// be as large as RLIMIT_NOFILE (the kernel checks the limit per ring, not in
// total: io_uring/rsrc.c, io_sqe_files_register), so several rings hold more
// sockets than the process may have descriptors. A new ring is made when the
// tables are full (at most max_rings).
//
// Rings are set up with IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN (falling
// back to COOP_TASKRUN, then to no flag; setup_flags() says which). All of a
// service's rings signal one eventfd (io_uring_register_eventfd); the service
// waits on it with a stream_descriptor on the io_context while operations are
// in flight, and on each wake runs the rings' deferred task work
// (io_uring_submit_and_get_events, only where IORING_SQ_TASKRUN says there is
// some) and reaps their completions. Submissions are batched: the operations
// started during one turn of the loop go to the kernel together (one
// io_uring_enter per ring), or at once when a submission queue is full.
//
// Everything here is loop-thread only: SINGLE_ISSUER rings refuse a submission
// or a registration from any other thread than the one that made them (the
// first adopt()), so the io_context must keep being run by that one thread.
//
// Memory per adopted socket: the service keeps no per-socket state. The caller
// holds an 8-byte uring_file; a released slot costs 4 bytes in the ring's free
// list; an operation in flight is one block from the handler's allocator
// (op header + handler: 48 bytes for a use_awaitable receive, recv_op_size()).
// The kernel holds a file pointer (8 bytes) per slot of each table, and for a
// pending receive its request and poll entry. Per ring: an SQ of sq_entries
// SQEs (64 B each) and a CQ of cq_entries CQEs (16 B each), 80 KiB in all.
#include <corodist/core/config.hpp>

#if CORODIST_IO_URING

#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_allocator.hpp>
#include <asio/associated_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/buffer.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution_context.hpp>
#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/recycling_allocator.hpp>

#include <sys/socket.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace corodist::net::detail {

/// A socket adopted into a ring's registered-file table. Like a descriptor
/// number it is a plain value: after close() the slot may be given to another
/// socket, so a closed uring_file must not be used again.
struct uring_file {
  static constexpr std::uint32_t invalid = ~std::uint32_t{0};
  std::uint32_t ring = invalid; ///< index of the ring (in its service)
  std::uint32_t slot = invalid; ///< index in that ring's fixed-file table

  /// Whether this names a slot (adopt() succeeded).
  [[nodiscard]] bool valid() const noexcept { return ring != invalid && slot != invalid; }
  friend bool operator==(const uring_file&, const uring_file&) = default;
};

class uring_service final : public asio::execution_context::service {
public:
  /// Asio's service identity.
  static asio::io_context::id id;

  /// Most rings one service makes.
  static constexpr std::size_t max_rings = 16;
  /// Most slots in one ring's table (also bounded by the RLIMIT_NOFILE soft
  /// limit at the time the ring is made).
  static constexpr std::uint32_t max_slots_per_ring = 1u << 16;
  /// Submission and completion queue sizes of each ring.
  static constexpr unsigned sq_entries = 256;
  static constexpr unsigned cq_entries = 4096;
  /// Buffers sent inline by async_send without a heap array.
  static constexpr std::size_t inline_iovecs = 8;

  /// Made by asio::use_service<uring_service>(ctx); makes no ring yet.
  explicit uring_service(asio::io_context& ctx);
  ~uring_service() override;
  uring_service(const uring_service&) = delete;
  uring_service& operator=(const uring_service&) = delete;

  /// Whether io_uring with what this service needs (a ring, a sparse file
  /// table, an eventfd, the recv/send/sendmsg/cancel opcodes) works here (a
  /// sandbox or an old kernel may forbid it). Writes the reason, or the ring
  /// setup flags the kernel accepted, to `*why` when given. Any thread.
  static bool available(std::string* why = nullptr);

  /// Registers `fd` into a free slot of a ring with room (making a ring if all
  /// are full) and closes `fd` on success: the socket then lives in the table
  /// only. On failure `fd` is left open and `ec` says why. Loop thread.
  uring_file adopt(int fd, std::error_code& ec);

  /// Receives at most `buf.size()` bytes: completes with (error, bytes); 0
  /// bytes from the peer is asio::error::eof; a cancelled receive completes
  /// with asio::error::operation_aborted. Supports a cancellation slot
  /// (terminal, partial and total cancellation). Loop thread.
  template <typename CompletionToken>
  auto async_recv(uring_file f, asio::mutable_buffer buf, CompletionToken&& token) {
    return initiate_recv(f, buf, false, std::forward<CompletionToken>(token));
  }

  /// As async_recv, but the kernel goes on until `buf` is full (MSG_WAITALL:
  /// one completion for a whole frame, however many segments it came in).
  /// End of file before that completes with asio::error::eof and the bytes
  /// received so far; so does a reset or a cancel()/close() part way (the
  /// kernel reports the count only), but a cancellation through the slot
  /// gives operation_aborted. (At most 1 GiB in one receive.)
  template <typename CompletionToken>
  auto async_recv_all(uring_file f, asio::mutable_buffer buf, CompletionToken&& token) {
    return initiate_recv(f, buf, true, std::forward<CompletionToken>(token));
  }

  /// Sends the gathered `bufs` (one sendmsg): completes with (error, bytes
  /// written), which may be fewer than asked, like write_some. The buffer
  /// descriptions are copied at initiation (the bytes must stay until the
  /// completion); at most IOV_MAX of them go in one send. A cancellation slot
  /// works as for async_recv. Loop thread.
  template <typename CompletionToken>
  auto async_send(uring_file f, std::span<const asio::const_buffer> bufs, CompletionToken&& token) {
    return initiate_send(f, bufs, false, std::forward<CompletionToken>(token));
  }

  /// As async_send, but the kernel goes on until every byte is written
  /// (MSG_WAITALL): the count is then the total. Stopped part way (the kernel
  /// reports the count only), it completes with asio::error::broken_pipe, or
  /// operation_aborted if cancelled through the cancellation slot, and the
  /// count written.
  template <typename CompletionToken>
  auto async_send_all(uring_file f, std::span<const asio::const_buffer> bufs, CompletionToken&& token) {
    return initiate_send(f, bufs, true, std::forward<CompletionToken>(token));
  }

  /// Cancels every operation pending on `f`: they complete with
  /// asio::error::operation_aborted. The socket stays usable. Loop thread.
  void cancel(uring_file f);

  /// Cancels what is pending on `f` (operation_aborted) and frees its slot
  /// (reusable at once); the socket itself is closed by the kernel when the
  /// cancelled operations have let go of it. Loop thread.
  void close(uring_file f);

  /// Rings made so far.
  [[nodiscard]] std::size_t ring_count() const noexcept { return rings_.size(); }
  /// Sockets adopted and not closed.
  [[nodiscard]] std::size_t adopted_count() const noexcept { return adopted_; }
  /// Submissions whose completion has not been reaped yet (internal ones included).
  [[nodiscard]] std::size_t in_flight() const noexcept { return in_flight_; }
  /// The IORING_SETUP_* flags the rings were made with (0 before the first ring).
  [[nodiscard]] unsigned setup_flags() const noexcept { return setup_flags_; }
  /// setup_flags() in words.
  [[nodiscard]] static std::string describe_flags(unsigned flags);
  /// Wakes through the eventfd so far (for tests and measurements).
  [[nodiscard]] std::uint64_t eventfd_wakes() const noexcept { return eventfd_wakes_; }
  /// The io_context this service belongs to.
  [[nodiscard]] asio::io_context& context() noexcept { return ctx_; }

  struct op_base;
  struct send_op_base;
  template <typename Base, typename Handler>
  struct handler_op;
  /// Bytes of one receive (send) operation in flight with handler type `Handler`.
  template <typename Handler>
  static constexpr std::size_t recv_op_size() noexcept { return sizeof(handler_op<op_base, Handler>); }
  template <typename Handler>
  static constexpr std::size_t send_op_size() noexcept { return sizeof(handler_op<send_op_base, Handler>); }

  /// An operation in flight: the handler-free part, linked into the
  /// service's list of them (what shutdown() destroys). user_data of its SQE.
  struct op_base {
    /// Completes (owner != nullptr: dispatches the handler) or only destroys
    /// (owner == nullptr: at shutdown) the operation, freeing it first.
    using complete_fn = void (*)(op_base*, uring_service* owner, std::error_code, std::size_t);
    explicit op_base(complete_fn fn) noexcept : fn_(fn) {}
    op_base(const op_base&) = delete;
    op_base& operator=(const op_base&) = delete;
    complete_fn fn_;
    op_base* prev_ = nullptr;
    op_base* next_ = nullptr;
    std::uint32_t ring_ = uring_file::invalid; ///< the ring its SQE went to; invalid: not on a ring
    std::uint32_t want_all_ = 0; ///< with MSG_WAITALL: bytes asked for (fewer: stopped part way)
    bool cancel_requested_ = false;
    bool want_eof_ = false; ///< a receive: 0 bytes is end of file
  };

  /// A send: the message header and the buffer array must live until the
  /// kernel has taken them.
  struct send_op_base : op_base {
    using op_base::op_base;
    msghdr msg_{};
    iovec inline_iov_[inline_iovecs]{};
    std::unique_ptr<iovec[]> heap_iov_;
  };

  /// An operation with its handler, allocated with the handler's associated
  /// allocator (by default Asio's per-thread recycling allocator, as Asio's
  /// own operations are: no malloc per operation on the loop).
  template <typename Base, typename Handler>
  struct handler_op final : Base {
    using allocator_type = typename std::allocator_traits<
        asio::associated_allocator_t<Handler, asio::recycling_allocator<void>>>::template rebind_alloc<handler_op>;

    template <typename H>
    explicit handler_op(H&& h) : Base(&do_complete), handler_(std::forward<H>(h)) {}

    template <typename H>
    static handler_op* make(H&& h) {
      allocator_type alloc(asio::get_associated_allocator(h, asio::recycling_allocator<void>()));
      handler_op* p = std::allocator_traits<allocator_type>::allocate(alloc, 1);
      try {
        return ::new (static_cast<void*>(p)) handler_op(std::forward<H>(h));
      } catch (...) {
        std::allocator_traits<allocator_type>::deallocate(alloc, p, 1);
        throw;
      }
    }

    static void do_complete(op_base* base, uring_service* owner, std::error_code ec, std::size_t n) {
      auto* self = static_cast<handler_op*>(base);
      // The cancellation handler in the slot points at this operation: gone first.
      asio::get_associated_cancellation_slot(self->handler_).clear();
      allocator_type alloc(asio::get_associated_allocator(self->handler_, asio::recycling_allocator<void>()));
      Handler handler(std::move(self->handler_));
      self->~handler_op(); // freed before the upcall, as Asio does
      std::allocator_traits<allocator_type>::deallocate(alloc, self, 1);
      if (owner == nullptr)
        return;
      auto ex = asio::get_associated_executor(handler, owner->ctx_.get_executor());
      // On the loop thread with the loop's executor this runs the handler inline.
      asio::dispatch(ex, [h = std::move(handler), ec, n]() mutable { std::move(h)(ec, n); });
    }

    Handler handler_;
  };

private:
  struct ring;

  /// What a cancellation slot holds for an operation in flight.
  struct cancel_handler {
    cancel_handler(uring_service* svc, op_base* op) noexcept : svc_(svc), op_(op) {}
    void operator()(asio::cancellation_type_t type) {
      if ((type & (asio::cancellation_type::terminal | asio::cancellation_type::partial |
                   asio::cancellation_type::total)) != asio::cancellation_type::none)
        svc_->cancel_op(op_);
    }
    uring_service* svc_;
    op_base* op_;
  };

  template <typename Op>
  void connect_cancellation(Op* op) {
    auto slot = asio::get_associated_cancellation_slot(op->handler_);
    if (slot.is_connected())
      slot.template emplace<cancel_handler>(this, op);
  }

  template <typename CompletionToken>
  auto initiate_recv(uring_file f, asio::mutable_buffer buf, bool all, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(std::error_code, std::size_t)>(
        [this, f, buf, all](auto&& handler) {
          using handler_t = std::decay_t<decltype(handler)>;
          auto* op = handler_op<op_base, handler_t>::make(std::forward<decltype(handler)>(handler));
          connect_cancellation(op);
          start_recv(f, buf, all, op);
        },
        token);
  }

  template <typename CompletionToken>
  auto initiate_send(uring_file f, std::span<const asio::const_buffer> bufs, bool all, CompletionToken&& token) {
    return asio::async_initiate<CompletionToken, void(std::error_code, std::size_t)>(
        [this, f, bufs, all](auto&& handler) {
          using handler_t = std::decay_t<decltype(handler)>;
          auto* op = handler_op<send_op_base, handler_t>::make(std::forward<decltype(handler)>(handler));
          connect_cancellation(op);
          start_send(f, bufs, all, op);
        },
        token);
  }

  void shutdown() override;

  void start_recv(uring_file f, asio::mutable_buffer buf, bool all, op_base* op);
  void start_send(uring_file f, std::span<const asio::const_buffer> bufs, bool all, send_op_base* op);
  void cancel_op(op_base* op);
  void queue_internal(ring& r, struct io_uring_sqe* sqe);

  // Helpers (uring_service.cpp).
  ring* ring_of(uring_file f) noexcept;
  ring* ring_with_room(std::error_code& ec);
  bool make_eventfd(std::error_code& ec);
  struct io_uring_sqe* get_sqe(ring& r, std::error_code& ec);
  void track(op_base* op, ring& r);
  void untrack(op_base* op) noexcept;
  void complete_soon(op_base* op, std::error_code ec, std::size_t n);
  void run_immediate();
  void request_submit();
  void submit_all();
  void arm_wait();
  void on_wake();
  void run_pass();
  bool reap(ring& r);
  void post_pass();
  [[nodiscard]] bool foreign_thread() const noexcept;

  asio::io_context& ctx_;
  asio::posix::stream_descriptor efd_;
  std::vector<std::unique_ptr<ring>> rings_;
  unsigned setup_flags_ = 0;
  std::thread::id issuer_; ///< the thread that made the rings (SINGLE_ISSUER)
  op_base* ops_ = nullptr; ///< operations on a ring, not yet reaped
  struct immediate {
    op_base* op;
    std::error_code ec;
    std::size_t n;
  };
  std::vector<immediate> immediate_; ///< finished without the kernel, to complete from a post
  std::size_t in_flight_ = 0;
  std::size_t adopted_ = 0;
  std::uint64_t eventfd_wakes_ = 0;
  bool wait_armed_ = false;
  bool submit_posted_ = false;
  bool pass_posted_ = false;
  bool immediate_posted_ = false;
  bool in_pass_ = false;
  bool shut_down_ = false;
};

} // namespace corodist::net::detail

#endif // CORODIST_IO_URING
