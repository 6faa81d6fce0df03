// The measures CTR models are read by: the area under the ROC curve and the
// mean log loss of predicted click probabilities against 0/1 labels.
#ifndef PSRT_COMMON_BINARY_CLASSIFICATION_H_
#define PSRT_COMMON_BINARY_CLASSIFICATION_H_

#include <cstdint>

#include "absl/types/span.h"

namespace psrt {

// The probability that a random positive scores above a random negative
// (ties count half), by ranks: O(n log n). 0.5 when either class is absent.
// A NaN score ranks below every other (a diverged model scores badly).
// REQUIRES: scores.size() == labels.size(); labels 0 or 1.
double RocAuc(absl::Span<const float> scores, absl::Span<const int32_t> labels);

// The mean of -log(p) over positives and -log(1 - p) over negatives, with p
// clamped to [1e-7, 1 - 1e-7]; 0 for no examples.
double LogLoss(absl::Span<const float> probabilities, absl::Span<const int32_t> labels);

}  // namespace psrt

#endif  // PSRT_COMMON_BINARY_CLASSIFICATION_H_
