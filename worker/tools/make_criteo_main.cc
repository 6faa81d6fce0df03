// psrt_make_criteo: writes Criteo-format click logs drawn from a planted
// model (worker/input/synthetic_criteo.h) for the CTR examples, tests and
// benchmarks, and prints the best AUC a model can reach on them.
//
//   psrt_make_criteo --out=/tmp/ctr/train.gz --rows=500000 --seed=1
//   psrt_make_criteo --out=/tmp/ctr/test.gz --rows=50000 --seed=2
//   -> criteo: rows=500000 positives=... planted_auc=0.7... planted_logloss=0.4...
//
// The same --model_seed (default 1) and other --seed values make a test set
// of the same model.
#include <cstdio>
#include <string>

#include "gflags/gflags.h"
#include "worker/input/synthetic_criteo.h"

DEFINE_string(out, "", "Output file (gzip when it ends in .gz).");
DEFINE_int64(rows, 10000, "Lines to write.");
DEFINE_uint64(model_seed, 1, "Seed of the planted model (vocabularies and weights).");
DEFINE_uint64(seed, 1, "Seed of the rows.");
DEFINE_int64(max_vocabulary, 100000, "Ids of the largest categorical field.");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("writes Criteo-format click logs: psrt_make_criteo --out=FILE");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_out.empty()) {
    std::fprintf(stderr, "psrt_make_criteo: needs --out\n");
    return 2;
  }
  psrt::SyntheticCriteoOptions options;
  options.rows = FLAGS_rows;
  options.model_seed = FLAGS_model_seed;
  options.seed = FLAGS_seed;
  options.max_vocabulary = FLAGS_max_vocabulary;
  absl::StatusOr<psrt::SyntheticCriteoSummary> summary =
      psrt::WriteSyntheticCriteo(FLAGS_out, options);
  if (!summary.ok()) {
    std::fprintf(stderr, "psrt_make_criteo: %s\n", std::string(summary.status().message()).c_str());
    return 1;
  }
  std::printf("criteo: file=%s rows=%lld positives=%lld planted_auc=%.4f planted_logloss=%.4f\n",
              FLAGS_out.c_str(), static_cast<long long>(summary->rows),
              static_cast<long long>(summary->positives), summary->planted_auc,
              summary->planted_logloss);
  return 0;
}
