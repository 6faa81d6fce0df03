// Random initial values that depend on the seed alone: the uniform and
// normal samples are written out rather than taken from the standard
// library's distributions, whose output differs between implementations.
// Internal to models/.
#ifndef PSRT_MODELS_INITIALIZERS_H_
#define PSRT_MODELS_INITIALIZERS_H_

#include <cmath>
#include <random>

namespace psrt {
namespace init {

// A uniform sample in (0, 1).
inline double Uniform01(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
}

// A standard normal sample (Box-Muller).
inline double StandardNormal(std::mt19937_64& rng) {
  constexpr double kTwoPi = 6.283185307179586;
  const double u1 = Uniform01(rng);
  const double u2 = Uniform01(rng);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

// Like tf.truncated_normal: samples beyond two standard deviations are drawn
// again (so the result's standard deviation is about 0.88 * stddev).
// The standard deviation of a normal cut at 2 sigma, in units of sigma.
constexpr double kTruncatedNormalStddev = 0.87962566103423978;

inline float TruncatedNormal(std::mt19937_64& rng, double stddev) {
  double z;
  do {
    z = StandardNormal(rng);
  } while (std::abs(z) > 2.0);
  return static_cast<float>(z * stddev);
}

}  // namespace init
}  // namespace psrt

#endif  // PSRT_MODELS_INITIALIZERS_H_
