// EmbeddingTable: rows made on first touch from (seed, id) alone, updates
// that touch only the rows they name and equal the dense optimizer's on
// them (Adagrad, lazy Adam, SGD), refusals that change nothing, memory close
// to the payload, and TableShardOf spreading field-keyed ids evenly.
#include "ps/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
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

std::unique_ptr<EmbeddingTable> PolicyTable(RowPolicy policy,
                                            proto::OptimizerType type = proto::SGD) {
  auto table = EmbeddingTable::Create("t", /*dim=*/2, 7, Config(type), false, policy);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? *std::move(table) : nullptr;
}

// A training look-up at `step`, as a pull makes it.
std::vector<float> Pull(EmbeddingTable& table, const std::vector<uint64_t>& ids, int64_t step) {
  std::vector<float> out(ids.size() * table.dim());
  EXPECT_TRUE(table.Lookup(ids, absl::MakeSpan(out), /*make_missing=*/true, step).ok());
  return out;
}

std::set<uint64_t> Ids(const EmbeddingTable& table) {
  std::set<uint64_t> ids;
  table.ForEachRow([&](uint64_t id, absl::Span<const float>) { ids.insert(id); });
  return ids;
}

// --embedding_admit_count: an id reads zeros and has its gradients dropped
// until its Nth training look-up, then gets its row from (seed, id) as a
// table without admission makes it; evaluation look-ups do not count.
TEST(EmbeddingTableTest, AnIdGetsItsRowAtItsNthLookup) {
  RowPolicy policy;
  policy.admit_count = 3;
  auto table = PolicyTable(policy), plain = PolicyTable({});
  ASSERT_NE(table, nullptr);
  const std::vector<float> zeros(2, 0.0f);
  std::vector<float> eval(2);
  for (int lookup = 1; lookup <= 2; ++lookup) {
    EXPECT_EQ(Pull(*table, {5}, lookup), zeros);
    ASSERT_TRUE(table->Apply(lookup, {5}, {1, 1}).ok());  // Dropped, counted.
    ASSERT_TRUE(table->Lookup({5}, absl::MakeSpan(eval), /*make_missing=*/false).ok());
    EXPECT_EQ(eval, zeros);
  }
  EXPECT_EQ(table->rows(), 0);
  EXPECT_EQ(table->stats().unadmitted_gradients, 2);
  EXPECT_EQ(table->stats().candidates, 1);
  const std::vector<float> admitted = Pull(*table, {5}, 3);
  EXPECT_EQ(admitted, Pull(*plain, {5}, 0));  // Its initial values.
  EXPECT_NE(admitted, zeros);
  EXPECT_EQ(table->rows(), 1);
  EXPECT_EQ(table->stats().candidates, 0);
  ASSERT_TRUE(table->Apply(3, {5}, {1, 1}).ok());  // Now taken.
  ASSERT_TRUE(plain->Apply(3, {5}, {1, 1}).ok());
  EXPECT_EQ(Pull(*table, {5}, 4), Pull(*plain, {5}, 4));
  EXPECT_EQ(table->stats().unadmitted_gradients, 2);
}

// Two sync workers' pulls of one step, in either order: the first counts
// and decides, the second gets the same answer (before, the second pull
// counted again and the id's row depended on which worker came first).
TEST(EmbeddingTableTest, ThePullsOfOneStepCountAsOneLookup) {
  RowPolicy policy;
  policy.admit_count = 2;
  auto table = PolicyTable(policy);
  ASSERT_NE(table, nullptr);
  const std::vector<float> zeros(2, 0.0f);
  EXPECT_EQ(Pull(*table, {5}, 1), zeros);
  EXPECT_EQ(Pull(*table, {5}, 1), zeros);  // The same step: not its 2nd look-up.
  EXPECT_EQ(table->rows(), 0);
  const std::vector<float> first = Pull(*table, {5}, 2);  // Its 2nd step: admitted.
  EXPECT_NE(first, zeros);
  EXPECT_EQ(Pull(*table, {5}, 2), first);  // The other worker's pull finds the row.
  EXPECT_EQ(table->rows(), 1);
}

// --embedding_admit_probability: each look-up admits with probability p,
// drawn from (seed, id, look-up) alone: two tables agree on every id.
TEST(EmbeddingTableTest, IdsAreAdmittedWithTheGivenProbability) {
  RowPolicy policy;
  policy.admit_probability = 0.25;
  auto a = PolicyTable(policy), b = PolicyTable(policy);
  ASSERT_NE(a, nullptr);
  std::vector<uint64_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i * 0x9e3779b97f4a7c15ULL;
  Pull(*a, ids, 0);
  Pull(*b, ids, 0);
  EXPECT_NEAR(a->rows(), 5000, 300);
  EXPECT_EQ(Ids(*a), Ids(*b));
  EXPECT_EQ(a->stats().candidates, 20000 - a->rows());
  Pull(*a, ids, 1);  // A second draw for those still waiting.
  EXPECT_NEAR(a->rows(), 20000 * (1 - 0.75 * 0.75), 400);
}

// --embedding_ttl_steps: a row no training look-up or update has touched
// for S steps is dropped (the sweep runs every step for S < 16), as are ids
// waiting for admission; an id that returns starts from its initial values.
TEST(EmbeddingTableTest, RowsUntouchedForTheTtlAreDropped) {
  RowPolicy policy;
  policy.ttl_steps = 3;
  auto table = PolicyTable(policy), plain = PolicyTable({});
  ASSERT_NE(table, nullptr);
  const std::vector<float> initial = Pull(*plain, {1}, 0);
  ASSERT_TRUE(table->Apply(0, {1, 2}, {1, 1, 1, 1}).ok());
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(table->Apply(step, {2}, {1, 1}).ok());
    table->Evict(step);
    EXPECT_EQ(Ids(*table), (std::set<uint64_t>{1, 2})) << step;  // 1: untouched 1, 2 steps.
  }
  Pull(*table, {2}, 3);  // A look-up touches too.
  table->Evict(3);       // Row 1 untouched for steps 1..3.
  EXPECT_EQ(Ids(*table), (std::set<uint64_t>{2}));
  EXPECT_EQ(table->stats().evicted_rows, 1);
  EXPECT_EQ(Pull(*table, {1}, 4), initial);  // Back, afresh.
  EXPECT_EQ(table->rows(), 2);
  table->Evict(6);  // Row 2 last touched at 3, row 1 at 4.
  EXPECT_EQ(Ids(*table), (std::set<uint64_t>{1}));
  EXPECT_EQ(table->stats().evicted_rows, 2);

  RowPolicy admit = policy;
  admit.admit_count = 2;
  auto waiting = PolicyTable(admit);
  Pull(*waiting, {9}, 0);
  waiting->Evict(2);
  EXPECT_EQ(waiting->stats().candidates, 1);
  waiting->Evict(3);
  EXPECT_EQ(waiting->stats().candidates, 0);  // Forgotten: its count starts again.
  Pull(*waiting, {9}, 4);
  EXPECT_EQ(waiting->rows(), 0);
  Pull(*waiting, {9}, 5);
  EXPECT_EQ(waiting->rows(), 1);
}

// --embedding_max_rows_per_ps: past the budget, the least recently touched
// rows go, down to 15/16 of it; a dropped row's place is reused, and
// checkpoints (ForEachRow) see only the rows held.
TEST(EmbeddingTableTest, ARowBudgetDropsTheLeastRecentlyTouched) {
  RowPolicy policy;
  policy.max_rows = 32;
  auto table = PolicyTable(policy);
  ASSERT_NE(table, nullptr);
  // Ids 0..31 touched at steps 0..31, then 32 and 33 new at step 32.
  for (uint64_t id = 0; id < 32; ++id) {
    ASSERT_TRUE(table->Apply(static_cast<int64_t>(id), {id}, {1, 1}).ok());
    table->Evict(static_cast<int64_t>(id));
  }
  EXPECT_EQ(table->rows(), 32);
  EXPECT_EQ(table->stats().evicted_rows, 0);
  Pull(*table, {0}, 32);  // The oldest, touched again.
  ASSERT_TRUE(table->Apply(32, {32, 33}, {1, 1, 1, 1}).ok());
  table->Evict(32);
  // 34 rows, budget 32: down to 30, dropping the 4 least recently touched.
  EXPECT_EQ(table->rows(), 30);
  EXPECT_EQ(table->stats().evicted_rows, 4);
  const std::set<uint64_t> held = Ids(*table);
  for (uint64_t gone : {1, 2, 3, 4}) EXPECT_EQ(held.count(gone), 0u) << gone;
  for (uint64_t kept : {0, 5, 31, 32, 33}) EXPECT_EQ(held.count(kept), 1u) << kept;
  // New rows take the dropped rows' places, not new ones at the end.
  ASSERT_TRUE(table->Apply(33, {40, 41}, {1, 1, 1, 1}).ok());
  EXPECT_EQ(table->rows(), 32);
  std::vector<uint64_t> order;
  table->ForEachRow([&](uint64_t id, absl::Span<const float>) { order.push_back(id); });
  ASSERT_EQ(order.size(), 32u);
  EXPECT_EQ(order.back(), 33u);  // Still the newest place.
  EXPECT_NE(std::find(order.begin(), order.begin() + 5, 40), order.begin() + 5);
  EXPECT_NE(std::find(order.begin(), order.begin() + 5, 41), order.begin() + 5);
  // A look-up that makes rows past the budget drops others at once.
  Pull(*table, {50, 51, 52}, 34);
  EXPECT_EQ(table->rows(), 30);
  EXPECT_EQ(Ids(*table).count(50), 1u);
}

// A job resumed with other flags: the rows held go on under the new
// learning rate and a budget they never had; another rule's slots, or
// dropping eviction, is refused and changes nothing.
TEST(EmbeddingTableTest, ReconfigureTakesNewHyperparametersAndABudget) {
  auto table = Table(proto::SGD, /*dim=*/1);
  ASSERT_NE(table, nullptr);
  auto value_of = [&](uint64_t id) {  // An evaluation's look-up: touches nothing.
    float value = 0;
    EXPECT_TRUE(table->Lookup({id}, absl::MakeSpan(&value, 1), /*make_missing=*/false).ok());
    return value;
  };
  for (uint64_t id = 0; id < 40; ++id) ASSERT_TRUE(table->Apply(0, {id}, {1}).ok());
  const float before = value_of(0);
  proto::TrainingConfig slower = Config(proto::SGD);
  slower.set_learning_rate(0.01f);
  RowPolicy budget;
  budget.max_rows = 32;
  ASSERT_TRUE(table->Reconfigure(slower, budget, /*step=*/5).ok());
  ASSERT_TRUE(table->Apply(6, {0}, {1}).ok());
  EXPECT_FLOAT_EQ(value_of(0), before - 0.01f);
  table->Evict(6);
  EXPECT_EQ(table->rows(), 30);  // Down to 15/16 of the budget.
  EXPECT_EQ(Ids(*table).count(0), 1u);  // The one touched since.

  const absl::Status other_rule = table->Reconfigure(Config(proto::ADAM), budget, 7);
  EXPECT_EQ(other_rule.code(), absl::StatusCode::kInvalidArgument) << other_rule;
  EXPECT_NE(other_rule.message().find("embedding table t: its rows hold 0 optimizer slots"),
            std::string::npos)
      << other_rule;
  const absl::Status no_eviction = table->Reconfigure(slower, RowPolicy(), 7);
  EXPECT_EQ(no_eviction.code(), absl::StatusCode::kFailedPrecondition) << no_eviction;
  ASSERT_TRUE(table->Apply(8, {0}, {1}).ok());
  EXPECT_FLOAT_EQ(value_of(0), before - 0.02f);  // Still SGD at 0.01.

  // A budget that never dropped a row may go.
  RowPolicy roomy;
  roomy.max_rows = 1000;
  auto unevicted = PolicyTable(roomy);
  ASSERT_NE(unevicted, nullptr);
  ASSERT_TRUE(unevicted->Apply(0, {1, 2}, {1, 1, 1, 1}).ok());
  unevicted->Evict(0);
  ASSERT_TRUE(unevicted->Reconfigure(Config(proto::SGD), RowPolicy(), 1).ok());
  ASSERT_TRUE(unevicted->Apply(1, {3}, {1, 1}).ok());
  EXPECT_EQ(Ids(*unevicted), (std::set<uint64_t>{1, 2, 3}));
}

// A refused update with new ids drops exactly the rows it made, also when
// they took the places of evicted ones.
TEST(EmbeddingTableTest, ARefusedUpdateDropsTheRowsItMadeInFreedPlaces) {
  RowPolicy policy;
  policy.ttl_steps = 1;
  auto table = PolicyTable(policy, proto::ADAGRAD);
  ASSERT_NE(table, nullptr);
  ASSERT_TRUE(table->Apply(0, {1, 2, 3}, {1, 1, 1, 1, 1, 1}).ok());
  ASSERT_TRUE(table->Apply(1, {3}, {1, 1}).ok());
  table->Evict(1);
  EXPECT_EQ(Ids(*table), (std::set<uint64_t>{3}));
  EXPECT_FALSE(table->Apply(2, {4, 5, 3}, {1, 1, 1, 1, 1e30f, 1e30f}).ok());
  EXPECT_EQ(Ids(*table), (std::set<uint64_t>{3}));
  EXPECT_EQ(table->rows(), 1);
  ASSERT_TRUE(table->Apply(2, {4, 5}, {1, 1, 1, 1}).ok());
  EXPECT_EQ(Ids(*table), (std::set<uint64_t>{3, 4, 5}));
}

// A look-up naming an id twice makes one row and reads it twice (the
// workers send each id once, but nothing else refuses it).
TEST(EmbeddingTableTest, AnIdNamedTwiceInOneLookupGetsOneRow) {
  auto table = Table(proto::ADAGRAD, 2);
  ASSERT_NE(table, nullptr);
  const std::vector<float> rows = Rows(*table, {5, 6, 5});
  EXPECT_EQ(table->rows(), 2);
  EXPECT_EQ(std::vector<float>(rows.begin(), rows.begin() + 2),
            std::vector<float>(rows.begin() + 4, rows.end()));
  std::vector<uint64_t> ids;
  table->ForEachRow([&](uint64_t id, absl::Span<const float>) { ids.push_back(id); });
  EXPECT_EQ(ids, (std::vector<uint64_t>{5, 6}));
}

// Without a ttl, an id waiting for admission is forgotten after 65536
// steps without a look-up (the sweep runs every 4096), so that the ids seen
// once do not pile up.
TEST(EmbeddingTableTest, IdsWaitingForAdmissionAreForgottenWithoutATtl) {
  RowPolicy policy;
  policy.admit_count = 3;
  auto table = PolicyTable(policy);
  ASSERT_NE(table, nullptr);
  Pull(*table, {1, 2}, 0);
  Pull(*table, {2}, 60000);
  table->Evict(60000);
  EXPECT_EQ(table->stats().candidates, 2);
  table->Evict(70000);  // 1 last named at 0, 2 at 60000.
  EXPECT_EQ(table->stats().candidates, 1);
  Pull(*table, {1}, 70001);  // Counts from one again.
  Pull(*table, {1}, 70002);
  EXPECT_EQ(table->rows(), 0);
  Pull(*table, {2}, 70003);  // Its third.
  EXPECT_EQ(table->rows(), 1);
}

TEST(EmbeddingTableTest, ABadPolicyIsNamed) {
  proto::TrainingConfig config = Config(proto::SGD);
  config.set_embedding_admit_count(-1);
  EXPECT_NE(RowPolicyFromConfig(config).status().message().find("embedding_admit_count"),
            std::string::npos);
  config = Config(proto::SGD);
  config.set_embedding_admit_probability(1.5f);
  EXPECT_NE(RowPolicyFromConfig(config).status().message().find("embedding_admit_probability"),
            std::string::npos);
  config.set_embedding_admit_probability(0.5f);
  config.set_embedding_admit_count(3);
  EXPECT_NE(RowPolicyFromConfig(config).status().message().find("set one"), std::string::npos);
  config = Config(proto::SGD);
  config.set_embedding_ttl_steps(10);
  config.set_embedding_max_rows_per_shard(100);
  auto policy = RowPolicyFromConfig(config);
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ(policy->ttl_steps, 10);
  EXPECT_EQ(policy->max_rows, 100);
  EXPECT_TRUE(policy->admits_every_id());
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

// An id's shard under another count is one of those TableShardsOverlap
// names, and each shard of the new count draws from few of the old.
TEST(TableShardOfTest, ShardsOfAnotherCountOverlapByRanges) {
  const std::pair<int, int> counts[] = {{2, 3}, {3, 2}, {4, 6}, {6, 1}, {1, 4}, {5, 5}};
  for (const auto& [from, to] : counts) {
    std::vector<std::set<int>> drawn(to);
    for (uint64_t id = 0; id < 20000; ++id) {
      const int old_shard = TableShardOf(id * 7919, from);
      const int new_shard = TableShardOf(id * 7919, to);
      ASSERT_TRUE(TableShardsOverlap(old_shard, from, new_shard, to))
          << "id " << id * 7919 << ": " << old_shard << " of " << from << ", " << new_shard
          << " of " << to;
      drawn[new_shard].insert(old_shard);
    }
    for (int k = 0; k < to; ++k) {
      int overlapping = 0;
      for (int j = 0; j < from; ++j) overlapping += TableShardsOverlap(j, from, k, to);
      // Ranges: ceil(from / to) + 1 old shards at most, and every one of
      // them holds some of the new shard's ids here.
      EXPECT_LE(overlapping, (from + to - 1) / to + 1) << k << " of " << to;
      EXPECT_EQ(static_cast<int>(drawn[k].size()), overlapping) << k << " of " << to;
    }
  }
  // The same count: shard k meets only itself.
  EXPECT_TRUE(TableShardsOverlap(2, 5, 2, 5));
  EXPECT_FALSE(TableShardsOverlap(1, 5, 2, 5));
}

}  // namespace
}  // namespace psrt
