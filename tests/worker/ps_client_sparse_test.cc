// PsClient with embedding tables against real ps tasks in this process,
// over each transport of tensors: rows pulled with the dense values and
// pushed with the gradients, row look-ups that leave the push's version.
#include <vector>

#include "gtest/gtest.h"
#include "kernels/embedding_bag.h"
#include "ps/embedding_table.h"
#include "tests/worker/local_ps.h"
#include "worker/store/ps_client.h"

namespace psrt {
namespace {

INSTANTIATE_TEST_SUITE_P(Transports, PsClientTransportTest,
                         ::testing::Values(TensorTransport::kGrpc, TensorTransport::kDataPlane),
                         [](const ::testing::TestParamInfo<TensorTransport>& info) {
                           return info.param == TensorTransport::kGrpc ? "Grpc" : "DataPlane";
                         });


// A batch's features over table "emb" (dim 3): its ids deduplicated, and
// gradient rows (value g for the u-th distinct id: g * (u + 1)).
SparseFeatures Features(const std::vector<uint64_t>& ids, float g) {
  SparseFeatures features;
  features.num_fields = 1;
  features.ids = ids;
  kernels::Deduplicate(ids, &features.unique);
  const int64_t n = static_cast<int64_t>(features.unique.unique.size());
  features.rows.emplace_back(Shape{n, 3});
  features.grads.emplace_back(Shape{n, 3});
  for (int64_t u = 0; u < n; ++u) {
    for (int j = 0; j < 3; ++j) features.grads[0].data()[u * 3 + j] = g * (u + 1);
  }
  return features;
}

TEST_P(PsClientTransportTest, SparseRowsTravelWithTheDenseValuesAndGradients) {
  auto ps0_owner = Ps(0, 2), ps1_owner = Ps(0, 2);
  LocalPs &ps0 = *ps0_owner, &ps1 = *ps1_owner;
  const std::vector<VariableDef> vars = {{"w", {8}}};
  proto::TableMeta table;
  table.set_name("emb");
  table.set_dim(3);
  table.set_seed(11);
  const absl::Duration retry = absl::Seconds(60);
  auto chief = Client({&ps0, &ps1}, 0, vars, retry, 2, proto::DT_FLOAT, {table});
  auto other = Client({&ps0, &ps1}, 1, vars, retry, 2, proto::DT_FLOAT, {table});
  ASSERT_TRUE(chief->WaitForServers(absl::Seconds(10)).ok());
  ASSERT_TRUE(other->WaitForServers(absl::Seconds(10)).ok());
  proto::TrainingConfig config = SyncConfig(2);
  const absl::Status init = chief->Init(config, Filled(vars, 0.0f));
  ASSERT_TRUE(init.ok()) << init;
  ASSERT_TRUE(other->WaitForModelReady(absl::Seconds(10)).ok());

  // Many ids, so that every shard of the four holds some; both batches share 0..39.
  std::vector<uint64_t> ids_a, ids_b;
  for (uint64_t i = 0; i < 100; ++i) ids_a.push_back(i * 7919);
  for (uint64_t i = 0; i < 40; ++i) ids_b.push_back(i * 7919);
  ids_a.push_back(0);  // A repeat: one row, one gradient.
  SparseFeatures a = Features(ids_a, 1.0f), b = Features(ids_b, 2.0f);
  // What each row starts as: a table of the same seed.
  auto reference = EmbeddingTable::Create("emb", 3, 11, config);
  ASSERT_TRUE(reference.ok());
  std::vector<float> initial(a.unique.unique.size() * 3);
  ASSERT_TRUE((*reference)->Lookup(a.unique.unique, absl::MakeSpan(initial)).ok());

  auto step = [&](PsClient* client, SparseFeatures* features, float dense_grad) {
    std::vector<Tensor> params = Filled(vars, 0.0f);
    client->SetSparseFeatures(features);
    auto pulled = client->Pull(0, &params);
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    auto pushed = client->Push(Filled(vars, dense_grad));
    ASSERT_TRUE(pushed.ok()) << pushed.status();
    EXPECT_TRUE(pushed->accepted);
    auto next = client->Pull(1, &params);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(params[0].data()[0], -1.0f);  // 0 - 0.5 * mean(1, 3).
  };
  // The chief's rows before any push: the table's initial rows.
  chief->SetSparseFeatures(&a);
  ASSERT_TRUE(chief->LookupRows(&a).ok());
  EXPECT_EQ(std::vector<float>(a.rows[0].data(), a.rows[0].data() + initial.size()), initial);

  std::thread t([&] { step(other.get(), &b, 3.0f); });
  step(chief.get(), &a, 1.0f);
  t.join();
  // SGD with learning rate 0.5 of the mean over R = 2: an id both batches
  // hold moves by 0.5 * (g_a + g_b) / 2; one of a only by 0.5 * g_a / 2.
  for (size_t u = 0; u < a.unique.unique.size(); ++u) {
    const float g_a = 1.0f * (u + 1);
    const float g_b = u < 40 ? 2.0f * (u + 1) : 0.0f;
    for (int j = 0; j < 3; ++j) {
      ASSERT_FLOAT_EQ(a.rows[0].data()[u * 3 + j], initial[u * 3 + j] - 0.25f * (g_a + g_b))
          << "id " << a.unique.unique[u];
    }
  }
  int64_t rows = 0;
  for (LocalPs* ps : {&ps0, &ps1}) {
    for (int stripe = 0; stripe < 2; ++stripe) {
      const proto::StatusResponse status = ps->shard(stripe).GetStatus();
      ASSERT_EQ(status.tables_size(), 1);
      EXPECT_GT(status.tables(0).rows(), 0) << "every shard holds some of 100 ids";
      rows += status.tables(0).rows();
    }
  }
  EXPECT_EQ(rows, 100);
  EXPECT_TRUE(chief->Shutdown().ok());
  EXPECT_TRUE(other->Shutdown().ok());
}

// An evaluation's look-ups between a step's pull and its push (rows only,
// at whatever version the shards have reached) leave the push tagged with
// the version its gradients come from: with a backup worker ahead, it is
// stale and dropped, not applied as if it were fresh.
TEST_P(PsClientTransportTest, RowLookupsLeaveThePushsVersion) {
  auto ps = Ps();
  const std::vector<VariableDef> vars = {{"w", {4}}};
  proto::TableMeta table;
  table.set_name("emb");
  table.set_dim(3);
  auto chief = Client({ps.get()}, 0, vars, absl::Seconds(60), 1, proto::DT_FLOAT, {table});
  auto other = Client({ps.get()}, 1, vars, absl::Seconds(60), 1, proto::DT_FLOAT, {table});
  ASSERT_TRUE(chief->WaitForServers(absl::Seconds(10)).ok());
  ASSERT_TRUE(other->WaitForServers(absl::Seconds(10)).ok());
  proto::TrainingConfig config = SyncConfig(2);
  config.set_replicas_to_aggregate(1);  // One backup worker.
  ASSERT_TRUE(chief->Init(config, Filled(vars, 0.0f)).ok());
  ASSERT_TRUE(other->WaitForModelReady(absl::Seconds(10)).ok());
  SparseFeatures a = Features({1, 2, 3}, 1.0f), b = Features({3, 4}, 1.0f);
  chief->SetSparseFeatures(&a);
  other->SetSparseFeatures(&b);
  std::vector<Tensor> params = Filled(vars, 0.0f);
  ASSERT_EQ(chief->Pull(0, &params)->version, 0);
  ASSERT_EQ(other->Pull(0, &params)->version, 0);
  ASSERT_TRUE(other->Push(Filled(vars, 1.0f))->accepted);  // Version 1.
  SparseFeatures test = Features({5, 6}, 0.0f);
  ASSERT_TRUE(chief->LookupRows(&test).ok());
  auto pushed = chief->Push(Filled(vars, 1.0f));
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_FALSE(pushed->accepted);
  EXPECT_EQ(ps->shard().GetStatus().stale_pushes_dropped(), 1);
  // The look-ups made no rows; the pulls and the accepted push did.
  ASSERT_EQ(ps->shard().GetStatus().tables_size(), 1);
  EXPECT_EQ(ps->shard().GetStatus().tables(0).rows(), 4);
}

}  // namespace
}  // namespace psrt
