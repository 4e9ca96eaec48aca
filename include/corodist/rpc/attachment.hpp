#pragma once
/// \file
/// corodist::rpc::attachment: a byte buffer that travels with an RPC call or
/// reply as a zero-copy attachment (never copied into the msgpack body).

#include <corodist/core/config.hpp>

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace corodist::rpc {

/// Shared, immutable bytes. As an argument or result (or a member of one) it
/// is written to the socket in place, after the msgpack body; on the receiving
/// side it is a view into the received message, which it keeps alive.
/// Copying an attachment copies the reference, not the bytes.
class attachment {
public:
  /// Empty.
  attachment() = default;

  /// Views `data`, kept alive by `owner`.
  attachment(std::shared_ptr<const void> owner, std::span<const std::byte> data)
      : owner_(std::move(owner)), data_(data) {}

  /// Takes ownership of `bytes`.
  explicit attachment(std::vector<std::byte> bytes) {
    auto p = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
    data_ = std::span<const std::byte>(p->data(), p->size());
    owner_ = std::move(p);
  }

  /// Copies `text` into a new attachment.
  static attachment copy_of(std::string_view text) {
    const auto* p = reinterpret_cast<const std::byte*>(text.data());
    return attachment(std::vector<std::byte>(p, p + text.size()));
  }

  /// The bytes.
  std::span<const std::byte> bytes() const noexcept { return data_; }
  const std::byte* data() const noexcept { return data_.data(); }
  std::size_t size() const noexcept { return data_.size(); }
  bool empty() const noexcept { return data_.empty(); }
  /// The bytes as text (a view).
  std::string_view str() const noexcept { return {reinterpret_cast<const char*>(data_.data()), data_.size()}; }
  /// What keeps the bytes alive.
  const std::shared_ptr<const void>& owner() const noexcept { return owner_; }

private:
  std::shared_ptr<const void> owner_;
  std::span<const std::byte> data_;
};

} // namespace corodist::rpc
