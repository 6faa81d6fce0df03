#include "common/random_id.h"

#include <random>

#include "absl/strings/str_format.h"

namespace psrt {
namespace {

uint64_t Random64() {
  std::random_device device;
  std::mt19937_64 rng((uint64_t{device()} << 32) ^ device());
  return rng();
}

}  // namespace

int64_t NewIncarnation() { return static_cast<int64_t>(Random64() >> 1) | 1; }

std::string NewRandomHexId() { return absl::StrFormat("%016x", Random64()); }

}  // namespace psrt
