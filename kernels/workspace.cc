#include "kernels/workspace.h"

#include <algorithm>
#include <cstdlib>

#include "glog/logging.h"

namespace psrt {
namespace kernels {

void Workspace::AlignedFree::operator()(float* p) const { std::free(p); }

float* Workspace::Get(int slot, int64_t size) {
  CHECK_GE(slot, 0);
  CHECK_GE(size, 0);
  if (slot >= static_cast<int>(slots_.size())) slots_.resize(slot + 1);
  Slot& s = slots_[slot];
  if (s.capacity < size || s.data == nullptr) {
    // Round up to whole 64-byte lines, as aligned_alloc requires.
    const int64_t n = (std::max<int64_t>(size, 1) + 15) / 16 * 16;
    s.data.reset(
        static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))));
    CHECK(s.data != nullptr) << "out of memory for " << n << " floats";
    s.capacity = n;
  }
  return s.data.get();
}

int64_t Workspace::capacity() const {
  int64_t total = 0;
  for (const Slot& s : slots_) total += s.capacity;
  return total;
}

}  // namespace kernels
}  // namespace psrt
