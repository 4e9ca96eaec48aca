#pragma once
/// \file
/// corodist::net::connection: a framed, multiplexed TCP connection.

#include <corodist/core/config.hpp>

#include <corodist/core/io_registration.hpp>
#include <corodist/core/unique_function.hpp>
#include <corodist/core/timeout.hpp>
#include <corodist/net/buffer.hpp>
#include <corodist/net/errors.hpp>
#include <corodist/net/frame.hpp>
#include <corodist/net/output_budget.hpp>

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/ip/tcp.hpp>
#include <asio/steady_timer.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace corodist::net {

using namespace std::chrono_literals;

class tls_context;

namespace detail {
class heartbeat_wheel;
class uring_service;
struct tls_stream;
} // namespace detail


/// A payload segment that lives elsewhere and is written with scatter/gather,
/// never copied: `owner` keeps `data` alive until the frame has been written.
struct segment {
  std::shared_ptr<const void> owner;
  asio::const_buffer data;
};

/// The default of `connection_options::peer_timeout`: `CORODIST_PEER_TIMEOUT_MS`
/// from the environment when it is set to a whole number of milliseconds (0:
/// off: `timeout::never()`), else `connection_options::default_peer_timeout`
/// (10 s); an invalid value is logged once and ignored. Read at each call; any thread.
corodist::timeout configured_peer_timeout() noexcept;

/// How a connection moves its bytes once started (after the hello).
enum class transport : std::uint8_t {
  asio,  ///< Asio's socket (its io_uring or epoll backend): the default
  uring, ///< corodist's own liburing service: the socket adopted into a ring's registered-file table
};

/// The default of `connection_options::io`: `CORODIST_NET_TRANSPORT` from the
/// environment ("asio" or "uring"), else transport::asio; another value is
/// logged once and ignored. Read at each call; any thread.
transport configured_transport() noexcept;

/// Why transport::uring cannot run here ("" when it can: an io_uring build on
/// a kernel that takes the rings, registered files and opcodes it needs).
/// Checked once; any thread.
std::string uring_unavailable_reason();

/// Limits and deadlines of a connection. The defaults are the named constants.
struct connection_options {
  static constexpr std::size_t default_max_frame_size = std::size_t{1} << 30;          // 1 GiB
  static constexpr std::size_t default_max_pending_requests = 65536;
  static constexpr std::size_t default_max_buffered_output = std::size_t{2} << 30;     // 2 GiB
  static constexpr std::chrono::milliseconds default_request_timeout = 60s;
  static constexpr std::chrono::milliseconds default_handshake_timeout = 10s;
  static constexpr std::chrono::milliseconds default_frame_timeout = 30s;
  /// peer_timeout's default unless CORODIST_PEER_TIMEOUT_MS says otherwise.
  static constexpr std::chrono::milliseconds default_peer_timeout = 10s;

  /// Largest payload accepted from the peer (and sent to it).
  std::size_t max_frame_size = default_max_frame_size;
  /// Most requests this side may have awaiting a response at once.
  std::size_t max_pending_requests = default_max_pending_requests;
  /// Unwritten output (queued, or in the write in flight) above which the peer
  /// is deemed not to read and is dropped (a lone frame larger than this, with
  /// nothing else unwritten, is sent).
  std::size_t max_buffered_output = default_max_buffered_output;
  /// Time limit of `request()` without a deadline of its own (`never()`: none;
  /// `inherit()` is the default, 60 s).
  corodist::timeout request_timeout = default_request_timeout;
  /// Time limit of TCP connect plus the hello exchange (`inherit()`: the
  /// default, 10 s; `never()`: none).
  corodist::timeout handshake_timeout = default_handshake_timeout;
  /// An incomplete incoming frame that receives no byte for this long closes the
  /// connection (errc::frame_stalled); `never()`: never (`inherit()`: 30 s).
  corodist::timeout frame_timeout = default_frame_timeout;
  /// Failure detection once started: each side sends a heartbeat (a control
  /// frame never delivered to the request handler) when it has sent nothing
  /// for about a quarter of this, and a connection that receives no byte for
  /// this long closes with errc::peer_timed_out (a peer that hangs, or a
  /// network that drops everything). `never()`: off. Default:
  /// configured_peer_timeout() (`inherit()` is the same).
  corodist::timeout peer_timeout = configured_peer_timeout();
  /// A cap shared with other connections on their queued output together (see
  /// output_budget); null: none.
  std::shared_ptr<output_budget> shared_output;
  /// Experimental (docs/net.md, "The liburing transport"): transport::uring
  /// moves the socket, once the connection starts, into the loop's liburing
  /// service (io_uring builds; SINGLE_ISSUER|DEFER_TASKRUN rings, registered
  /// files, batched submissions); it then no longer uses a file descriptor of
  /// the process. Where that service cannot run, the connection stays on Asio
  /// (logged once). Default: configured_transport().
  transport io = configured_transport();
  /// Shared secret. Server: if set, clients must prove they hold it
  /// (challenge-response, HMAC-SHA-256); client: the token to prove with.
  std::string auth_token;
  /// Client (connect): the local address to connect from, e.g. 127.0.0.2, so
  /// that many connections to one server do not exhaust the ephemeral ports
  /// of one source address (each source address has its own). The socket is
  /// bound to {address, 0} with IP_BIND_ADDRESS_NO_PORT, so the port is still
  /// picked at connect, per destination. It must be an address of this host,
  /// of the destination's family (else connect fails with the bind's error,
  /// or address_family_not_supported). nullopt: the kernel picks. Unused by accept.
  std::optional<asio::ip::address> local_address;
  /// TLS 1.3 under the framing (docs/tls.md): null (the default) is plain
  /// TCP. Set, connect() runs the TLS handshake as a client and accept() as
  /// a server, before the hello; a failure is the handshake's error (a
  /// tls_verify_category() code for a certificate that failed verification,
  /// e.g. "certificate verify failed: certificate has expired", else
  /// OpenSSL's, e.g. "tlsv1 alert unknown ca"). A TLS connection always runs
  /// on transport::asio (transport::uring is ignored for it, logged once).
  /// Made once with tls_context::make() and shared by many connections.
  std::shared_ptr<const tls_context> tls;
};

/// A received frame.
struct message {
  frame_header header;
  bytes payload;
};

/// The result of `request()`: an error code (zero on success) and the response.
/// With `errc::remote_failure` the payload holds the peer's error text.
struct response {
  std::error_code ec;
  message msg;
};

/// A framed TCP connection that multiplexes many requests by request id.
///
/// Loop-affine: every member function must be called on the thread running
/// the connection's executor (the socket's). Frames queued by many coroutines
/// in one turn of the loop go out in one gathered write; payload segments are
/// written in place. On connection loss every pending request completes at
/// once with `errc::connection_closed`. Owned through `std::shared_ptr`; the
/// read loop and in-flight writes keep it alive until it closes.
class connection : public std::enable_shared_from_this<connection> {
public:
  /// Called on the loop for each incoming request or one-way frame.
  using request_handler = std::function<void(const std::shared_ptr<connection>&, message&&)>;
  /// Called once on the loop when the connection closes, with the reason.
  using close_handler = std::function<void(std::error_code)>;

  /// Connects to `ep` and exchanges hellos within `opts.handshake_timeout`.
  /// Returns the error (or zero) and, on success, the unstarted connection.
  /// Cancellation: terminal (the awaiting coroutine's, see docs/core.md):
  /// throws `operation_aborted` (`std::system_error`); the socket is closed,
  /// nothing is left.
  [[nodiscard]] static asio::awaitable<std::pair<std::error_code, std::shared_ptr<connection>>>
  connect(asio::any_io_executor ex, asio::ip::tcp::endpoint ep, connection_options opts);

  /// As above with default options. (No default argument: GCC 12 destroys a
  /// brace-initialised aggregate temporary twice inside a co_await expression,
  /// so option structs are passed as named objects or through this overload.)
  [[nodiscard]] static asio::awaitable<std::pair<std::error_code, std::shared_ptr<connection>>>
  connect(asio::any_io_executor ex, asio::ip::tcp::endpoint ep) {
    return connect(std::move(ex), ep, connection_options{});
  }

  /// Server side: reads the peer's hello from an accepted socket and answers it,
  /// within `opts.handshake_timeout`. Wrong magic or version is an error; the
  /// socket is then closed.
  /// Cancellation: as connect (the socket is closed).
  [[nodiscard]] static asio::awaitable<std::pair<std::error_code, std::shared_ptr<connection>>>
  accept(asio::ip::tcp::socket socket, connection_options opts);

  connection(asio::ip::tcp::socket socket, connection_options opts);
  /// A connection whose bytes run through `tls` (its TLS handshake done):
  /// connect() and accept() make these when options' tls is set.
  connection(std::unique_ptr<detail::tls_stream> tls, connection_options opts);
  ~connection();
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  /// Starts the read loop. `on_request` receives requests and one-way frames;
  /// `on_close` runs once when the connection closes. Call once.
  void start(request_handler on_request = {}, close_handler on_close = {});

  /// Sends a request and waits for its response until `by` (a deadline that
  /// has passed fails at once with request_timeout, unsent). Never throws for
  /// network errors: they come back in `response::ec` (connection_closed,
  /// request_timeout, too_many_pending, frame_too_large, remote_failure).
  /// Cancellation: terminal, partial and total through the awaiting
  /// coroutine's cancellation slot: ec = operation_aborted at once; the
  /// request may already have been sent (the peer still handles it, and its
  /// late response is dropped); the connection stays usable.
  [[nodiscard]] asio::awaitable<response> request(std::uint16_t kind, bytes payload, std::vector<segment> segments,
                                                  corodist::deadline by);

  /// As above, within options' request_timeout from now. Cancellation: as above.
  [[nodiscard]] asio::awaitable<response> request(std::uint16_t kind, bytes payload,
                                                  std::vector<segment> segments = {});

  /// request() for callers that are not coroutines: sends a request as
  /// `next_request_id()` and calls `done` once, on the loop, with its response
  /// or error (as request()'s). A request that cannot be sent (closed, a
  /// passed deadline, too many pending, a frame too large) gets `done` before
  /// this returns. Cancel it with cancel_request(id). Loop only.
  void start_request(std::uint16_t kind, bytes payload, std::vector<segment> segments, corodist::deadline by,
                     corodist::unique_function<void(response)> done);

  /// Queues the response to request `request_id`. Returns an error if closed
  /// or the payload is too large; never blocks.
  std::error_code respond(std::uint64_t request_id, std::uint16_t kind, bytes payload,
                          std::vector<segment> segments = {});

  /// Queues an error response whose payload is `text`.
  std::error_code respond_error(std::uint64_t request_id, std::uint16_t kind, std::string_view text);

  /// Queues a one-way frame (no response).
  std::error_code send(std::uint16_t kind, bytes payload, std::vector<segment> segments = {});

  /// Closes the socket; pending requests fail with `errc::connection_closed`
  /// (with `errc::peer_timed_out` if that is `reason`); the close handler
  /// receives `reason`. Idempotent.
  void close(std::error_code reason = errc::connection_closed);

  /// True until closed.
  bool is_open() const noexcept { return open_; }

  /// Requests awaiting a response.
  std::size_t pending_requests() const noexcept { return pending_.size(); }
  /// The id the next `request()` on this connection sends (its peer sees it as
  /// the frame's request id), if it is sent. Loop only.
  std::uint64_t next_request_id() const noexcept { return next_id_; }
  /// Ends the pending request `request_id` now: its `request()` completes
  /// with ec = operation_aborted (as if cancelled through its slot), and a
  /// late response to it is dropped. Nothing if none is pending. Loop only.
  void cancel_request(std::uint64_t request_id);

  /// Stops reading once the frames already received have been delivered
  /// (flow control): the peer's further bytes wait in the kernel, and its
  /// sends block once the socket buffers are full. While paused, the peer
  /// counts as alive for peer_timeout as long as this side has nothing
  /// unwritten or its writes complete; a paused connection whose unwritten
  /// output does not move for peer_timeout is closed as a peer that does not
  /// read (errc::output_overflow, with a warning). Idempotent.
  void pause_reading() noexcept;
  /// Reads again after pause_reading() (a no-op unless paused or once closed).
  void resume_reading();
  /// Whether pause_reading() is in effect.
  bool reading_paused() const noexcept { return read_paused_; }

  /// Bytes of output not yet written to the socket: queued, and the write in
  /// flight (what max_buffered_output caps).
  std::size_t buffered_output() const noexcept { return queued_bytes_ + writing_bytes_; }
  /// `fn` runs on the loop after each write completes, and once (posted)
  /// when the connection closes; empty: nothing runs. Replaces the previous one.
  void on_output_written(std::function<void()> fn) { on_written_ = std::move(fn); }

  /// The peer's address (unspecified after close).
  asio::ip::tcp::endpoint remote_endpoint() const noexcept { return remote_; }

  /// The executor the connection lives on.
  asio::any_io_executor get_executor() noexcept { return socket_.get_executor(); }

  /// Native socket handle (for tests and diagnostics).
  int native_handle() noexcept;

  /// Whether the connection runs over TLS (options' tls was set).
  [[nodiscard]] bool is_tls() const noexcept { return tls_ != nullptr; }

  /// Whether the bytes go through the liburing service (options' io was
  /// transport::uring and the service took the socket at start()).
  [[nodiscard]] bool on_uring() const noexcept { return uring_ != nullptr; }

private:
  friend class detail::heartbeat_wheel;

  struct pending_request {
    corodist::unique_function<void(response)> complete;
    std::chrono::steady_clock::time_point deadline;
  };
  // What a connection keeps of its options once made: the limits and
  // deadlines that apply while it runs (the hello's token, source address and
  // deadline are used by connect()/accept() and not kept).
  struct limits {
    explicit limits(const connection_options& o)
        : max_frame_size(o.max_frame_size), max_pending_requests(o.max_pending_requests),
          max_buffered_output(o.max_buffered_output),
          request_timeout(o.request_timeout.or_else(connection_options::default_request_timeout)),
          frame_timeout(o.frame_timeout.or_else(connection_options::default_frame_timeout)),
          peer_timeout(o.peer_timeout.or_else(configured_peer_timeout())), shared_output(o.shared_output), io(o.io) {}
    std::size_t max_frame_size;
    std::size_t max_pending_requests;
    std::size_t max_buffered_output;
    corodist::timeout request_timeout;
    corodist::timeout frame_timeout;
    corodist::timeout peer_timeout;
    std::shared_ptr<output_budget> shared_output;
    transport io;
  };
  // A frame whose body is written in place; its header sits in the stage
  // buffer at `stage_offset`.
  struct large_frame {
    std::size_t stage_offset;
    bytes body;
    std::vector<segment> segments;
  };
  // One batch of output: small frames copied into `stage`, large ones by reference.
  struct batch {
    bytes stage;
    std::vector<large_frame> large;
    void clear() noexcept;
  };
  // The memory of the posted read and the socket's place on a liburing ring
  // (src/net/connection_io.hpp): what depends on Asio's and the ring's
  // internals stays out of this header.
  struct read_op_memory;
  struct io_state;
  template <typename T>
  class read_op_allocator;

  std::error_code enqueue(frame_header h, bytes&& body, std::vector<segment>&& segments);
  void schedule_write();
  void start_write();
  void send_queued_now();
  /// Posts the read of an idle connection (no incomplete frame buffered).
  void post_read();
  void on_read(std::error_code ec, std::size_t got, bool big);
  /// Completes the incomplete frame in carry_ (and any that follow), then posts the idle read again.
  asio::awaitable<void> read_incomplete();
  std::size_t parse(const std::byte* data, std::size_t n);
  /// Reads part (all = false: what is there) or all of `b` of an incomplete frame, under the stall watch.
  asio::awaitable<std::pair<std::error_code, std::size_t>> read_frame_bytes(asio::mutable_buffer b, bool all);
  void arm_stall_watch();
  void on_stall_watch();
  asio::awaitable<void> read_large_frame(frame_header h);
  void on_read_error(std::error_code ec, std::size_t frame_bytes);
  void dispatch(message&& m);
  void complete(std::uint64_t id, response r);
  void arm_timer(std::chrono::steady_clock::time_point deadline);
  void on_timer();
  /// Moves the socket into the loop's uring_service (options' io = uring).
  void adopt_into_uring();
  /// Cancels the socket's pending operations on the ring (they end with operation_aborted).
  void cancel_on_uring() noexcept;
  /// Frees the socket's slot on the ring (closing it) and leaves the ring.
  void close_on_uring() noexcept;
  /// Sends iov_ through the ring, again after a short count, then write_done().
  void uring_write();
  /// The end of a write (either transport): the next one, or the close on an error.
  void write_done(std::error_code ec);
  void start_heartbeat();
  void stop_heartbeat() noexcept;
  void on_heartbeat(bool confirming);
  /// The TCP socket: socket_, or the one under the TLS stream.
  asio::ip::tcp::socket& tcp() noexcept;

  asio::ip::tcp::socket socket_; // (unopened on a TLS connection: its socket is tls_'s)
  std::unique_ptr<detail::tls_stream> tls_; // TLS connections only
  limits opts_;
  asio::ip::tcp::endpoint remote_;
  std::unique_ptr<asio::steady_timer> timer_; // request deadlines; made on first use
  std::unique_ptr<asio::steady_timer> stall_timer_; // frame_timeout watchdog; made on first use
  std::chrono::steady_clock::time_point progress_at_; // last byte of an incomplete frame
  std::chrono::steady_clock::time_point received_at_; // last read completion
  std::chrono::steady_clock::time_point sent_at_;     // last write handed to the socket
  detail::uring_service* uring_ = nullptr; // the socket's ring service when on uring (socket_ is then empty)
  detail::heartbeat_wheel* wheel_ = nullptr; // peer_timeout: the loop's wheel this is on, from start to close
  std::uint32_t wheel_slot_ = 0;             // its place on the wheel
  std::uint32_t wheel_index_ = 0;
  bool in_frame_ = false;           // a read of an incomplete frame is pending
  bool stall_watch_armed_ = false;
  bool stalled_ = false;
  bool open_ = true;
  bool started_ = false;
  bool writing_ = false;
  bool write_scheduled_ = false;
  bool read_paused_ = false;  // pause_reading(): post no further read
  bool read_parked_ = false;  // the read loop stopped for the pause: resume_reading() restarts it
  bool parsing_ = false;      // on_read() is handing frames to dispatch(): a write waits for its end
  bool write_after_parse_ = false; // a write was scheduled meanwhile: on_read() starts it
  std::chrono::steady_clock::time_point written_at_; // last write completed (peer_timeout while paused)
  std::function<void()> on_written_; // on_output_written()
  std::shared_ptr<connection> parked_hold_; // keeps a parked connection alive (no read holds it) until resumed or closed
  std::optional<std::chrono::steady_clock::time_point> timer_deadline_;
  request_handler on_request_;
  close_handler on_close_;
  std::unordered_map<std::uint64_t, pending_request> pending_;
  std::uint64_t next_id_ = 1;
  batch queued_;  // frames waiting for the next write
  batch writing_batch_; // frames of the write in flight
  std::vector<asio::const_buffer> iov_; // a write's buffers when it has more than one
  std::size_t queued_bytes_ = 0; // bytes in queued_ (also counted in opts_.shared_output)
  std::size_t writing_bytes_ = 0; // bytes of writing_batch_ (counted in opts_.shared_output until written)
  std::size_t queued_frames_ = 0; // frames queued since the last send
  bytes carry_;                  // the start of an incomplete incoming frame
  std::array<std::byte, 512> head_; // target of the read posted while traffic is light
  bytes big_;                       // 64 KiB read target while reads keep filling head_
  bytes scratch_hold_;              // keeps a released big_ alive until parsed
  std::unique_ptr<io_state> io_;    // the posted read's operation; the socket's place on the ring
  corodist::io_registration registration_; // closes us at context shutdown; last: goes first
};

} // namespace corodist::net
