// SplitMix64: the 64-bit mixer that derives reproducible random values from
// keys (an embedding row's initial values from its table seed and id, a
// generated data set's ids and weights from its seeds), with no state.
#ifndef PSRT_COMMON_SPLITMIX_H_
#define PSRT_COMMON_SPLITMIX_H_

#include <cstdint>

namespace psrt {

// SplitMix64's step and finalizer: a bijection of the 64-bit values that
// spreads every input bit over every output bit.
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A double in (0, 1) from the top 53 bits of h (never 0: safe under log).
inline double UnitInterval(uint64_t h) { return ((h >> 11) + 0.5) * 0x1.0p-53; }

}  // namespace psrt

#endif  // PSRT_COMMON_SPLITMIX_H_
