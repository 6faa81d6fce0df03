// Criteo-format click logs drawn from a planted model, for the CTR tests,
// examples and benchmarks (any size; the real logs are 11 GB and more).
//
// The model: each of the 26 categorical fields has a vocabulary (sizes from
// 10 up to max_vocabulary, growing field by field) drawn with a power law
// (Zipf, exponent 1.2: a few ids carry most examples, as in Criteo's logs);
// each id has a fixed weight; 13 counts have weights on log(1 + count);
// a value is missing with a fixed rate per kind. A line's click
// probability is sigmoid(bias + the weights of its values), and its label
// is drawn from it, so the best AUC any model can reach on the rows written
// is the AUC of those probabilities: WriteSyntheticCriteo returns it.
// Everything is a function of model_seed (the vocabularies, hex values
// and weights) and seed (the rows), so train and test files from one
// model_seed and two seeds share a model.
#ifndef PSRT_WORKER_INPUT_SYNTHETIC_CRITEO_H_
#define PSRT_WORKER_INPUT_SYNTHETIC_CRITEO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace psrt {

struct SyntheticCriteoOptions {
  int64_t rows = 10000;
  uint64_t model_seed = 1;
  uint64_t seed = 1;
  int64_t max_vocabulary = 100000;  // The largest field's id count.
};

struct SyntheticCriteoSummary {
  int64_t rows = 0;
  int64_t positives = 0;
  double planted_auc = 0;      // AUC of the true click probabilities.
  double planted_logloss = 0;  // Their log loss: the best expected.
};

// Writes the rows to `path` (gzip when it ends in ".gz"), replacing it.
// InvalidArgument for rows < 1 or max_vocabulary < 10; the file system's
// error, naming the path, where it cannot be written.
absl::StatusOr<SyntheticCriteoSummary> WriteSyntheticCriteo(
    const std::string& path, const SyntheticCriteoOptions& options);

}  // namespace psrt

#endif  // PSRT_WORKER_INPUT_SYNTHETIC_CRITEO_H_
