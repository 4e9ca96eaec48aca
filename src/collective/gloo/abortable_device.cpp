#include "collective/gloo/abortable_device.hpp"

#include <gloo/common/error.h>
#include <gloo/transport/tcp/context.h>
#include <gloo/transport/tcp/unbound_buffer.h>

#include <exception>
#include <mutex>

namespace corodist::collective::detail {

namespace tcp = gloo::transport::tcp;

namespace {
class abortable_buffer;
}

/// The live buffers of a device's contexts (an intrusive list: nothing is
/// allocated per buffer), and the failure they all get.
struct buffer_registry {
  std::mutex mutex;
  abortable_buffer* live = nullptr;
  std::exception_ptr failure;
};

namespace {

class abortable_buffer : public tcp::UnboundBuffer {
public:
  /// `registry` outlives the buffer: its context holds it, and the buffer its context.
  abortable_buffer(const std::shared_ptr<tcp::Context>& context, void* ptr, std::size_t size,
                   buffer_registry& registry)
      : tcp::UnboundBuffer(context, ptr, size), registry_(registry) {
    std::lock_guard lk(registry_.mutex);
    if (registry_.failure)
      fail(registry_.failure);
    next_ = registry_.live;
    if (next_ != nullptr)
      next_->prev_ = this;
    registry_.live = this;
  }

  ~abortable_buffer() override {
    std::lock_guard lk(registry_.mutex);
    if (prev_ != nullptr)
      prev_->next_ = next_;
    else
      registry_.live = next_;
    if (next_ != nullptr)
      next_->prev_ = prev_;
  }

  /// Sets the buffer's exception and wakes its waits (Gloo's own way to fail it).
  void fail(std::exception_ptr e) { signalException(std::move(e)); }

  /// A send completed and not waited for, and no failure (see send_completed).
  bool send_done() {
    std::lock_guard lk(m_);
    return sendCompletions_ > 0 && ex_ == nullptr;
  }

  abortable_buffer* next() const noexcept { return next_; }

private:
  buffer_registry& registry_;
  abortable_buffer* prev_ = nullptr; // the registry's list, under its mutex
  abortable_buffer* next_ = nullptr;
};

class abortable_context : public tcp::Context {
public:
  abortable_context(std::shared_ptr<tcp::Device> device, int rank, int size, std::shared_ptr<buffer_registry> registry)
      : tcp::Context(std::move(device), rank, size), registry_(std::move(registry)) {}

  std::unique_ptr<gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr, std::size_t size) override {
    return std::make_unique<abortable_buffer>(shared_from_this(), ptr, size, *registry_);
  }

private:
  std::shared_ptr<buffer_registry> registry_;
};

} // namespace

std::shared_ptr<abortable_device> abortable_device::create(const tcp::attr& attr) {
  return std::make_shared<abortable_device>(tcp::CreateDeviceAttr(attr));
}

abortable_device::abortable_device(const tcp::attr& resolved)
    : tcp::Device(resolved), registry_(std::make_shared<buffer_registry>()) {}

abortable_device::~abortable_device() = default;

std::shared_ptr<gloo::transport::Context> abortable_device::createContext(int rank, int size) {
  auto self = std::static_pointer_cast<tcp::Device>(shared_from_this());
  return std::make_shared<abortable_context>(std::move(self), rank, size, registry_);
}

bool send_completed(gloo::transport::UnboundBuffer& b) {
  auto* a = dynamic_cast<abortable_buffer*>(&b);
  return a != nullptr && a->send_done();
}

void abortable_device::fail_buffers(const std::string& why) {
  std::lock_guard lk(registry_->mutex);
  if (!registry_->failure)
    registry_->failure = std::make_exception_ptr(gloo::IoException(why));
  for (auto* b = registry_->live; b != nullptr; b = b->next())
    b->fail(registry_->failure);
}

} // namespace corodist::collective::detail
