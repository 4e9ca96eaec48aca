#pragma once
/// \file
/// corodist::collective::device_mesh: a group's ranks laid out in a shape
/// with named dimensions, with this rank's group along each (the groups of
/// 2-D parallel and hybrid-sharded jobs; PyTorch's DeviceMesh).

#include <corodist/core/config.hpp>

#include <corodist/collective/process_group.hpp>

#include <asio/awaitable.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace corodist::collective {

/// One named dimension of a mesh (`{"dp", 4}`).
struct mesh_dim {
  std::string name;
  int size = 1;
};

/// The ranks of a parent group laid out row-major in a shape (the last
/// dimension varies fastest: in `{{"dp", 4}, {"tp", 2}}` parent ranks 0 and 1
/// share a tp group), with this rank's group along every dimension. Built on
/// `process_group::split` only, so any backend that splits makes one.
/// A value type (copies share the groups); const members are thread-safe.
class device_mesh {
public:
  /// An empty mesh (no dimensions, no parent), to assign a created one to.
  device_mesh() = default;

  /// Lays `parent`'s ranks out in `shape` and makes this rank's group along
  /// every dimension, in `shape`'s order: one `split` per dimension, whose
  /// color is the linear index of the other coordinates and whose key is the
  /// parent rank, so that a rank's rank in its group along a dimension is
  /// its coordinate there. Every rank of `parent` calls it with the same
  /// shape, in the same order relative to the parent's collectives.
  /// `opts.timeout` applies to each split; a non-empty `opts.name` names the
  /// splits "<name>/<dimension>" (else the parent counts them).
  /// Throws `usage_error` for a null parent, an empty shape, a dimension
  /// without a name, named twice or of size < 1, or sizes whose product is
  /// not the parent's size (before any communication); otherwise as `split`.
  /// (Name the shape first: GCC 12 destroys a braced temporary inside
  /// `co_await` twice.)
  /// Cancellation: as `split`; the groups made so far are dropped.
  [[nodiscard]] static asio::awaitable<device_mesh> create(std::shared_ptr<process_group> parent,
                                                           std::vector<mesh_dim> shape, split_options opts);

  /// As above with default options (an overload: see new_group).
  [[nodiscard]] static asio::awaitable<device_mesh> create(std::shared_ptr<process_group> parent,
                                                           std::vector<mesh_dim> shape);

  /// The dimensions, in order.
  const std::vector<mesh_dim>& dims() const noexcept { return dims_; }
  /// The number of ranks in the shape (the product of the sizes).
  int total_size() const noexcept;
  /// The number of dimensions.
  int ndim() const noexcept { return static_cast<int>(dims_.size()); }
  /// The group the mesh lays out (of a mesh made by with_outer_dimension:
  /// the inner mesh's).
  const std::shared_ptr<process_group>& parent() const noexcept { return parent_; }

  /// This rank's group along dimension `name` (its rank there is
  /// `coordinate(name)`, its size `size(name)`). Throws `usage_error` for an
  /// unknown name.
  const std::shared_ptr<process_group>& group(std::string_view name) const;
  /// This rank's coordinate along `name`. Throws `usage_error` for an unknown name.
  int coordinate(std::string_view name) const;
  /// The size of dimension `name`. Throws `usage_error` for an unknown name.
  int size(std::string_view name) const;
  /// This mesh with a new outermost dimension `name` along which this rank's
  /// group is `group` (its size the dimension's, its rank this rank's
  /// coordinate): each copy of this mesh (a replica) is one slice of the
  /// new dimension. The data-parallel dimension that ft::manager re-forms
  /// after a loss (its group() over the replicas) while the inner dimensions
  /// stay (docs/collective.md, "Subgroups and meshes"). The result's
  /// rank_of and coordinates_of are indices in its shape, not ranks of
  /// parent(). Throws `usage_error` for a null group or a name that is empty
  /// or already a dimension.
  device_mesh with_outer_dimension(std::string name, std::shared_ptr<process_group> group) const;

  /// This rank's coordinates, one per dimension in order.
  const std::vector<int>& coordinates() const noexcept { return coords_; }
  /// The parent rank at `coords` (one per dimension, in order): the
  /// row-major index in the shape. Throws `usage_error` for a wrong count
  /// or a coordinate out of range.
  int rank_of(const std::vector<int>& coords) const;
  /// The coordinates of parent rank (row-major index) `rank`. Throws
  /// `usage_error` out of range.
  std::vector<int> coordinates_of(int rank) const;
  /// The index of dimension `name`. Throws `usage_error` for an unknown name.
  int index(std::string_view name) const;

private:

  std::shared_ptr<process_group> parent_;
  std::vector<mesh_dim> dims_;
  std::vector<int> coords_;
  std::vector<std::shared_ptr<process_group>> groups_;
};

} // namespace corodist::collective
