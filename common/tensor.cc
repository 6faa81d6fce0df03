#include "common/tensor.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "glog/logging.h"

namespace psrt {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<int64_t> CheckedNumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > kMaxElements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", ShapeToString(shape), " has a negative dimension or more than ",
          kMaxElements, " elements"));
    }
  }
  return n;
}

std::string ShapeToString(const Shape& shape) {
  return "[" + absl::StrJoin(shape, ",") + "]";
}

bool IsMovingStatistic(absl::string_view variable_name) {
  absl::string_view name = variable_name;
  // A slice: "<name>/part_<digits>".
  if (const size_t part = name.rfind("/part_"); part != absl::string_view::npos &&
                                                part + 6 < name.size() &&
                                                absl::c_all_of(name.substr(part + 6), absl::ascii_isdigit)) {
    name = name.substr(0, part);
  }
  return absl::EndsWith(name, "/moving_mean") || absl::EndsWith(name, "/moving_variance");
}

void internal::TensorDeleter::operator()(float* p) const {
  if (allocator != nullptr) {
    allocator->Free(p);
  } else {
    std::free(p);
  }
}

Tensor::Tensor(Shape shape, HostAllocator* allocator)
    : data_(nullptr, internal::TensorDeleter{allocator}) {
  Resize(std::move(shape));
  SetZero();
}

Tensor Tensor::Clone() const {
  Tensor copy;
  copy.Resize(shape_);
  if (num_elements_ > 0) std::memcpy(copy.data(), data(), num_bytes());
  return copy;
}

void Tensor::Resize(Shape shape) {
  for (int64_t d : shape) CHECK_GE(d, 0) << "negative dimension";
  const int64_t n = NumElements(shape);
  shape_ = std::move(shape);
  num_elements_ = n;
  if (n <= capacity_) return;
  constexpr size_t kAlignment = 64;
  size_t bytes = (n * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment;
  HostAllocator* allocator = data_.get_deleter().allocator;
  data_.reset();  // Frees the old storage before the new is taken.
  void* p = allocator != nullptr ? allocator->Allocate(bytes)
                                 : std::aligned_alloc(kAlignment, bytes);
  CHECK(p != nullptr) << "out of memory allocating " << bytes << " bytes";
  data_.reset(static_cast<float*>(p));
  capacity_ = n;
}

void Tensor::SetZero() {
  if (num_elements_ > 0) std::memset(data(), 0, num_bytes());
}

}  // namespace psrt
