// EmbeddingTable: rows made on first touch from (seed, id) alone, updates
// that touch only the rows they name and equal the dense optimizer's on
// them (Adagrad, lazy Adam, SGD), refusals that change nothing, memory close
// to the payload, and TableShardOf spreading field-keyed ids evenly.
#include "ps/embedding_table.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "common/training_config.h"
#include "ps/optimizer.h"

namespace psrt {
namespace {

proto::TrainingConfig Config(proto::OptimizerType type) {
  proto::TrainingConfig config;
  config.set_mode(proto::ASYNC);
  config.set_num_replicas(1);
  config.set_optimizer(type);
  config.set_learning_rate(0.1f);
  SetOptimizerDefaults(&config);  // TensorFlow's: Adagrad's 0.1, Adam's betas, momentum 0.9.
  return config;
}

std::unique_ptr<EmbeddingTable> Table(proto::OptimizerType type, int dim = 4, uint64_t seed = 7) {
  auto table = EmbeddingTable::Create("t", dim, seed, Config(type));
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? *std::move(table) : nullptr;
}

std::vector<float> Rows(EmbeddingTable& table, const std::vector<uint64_t>& ids) {
  std::vector<float> out(ids.size() * table.dim());
  EXPECT_TRUE(table.Lookup(ids, absl::MakeSpan(out)).ok());
  return out;
}

TEST(EmbeddingTableTest, RowsAreMadeOnFirstTouchFromTheSeedAndIdAlone) {
  auto a = Table(proto::SGD, 16), b = Table(proto::SGD, 16), other = Table(proto::SGD, 16, 8);
  // Other ids, other orders: a row is the same whenever it is made.
  const std::vector<float> from_a = Rows(*a, {5, 1ull << 40, 99});
  Rows(*b, {3, 99});
  const std::vector<float> from_b = Rows(*b, {5, 1ull << 40, 99});
  EXPECT_EQ(from_a, from_b);
  EXPECT_NE(Rows(*other, {5}), std::vector<float>(from_a.begin(), from_a.begin() + 16));
  EXPECT_EQ(a->rows(), 3);
  EXPECT_EQ(b->rows(), 4);
  // A normal of stddev 1/4 truncated at 2 stddevs.
  std::vector<uint64_t> ids(2000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i * 7919;
  const std::vector<float> values = Rows(*a, ids);
  double sum = 0, squares = 0;
  for (float v : values) {
    EXPECT_LE(std::abs(v), 0.5f);
    sum += v;
    squares += double{v} * v;
  }
  const double mean = sum / values.size();
  EXPECT_NEAR(mean, 0, 0.01);
  // A normal truncated at 2 sigma has 0.88 of the untruncated stddev.
  EXPECT_NEAR(std::sqrt(squares / values.size() - mean * mean), 0.25 * 0.88, 0.01);
  EXPECT_FALSE(a->Lookup({1, 2}, absl::Span<float>(nullptr, 0)).ok());
}

// The table's rows against the dense optimizer run on a flat copy of them,
// over three steps in which the first row is touched twice and the second
// once: untouched rows (and their slots) stay as they were.
void ExpectLikeTheDenseRule(proto::OptimizerType type) {
  SCOPED_TRACE(proto::OptimizerType_Name(type));
  const int dim = 3;
  auto table = Table(type, dim);
  ASSERT_NE(table, nullptr);
  const std::vector<uint64_t> ids = {11, 22};
  std::vector<float> row0 = Rows(*table, {11}), row1 = Rows(*table, {22});
  auto dense0 = NewOptimizer(Config(type), dim), dense1 = NewOptimizer(Config(type), dim);
  ASSERT_TRUE(dense0.ok() && dense1.ok());
  const std::vector<float> g0 = {0.5f, -1.0f, 2.0f}, g1 = {-0.25f, 0.75f, 0.1f};
  // Step 0: both rows; step 1: row 0; step 2: both.
  for (int64_t step = 0; step < 3; ++step) {
    std::vector<uint64_t> touched = {11};
    std::vector<float> grads = g0;
    (*dense0)->BeginStep(step);
    (*dense0)->Apply(0, g0, absl::MakeSpan(row0));
    if (step != 1) {
      touched.push_back(22);
      grads.insert(grads.end(), g1.begin(), g1.end());
      (*dense1)->BeginStep(step);
      (*dense1)->Apply(0, g1, absl::MakeSpan(row1));
    }
    ASSERT_TRUE(table->Apply(step, touched, grads).ok());
  }
  EXPECT_EQ(Rows(*table, {11}), row0);
  EXPECT_EQ(Rows(*table, {22}), row1);
  // The slots too, as ForEachRow shows them.
  std::map<uint64_t, std::vector<float>> saved;
  table->ForEachRow([&](uint64_t id, absl::Span<const float> row) {
    saved[id].assign(row.begin(), row.end());
  });
  ASSERT_EQ(saved.size(), 2u);
  for (int s = 0; s < (*dense0)->num_slots(); ++s) {
    for (int j = 0; j < dim; ++j) {
      EXPECT_EQ(saved[11][(1 + s) * dim + j], (*dense0)->slots()[s].second->data()[j]);
      EXPECT_EQ(saved[22][(1 + s) * dim + j], (*dense1)->slots()[s].second->data()[j]);
    }
  }
  EXPECT_EQ(table->payload_bytes_per_row(),
            static_cast<int64_t>((1 + (*dense0)->num_slots()) * dim * sizeof(float)));
}

TEST(EmbeddingTableTest, UpdatesTouchedRowsAsTheDenseRuleDoes) {
  ExpectLikeTheDenseRule(proto::SGD);
  ExpectLikeTheDenseRule(proto::ADAGRAD);
  ExpectLikeTheDenseRule(proto::ADAM);  // Lazy Adam: the global step's bias correction.
  ExpectLikeTheDenseRule(proto::MOMENTUM);
  ExpectLikeTheDenseRule(proto::FTRL);
}

TEST(EmbeddingTableTest, ARefusedUpdateChangesNothing) {
  auto table = Table(proto::ADAGRAD, 2);
  ASSERT_NE(table, nullptr);
  const std::vector<float> before = Rows(*table, {1, 2});
  EXPECT_EQ(table->Apply(0, {1}, {1, 1, 1}).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status overflow = table->Apply(0, {1, 2}, {1, 1, 1e30f, 1});
  EXPECT_EQ(overflow.code(), absl::StatusCode::kFailedPrecondition) << overflow;
  EXPECT_EQ(Rows(*table, {1, 2}), before);
  EXPECT_EQ(table->rows(), 2);
  // A refused update with new ids makes no rows either.
  EXPECT_FALSE(table->Apply(0, {3, 1}, {1e30f, 1, 1, 1}).ok());
  EXPECT_EQ(table->rows(), 2);
  // An accepted one with a new id makes its row: first made, then updated.
  auto twin = Table(proto::ADAGRAD, 2);
  std::vector<float> fresh = Rows(*twin, {3});
  ASSERT_TRUE(twin->Apply(0, {3}, {0.5f, -0.5f}).ok());
  ASSERT_TRUE(table->Apply(0, {3}, {0.5f, -0.5f}).ok());
  EXPECT_EQ(table->rows(), 3);
  EXPECT_EQ(Rows(*table, {3}), Rows(*twin, {3}));
  EXPECT_NE(Rows(*table, {3}), fresh);
  EXPECT_EQ(table->slot_names(), std::vector<std::string>({"Adagrad"}));
}

// What checkpoints do: ForEachRow's rows inserted into a new table make a
// table that is the same, and goes on the same, bit for bit.
TEST(EmbeddingTableTest, InsertedRowsCopyATableExactly) {
  auto table = Table(proto::ADAM, 3), copy = Table(proto::ADAM, 3);
  ASSERT_NE(table, nullptr);
  ASSERT_TRUE(table->Apply(1, {4, 9, 1ull << 63}, {1, 2, 3, 4, 5, 6, -1, -2, -3}).ok());
  ASSERT_TRUE(table->Apply(2, {9, 5}, {0.5f, 0.5f, 0.5f, 7, 8, 9}).ok());
  absl::Status inserted;
  table->ForEachRow([&](uint64_t id, absl::Span<const float> row) {
    if (inserted.ok()) inserted = copy->Insert(id, row);
  });
  ASSERT_TRUE(inserted.ok()) << inserted;
  EXPECT_EQ(copy->rows(), 4);
  for (EmbeddingTable* t : {table.get(), copy.get()}) {
    ASSERT_TRUE(t->Apply(3, {5, 1ull << 63, 77}, {1, 1, 1, 2, 2, 2, 3, 3, 3}).ok());
  }
  std::vector<std::pair<uint64_t, std::vector<float>>> a, b;
  table->ForEachRow([&](uint64_t id, absl::Span<const float> row) {
    a.emplace_back(id, std::vector<float>(row.begin(), row.end()));
  });
  copy->ForEachRow([&](uint64_t id, absl::Span<const float> row) {
    b.emplace_back(id, std::vector<float>(row.begin(), row.end()));
  });
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 5u);
  EXPECT_EQ(a[0].second.size(), 9u);  // Values, Adam's m and v.

  const absl::Status again = copy->Insert(9, a[1].second);
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(again.message().find("table t: id 9 has a row already"), std::string::npos) << again;
  const absl::Status short_row = copy->Insert(10, {1, 2, 3});
  EXPECT_EQ(short_row.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_row.message().find("want 9"), std::string::npos) << short_row;
  EXPECT_EQ(copy->rows(), 5);
}

TEST(EmbeddingTableTest, MemoryStaysCloseToThePayload) {
  auto table = Table(proto::ADAGRAD, 16);
  ASSERT_NE(table, nullptr);
  const int64_t n = 200000;
  std::vector<uint64_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ULL;
  std::vector<float> out(n * 16);
  ASSERT_TRUE(table->Lookup(ids, absl::MakeSpan(out)).ok());
  EXPECT_EQ(table->rows(), n);
  EXPECT_EQ(table->payload_bytes_per_row(), 128);
  const double per_row = static_cast<double>(table->bytes()) / n;
  std::printf("embedding table: %lld rows of dim 16 with Adagrad, %.1f bytes a row (payload 128)\n",
              static_cast<long long>(n), per_row);
  EXPECT_GE(per_row, 128);
  EXPECT_LE(per_row, 128 + 64) << per_row;
}

TEST(TableShardOfTest, SpreadsFieldKeyedIdsEvenly) {
  for (int shards : {2, 3, 7}) {
    std::vector<int> count(shards, 0);
    // Criteo-like ids: the field in the high bits, small values below.
    for (uint64_t field = 0; field < 26; ++field) {
      for (uint64_t value = 0; value < 1000; ++value) {
        const int shard = TableShardOf(field << 33 | value, shards);
        ASSERT_GE(shard, 0);
        ASSERT_LT(shard, shards);
        ++count[shard];
      }
    }
    for (int k = 0; k < shards; ++k) {
      EXPECT_NEAR(count[k], 26000.0 / shards, 0.05 * 26000 / shards) << k << " of " << shards;
    }
  }
}

}  // namespace
}  // namespace psrt
