// Sparse pull and push rows/s of one ps shard's embedding table
// (ps/embedding_table.h), beside what this machine's memory gives the same
// access pattern without a table. For each --rows size, a table of that
// many rows (--dim, --optimizer) is filled, then batches of --batch
// distinct ids drawn from it (uniformly, or Zipf-like with --zipf > 0, as
// click logs are) are looked up (a pull) and updated (a push), timed
// apart; the peer is a plain gather of the same rows' bytes from an array
// of the same size by random index (no hash map, no optimizer), and
// memcpy's sequential bandwidth. Prints, medians of --runs runs:
//   table_bench: rows=N dim=D optimizer=O zipf=Z batch=B lookup_rows_per_sec=X
//     apply_rows_per_sec=Y gather_rows_per_sec=G lookup_vs_gather=X/G
//     lookup_gb_per_s=... memcpy_gb_per_s=M
// (one line). scripts/bench_table.sh runs it with the machine's name.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/bench_util.h"
#include "common/training_config.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "ps/embedding_table.h"

DEFINE_string(rows, "1000000,10000000", "Table sizes, comma-separated.");
DEFINE_int32(dim, 16, "Row dimension.");
DEFINE_string(optimizer, "adagrad", "sgd, adagrad or adam: the rule a push applies.");
DEFINE_int32(batch, 4096, "Distinct ids per pull and push (one shard's part of a batch).");
DEFINE_double(zipf, 0, "0: ids drawn uniformly; s > 0: rank r drawn with weight 1/r^s.");
DEFINE_int32(batches, 200, "Batches per run.");
DEFINE_int32(runs, 5, "Runs; medians are printed.");

namespace psrt {
namespace {

double Seconds(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

proto::TrainingConfig Rule() {
  proto::TrainingConfig config;
  config.set_mode(proto::SYNC);
  config.set_num_replicas(1);
  config.set_replicas_to_aggregate(1);
  config.set_learning_rate(0.01f);
  const std::string& name = FLAGS_optimizer;
  config.set_optimizer(name == "sgd" ? proto::SGD : name == "adam" ? proto::ADAM : proto::ADAGRAD);
  SetOptimizerDefaults(&config);
  return config;
}

// Batches of distinct indices into [0, n): uniform, or Zipf-like over a
// random permutation of the ranks (so that hot rows lie anywhere).
std::vector<std::vector<int64_t>> Batches(int64_t n, std::mt19937_64* rng) {
  std::vector<double> cumulative;
  if (FLAGS_zipf > 0) {
    cumulative.resize(n);
    double sum = 0;
    for (int64_t r = 0; r < n; ++r) cumulative[r] = sum += std::pow(r + 1.0, -FLAGS_zipf);
  }
  std::vector<int64_t> rank_to_index(n);
  for (int64_t i = 0; i < n; ++i) rank_to_index[i] = i;
  std::shuffle(rank_to_index.begin(), rank_to_index.end(), *rng);
  std::vector<std::vector<int64_t>> batches(FLAGS_batches);
  for (auto& batch : batches) {
    while (static_cast<int>(batch.size()) < FLAGS_batch) {
      int64_t rank;
      if (FLAGS_zipf > 0) {
        const double u = std::uniform_real_distribution<double>(0, cumulative.back())(*rng);
        rank = std::lower_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin();
      } else {
        rank = static_cast<int64_t>((*rng)() % static_cast<uint64_t>(n));
      }
      batch.push_back(rank_to_index[std::min(rank, n - 1)]);
      if (static_cast<int>(batch.size()) == FLAGS_batch) {
        std::sort(batch.begin(), batch.end());
        batch.erase(std::unique(batch.begin(), batch.end()), batch.end());
      }
    }
    std::shuffle(batch.begin(), batch.end(), *rng);
  }
  return batches;
}

void RunSize(int64_t n) {
  const proto::TrainingConfig rule = Rule();
  auto made = EmbeddingTable::Create("bench", FLAGS_dim, 1, rule);
  bench::Check(made.status());
  EmbeddingTable& table = **made;
  std::mt19937_64 rng(1);
  std::vector<uint64_t> ids(n);
  for (auto& id : ids) id = rng();
  const int dim = FLAGS_dim;
  {  // Fill: every row made, in chunks.
    std::vector<float> out(static_cast<size_t>(FLAGS_batch) * dim);
    for (int64_t i = 0; i < n; i += FLAGS_batch) {
      const int64_t m = std::min<int64_t>(FLAGS_batch, n - i);
      bench::Check(table.Lookup(absl::MakeConstSpan(ids.data() + i, m),
                                absl::MakeSpan(out.data(), m * dim)));
    }
  }
  // The peer's array: the table's payload bytes, rows in the same order.
  const int64_t row_floats = table.payload_bytes_per_row() / sizeof(float);
  std::vector<float> plain(static_cast<size_t>(n) * row_floats, 1.0f);
  const std::vector<std::vector<int64_t>> batches = Batches(n, &rng);
  std::vector<std::vector<uint64_t>> batch_ids;
  for (const auto& batch : batches) {
    batch_ids.emplace_back();
    for (int64_t index : batch) batch_ids.back().push_back(ids[index]);
  }
  std::vector<float> out(static_cast<size_t>(FLAGS_batch) * dim);
  std::vector<float> grads(static_cast<size_t>(FLAGS_batch) * dim, 0.001f);
  std::vector<double> lookup, apply, gather, copy;
  int64_t step = 0;
  for (int run = 0; run < FLAGS_runs; ++run) {
    int64_t rows = 0;
    absl::Time start = absl::Now();
    for (const auto& b : batch_ids) {
      bench::Check(table.Lookup(b, absl::MakeSpan(out.data(), b.size() * dim), true, step));
      rows += static_cast<int64_t>(b.size());
    }
    lookup.push_back(rows / Seconds(start));
    start = absl::Now();
    for (const auto& b : batch_ids) {
      bench::Check(table.Apply(++step, b, absl::MakeConstSpan(grads.data(), b.size() * dim)));
    }
    apply.push_back(rows / Seconds(start));
    start = absl::Now();
    for (const auto& batch : batches) {
      float* to = out.data();
      for (int64_t index : batch) {
        std::memcpy(to, plain.data() + index * row_floats, dim * sizeof(float));
        to += dim;
      }
    }
    gather.push_back(rows / Seconds(start));
    // Sequential bandwidth: the whole array copied once (read + write).
    std::vector<float>& from = plain;
    static std::vector<float> into;
    into.resize(from.size());
    start = absl::Now();
    std::memcpy(into.data(), from.data(), from.size() * sizeof(float));
    copy.push_back(2.0 * from.size() * sizeof(float) / Seconds(start) / 1e9);
  }
  const double x = bench::Median(lookup), g = bench::Median(gather);
  std::printf(
      "table_bench: rows=%lld dim=%d optimizer=%s zipf=%g batch=%d lookup_rows_per_sec=%.0f "
      "apply_rows_per_sec=%.0f gather_rows_per_sec=%.0f lookup_vs_gather=%.2f "
      "lookup_gb_per_s=%.2f memcpy_gb_per_s=%.2f\n",
      static_cast<long long>(n), dim, FLAGS_optimizer.c_str(), FLAGS_zipf, FLAGS_batch, x,
      bench::Median(apply), g, x / g, x * dim * sizeof(float) / 1e9, bench::Median(copy));
  std::fflush(stdout);
}

}  // namespace
}  // namespace psrt

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  for (absl::string_view part : absl::StrSplit(FLAGS_rows, ',', absl::SkipEmpty())) {
    int64_t n = 0;
    CHECK(absl::SimpleAtoi(part, &n) && n > FLAGS_batch) << "--rows: " << part;
    psrt::RunSize(n);
  }
  return 0;
}
