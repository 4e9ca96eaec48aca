// device_mesh: a parent group's ranks in a named row-major shape, one split
// per dimension.
#include <corodist/collective/device_mesh.hpp>

#include <corodist/core/error.hpp>

#include <fmt/format.h>

namespace corodist::collective {

namespace {

std::string shape_text(const std::vector<mesh_dim>& shape) {
  std::string s;
  for (const auto& d : shape)
    s += fmt::format("{}{}={}", s.empty() ? "" : ", ", d.name, d.size);
  return "{" + s + "}";
}

} // namespace

asio::awaitable<device_mesh> device_mesh::create(std::shared_ptr<process_group> parent, std::vector<mesh_dim> shape,
                                                 split_options opts) {
  if (!parent)
    throw usage_error("device_mesh::create: the parent group is null");
  if (shape.empty())
    throw usage_error("device_mesh::create: the shape has no dimensions");
  long long product = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i].name.empty())
      throw usage_error(fmt::format("device_mesh::create: dimension {} of {} has no name", i, shape_text(shape)));
    if (shape[i].size < 1)
      throw usage_error(fmt::format("device_mesh::create: dimension '{}' of {} has size {} (must be >= 1)",
                                    shape[i].name, shape_text(shape), shape[i].size));
    for (std::size_t j = 0; j < i; ++j)
      if (shape[j].name == shape[i].name)
        throw usage_error(fmt::format("device_mesh::create: dimension '{}' is named twice in {}", shape[i].name,
                                      shape_text(shape)));
    product *= shape[i].size;
    if (product > parent->size())
      break;
  }
  if (product != parent->size())
    throw usage_error(fmt::format("device_mesh::create: the shape {} does not hold the parent's {} ranks",
                                  shape_text(shape), parent->size()));
  device_mesh m;
  m.parent_ = parent;
  m.dims_ = std::move(shape);
  m.coords_ = m.coordinates_of(parent->rank());
  for (std::size_t d = 0; d < m.dims_.size(); ++d) {
    // The color: the other coordinates' linear index (row-major, without d).
    int color = 0;
    for (std::size_t e = 0; e < m.dims_.size(); ++e)
      if (e != d)
        color = color * m.dims_[e].size + m.coords_[e];
    split_options o = opts;
    if (!opts.name.empty())
      o.name = opts.name + "/" + m.dims_[d].name;
    auto g = co_await parent->split(color, parent->rank(), std::move(o));
    m.groups_.push_back(std::move(g));
  }
  co_return m;
}

asio::awaitable<device_mesh> device_mesh::create(std::shared_ptr<process_group> parent, std::vector<mesh_dim> shape) {
  return create(std::move(parent), std::move(shape), split_options{});
}

int device_mesh::index(std::string_view name) const {
  for (std::size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == name)
      return static_cast<int>(i);
  throw usage_error(fmt::format("device_mesh: no dimension '{}' in {}", name, shape_text(dims_)));
}

const std::shared_ptr<process_group>& device_mesh::group(std::string_view name) const {
  return groups_[static_cast<std::size_t>(index(name))];
}

int device_mesh::coordinate(std::string_view name) const { return coords_[static_cast<std::size_t>(index(name))]; }

int device_mesh::size(std::string_view name) const { return dims_[static_cast<std::size_t>(index(name))].size; }

int device_mesh::rank_of(const std::vector<int>& coords) const {
  if (coords.size() != dims_.size())
    throw usage_error(fmt::format("device_mesh::rank_of: {} coordinates given for the {} dimensions of {}",
                                  coords.size(), dims_.size(), shape_text(dims_)));
  int r = 0;
  for (std::size_t i = 0; i < dims_.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= dims_[i].size)
      throw usage_error(fmt::format("device_mesh::rank_of: coordinate {} along '{}' is out of range (size {})",
                                    coords[i], dims_[i].name, dims_[i].size));
    r = r * dims_[i].size + coords[i];
  }
  return r;
}

int device_mesh::total_size() const noexcept {
  int n = dims_.empty() ? 0 : 1;
  for (const auto& d : dims_)
    n *= d.size;
  return n;
}

device_mesh device_mesh::with_outer_dimension(std::string name, std::shared_ptr<process_group> group) const {
  if (!group)
    throw usage_error("device_mesh::with_outer_dimension: the group is null");
  if (name.empty())
    throw usage_error("device_mesh::with_outer_dimension: the dimension has no name");
  for (const auto& d : dims_)
    if (d.name == name)
      throw usage_error(fmt::format("device_mesh::with_outer_dimension: '{}' is already a dimension of {}", name,
                                    shape_text(dims_)));
  device_mesh m = *this;
  m.dims_.insert(m.dims_.begin(), mesh_dim{std::move(name), group->size()});
  m.coords_.insert(m.coords_.begin(), group->rank());
  m.groups_.insert(m.groups_.begin(), std::move(group));
  return m;
}

std::vector<int> device_mesh::coordinates_of(int rank) const {
  if (rank < 0 || rank >= total_size())
    throw usage_error(fmt::format("device_mesh::coordinates_of: rank {} is out of range", rank));
  std::vector<int> c(dims_.size());
  for (std::size_t i = dims_.size(); i-- > 0;) {
    c[i] = rank % dims_[i].size;
    rank /= dims_[i].size;
  }
  return c;
}

} // namespace corodist::collective
