#include "common/binary_classification.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "glog/logging.h"

namespace psrt {

double RocAuc(absl::Span<const float> scores, absl::Span<const int32_t> labels) {
  CHECK_EQ(scores.size(), labels.size());
  const size_t n = scores.size();
  // A NaN score (a diverged model) ranks lowest, tied with the other NaNs:
  // it orders nothing, and the sort keeps a strict weak order.
  std::vector<float> key(scores.begin(), scores.end());
  for (float& k : key) {
    if (std::isnan(k)) k = -std::numeric_limits<float>::infinity();
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] < key[b]; });
  // Sum of the positives' ranks (1-based, ties sharing their mean rank).
  double positive_ranks = 0;
  int64_t positives = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    while (j < n && key[order[j]] == key[order[i]]) ++j;
    const double mean_rank = (i + 1 + j) / 2.0;  // Ranks i+1 .. j.
    for (size_t k = i; k < j; ++k) {
      if (labels[order[k]] != 0) {
        positive_ranks += mean_rank;
        ++positives;
      }
    }
    i = j;
  }
  const int64_t negatives = static_cast<int64_t>(n) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (positive_ranks - positives * (positives + 1) / 2.0) /
         (static_cast<double>(positives) * negatives);
}

double LogLoss(absl::Span<const float> probabilities, absl::Span<const int32_t> labels) {
  CHECK_EQ(probabilities.size(), labels.size());
  if (labels.empty()) return 0;
  double sum = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const double p = std::clamp<double>(probabilities[i], 1e-7, 1 - 1e-7);
    sum -= labels[i] != 0 ? std::log(p) : std::log1p(-p);
  }
  return sum / labels.size();
}

}  // namespace psrt
