#include "worker/input/synthetic_criteo.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/binary_classification.h"
#include "common/splitmix.h"
#include "worker/input/criteo_reader.h"

namespace psrt {
namespace {

constexpr double kZipfExponent = 1.2;
constexpr double kMissingCategory = 0.05;
constexpr double kMissingCount = 0.1;
constexpr double kCategoryWeight = 0.3;  // Standard deviation of an id's weight.
constexpr double kCountWeight = 0.3;
constexpr double kBias = -1.3;           // About a quarter of the lines click.

uint64_t Hash(uint64_t a, uint64_t b, uint64_t c) {
  return SplitMix64(SplitMix64(SplitMix64(a) ^ b) ^ c);
}
double Uniform(uint64_t h) { return UnitInterval(h); }
double Gaussian(uint64_t h) {
  return std::sqrt(-2 * std::log(Uniform(h))) * std::cos(2 * M_PI * Uniform(SplitMix64(h)));
}

// The rows' random stream.
class Stream {
 public:
  explicit Stream(uint64_t seed) : state_(SplitMix64(seed)) {}
  double Next() { return Uniform(state_ = SplitMix64(state_)); }

 private:
  uint64_t state_;
};

}  // namespace

absl::StatusOr<SyntheticCriteoSummary> WriteSyntheticCriteo(
    const std::string& path, const SyntheticCriteoOptions& options) {
  if (options.rows < 1 || options.max_vocabulary < 10) {
    return absl::InvalidArgumentError("synthetic Criteo data needs rows >= 1 and "
                                      "max_vocabulary >= 10");
  }
  const uint64_t model = options.model_seed;
  // Per field: the Zipf CDF over its vocabulary (ranks 1..V), and each
  // id's weight, centred on the field's mean (weighted by how often each id
  // comes), so that the click rate is the bias's whatever the draw.
  std::vector<std::vector<double>> cdf(kCriteoCategoricalFields);
  std::vector<std::vector<double>> weight(kCriteoCategoricalFields);
  for (int f = 0; f < kCriteoCategoricalFields; ++f) {
    const double fraction = f / double(kCriteoCategoricalFields - 1);
    const int64_t vocabulary = std::max<int64_t>(
        10, std::llround(10 * std::pow(options.max_vocabulary / 10.0, fraction)));
    cdf[f].resize(vocabulary);
    weight[f].resize(vocabulary);
    double sum = 0, weighted = 0;
    for (int64_t r = 0; r < vocabulary; ++r) {
      const double p = std::pow(r + 1.0, -kZipfExponent);
      weight[f][r] = kCategoryWeight * Gaussian(SplitMix64(Hash(model, f, r)));
      cdf[f][r] = sum += p;
      weighted += p * weight[f][r];
    }
    for (int64_t r = 0; r < vocabulary; ++r) {
      cdf[f][r] /= sum;
      weight[f][r] -= weighted / sum;
    }
  }
  double count_mean[kCriteoDenseFields], count_weight[kCriteoDenseFields];
  for (int j = 0; j < kCriteoDenseFields; ++j) {
    count_mean[j] = 1 + 3 * Uniform(Hash(model, 100, j));
    count_weight[j] = kCountWeight * Gaussian(Hash(model, 200, j));
  }

  const bool gzip = absl::EndsWith(path, ".gz");
  gzFile out = gzopen(path.c_str(), gzip ? "wb6" : "wbT");
  if (out == nullptr) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  Stream rng(Hash(model, options.seed, 300));
  std::vector<float> probabilities(options.rows);
  std::vector<int32_t> labels(options.rows);
  std::string line;
  for (int64_t i = 0; i < options.rows; ++i) {
    double logit = kBias;
    std::string fields;
    for (int j = 0; j < kCriteoDenseFields; ++j) {
      fields += '\t';
      if (rng.Next() < kMissingCount) continue;
      // Log-normal counts around e^mean, as Criteo's heavy-tailed ones.
      const double g = std::sqrt(-2 * std::log(rng.Next())) * std::cos(2 * M_PI * rng.Next());
      const int64_t count = std::max<int64_t>(0, std::llround(std::exp(count_mean[j] + g) - 1));
      absl::StrAppend(&fields, count);
      logit += count_weight[j] * (std::log1p(double(count)) - count_mean[j]);
    }
    for (int f = 0; f < kCriteoCategoricalFields; ++f) {
      fields += '\t';
      if (rng.Next() < kMissingCategory) continue;
      const int64_t rank =
          std::lower_bound(cdf[f].begin(), cdf[f].end(), rng.Next()) - cdf[f].begin();
      absl::StrAppendFormat(&fields, "%08x", static_cast<uint32_t>(Hash(model, f, rank)));
      logit += weight[f][rank];
    }
    const double p = 1 / (1 + std::exp(-logit));
    labels[i] = rng.Next() < p ? 1 : 0;
    probabilities[i] = static_cast<float>(p);
    line = absl::StrCat(labels[i], fields, "\n");
    if (gzwrite(out, line.data(), static_cast<unsigned>(line.size())) !=
        static_cast<int>(line.size())) {
      int errnum = 0;
      const std::string why = gzerror(out, &errnum);
      gzclose(out);
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", why));
    }
  }
  if (gzclose(out) != Z_OK) return absl::InternalError(absl::StrCat("cannot close ", path));
  SyntheticCriteoSummary summary;
  summary.rows = options.rows;
  summary.positives = std::count(labels.begin(), labels.end(), 1);
  summary.planted_auc = RocAuc(probabilities, labels);
  summary.planted_logloss = LogLoss(probabilities, labels);
  return summary;
}

}  // namespace psrt
