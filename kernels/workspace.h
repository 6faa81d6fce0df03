// Workspace: scratch memory that CPU ops borrow for one call and that the
// caller keeps across calls (im2col buffers, per-thread partial sums), so
// that a training step allocates nothing once the first step has sized it.
//
// A workspace holds numbered slots; Get(slot, size) returns a 64-byte
// aligned buffer of at least `size` floats, growing the slot (the only
// allocation) when it is smaller. Contents are unspecified on return and a
// buffer stays valid until the next Get of the same slot. An op documents
// that it uses a workspace; one workspace may be shared by ops that run one
// after another, never by ops that run at the same time.
//
// Thread safety: not thread-safe. Ops call Get on the calling thread, before
// they hand the buffers to their worker threads.
#ifndef PSRT_KERNELS_WORKSPACE_H_
#define PSRT_KERNELS_WORKSPACE_H_

#include <cstdint>
#include <memory>
#include <vector>

namespace psrt {
namespace kernels {

class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // REQUIRES: slot >= 0, size >= 0.
  float* Get(int slot, int64_t size);

  // Floats held over all slots (for tests and memory reports).
  int64_t capacity() const;

 private:
  struct AlignedFree {
    void operator()(float* p) const;
  };
  struct Slot {
    std::unique_ptr<float[], AlignedFree> data;
    int64_t capacity = 0;
  };
  std::vector<Slot> slots_;
};

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_WORKSPACE_H_
