// Tensor: a dense float32 tensor in host memory.
//
// Storage comes from the default aligned heap, or from a HostAllocator given
// at construction (page-locked memory that a GPU copies to and from without
// staging, for the worker's pulled parameters and pushed gradients); Resize
// and moves keep the allocator.
//
// A Tensor owns 64-byte-aligned storage and a shape (row-major, the last
// dimension varies fastest). Resize() keeps the storage when it is large
// enough, so a Tensor reused across training steps never touches fresh pages
// after the first step. On the wire and on disk a tensor is its shape plus
// num_elements() little-endian float32 values, nothing else.
//
// Thread safety: a const Tensor may be read from several threads; mutation
// needs external synchronization.
#ifndef PSRT_COMMON_TENSOR_H_
#define PSRT_COMMON_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace psrt {

using Shape = std::vector<int64_t>;

// Number of elements of a shape (1 for a scalar shape {}).
int64_t NumElements(const Shape& shape);
// The same for a shape from untrusted input: InvalidArgument for a negative
// dimension or a count above kMaxElements (no overflow).
constexpr int64_t kMaxElements = int64_t{1} << 40;
absl::StatusOr<int64_t> CheckedNumElements(const Shape& shape);
// "[2,3]" for {2, 3}.
std::string ShapeToString(const Shape& shape);

// A named variable shape, e.g. {"hidden1/weights", {784, 512}}.
struct VariableDef {
  std::string name;
  Shape shape;
};

// Whether a variable (or a slice of one: "<name>/part_<k>") is a batch norm's
// moving statistic: its name ends in "/moving_mean" or "/moving_variance".
// The model updates such a variable itself, not by a gradient: what a step
// pushes for it is its new value (momentum * pulled + (1 - momentum) *
// the batch's), which replaces it: averaged over the replicas in sync mode
// (who all pulled the same version), as it comes in async mode (a convex
// step from a stale value never leaves the range of the statistics seen).
// No optimizer, learning rate, weight decay or clipping; its moving
// average is its value. Held on the ps and checkpointed like every
// variable, so that an evaluation, a restore and an export (Keras's
// moving_mean and moving_variance) see them.
bool IsMovingStatistic(absl::string_view variable_name);

// HostAllocator: where a Tensor's storage comes from when it is not the
// default heap. Allocate returns at least `bytes` bytes, 64-byte aligned
// (null when out of memory). REQUIRES: it outlives every tensor that uses it.
// Thread-safe.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
};

namespace internal {
// Frees a Tensor's storage where it came from.
struct TensorDeleter {
  HostAllocator* allocator = nullptr;
  void operator()(float* p) const;
};
}  // namespace internal

class Tensor {
 public:
  Tensor() = default;
  // A zero-filled tensor of the given shape; storage from `allocator`
  // (null: the default heap).
  explicit Tensor(Shape shape, HostAllocator* allocator = nullptr);

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  // Deep copy, explicitly, so that copies on hot paths are visible.
  Tensor Clone() const;

  // Changes the shape. Reuses the storage when it holds enough elements;
  // contents are unspecified afterwards.
  void Resize(Shape shape);
  void SetZero();

  HostAllocator* allocator() const { return data_.get_deleter().allocator; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t num_elements() const { return num_elements_; }
  size_t num_bytes() const { return num_elements_ * sizeof(float); }

  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  absl::Span<float> flat() { return {data_.get(), size_t(num_elements_)}; }
  absl::Span<const float> flat() const {
    return {data_.get(), size_t(num_elements_)};
  }

 private:
  Shape shape_;
  int64_t num_elements_ = 0;
  int64_t capacity_ = 0;
  std::unique_ptr<float[], internal::TensorDeleter> data_;
};

}  // namespace psrt

#endif  // PSRT_COMMON_TENSOR_H_
