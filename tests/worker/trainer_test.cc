#include "worker/trainer.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/placement.h"
#include "gtest/gtest.h"
#include "models/model.h"

namespace psrt {
namespace {

// Found by fuzz/idx_fuzzer.cc: an empty IDX training set (which reads
// fine) made the worker fail a CHECK in BatchIterator; so did any set with
// fewer examples than replicas. Now it is an error, before any RPC.
TEST(TrainerTest, RefusesTrainingDataWithNoExampleForThisReplica) {
  ModelOptions model_options;
  model_options.hidden_units = {4};
  model_options.intra_op_threads = 1;
  absl::StatusOr<std::unique_ptr<Model>> model = NewModel("mlp", model_options);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<VariableDef> variables = (*model)->variables();
  std::vector<std::unique_ptr<Model>> models;
  models.push_back(std::move(*model));
  Towers towers(std::move(models));

  PsClient::Options client_options;
  client_options.ps_addresses = {"127.0.0.1:1"};  // Nothing listens there.
  client_options.rpc_timeout = absl::Seconds(1);
  absl::StatusOr<Placement> placement = ComputePlacement(variables, 1, PlacementOptions());
  ASSERT_TRUE(placement.ok()) << placement.status();
  PsClient client(client_options, *placement, variables);

  for (int64_t examples : {0, 1}) {
    Dataset train;
    train.rows = train.cols = 28;
    train.images.Resize({examples, 784});
    train.labels.assign(examples, 0);
    TrainerOptions options;
    options.replica = 1;
    options.num_replicas = 2;
    options.startup_timeout = absl::Seconds(1);
    Trainer trainer(options, &towers, &client, &train, nullptr);
    absl::StatusOr<TrainResult> result = trainer.Run();
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << examples;
    EXPECT_NE(result.status().message().find("too few for 2 replicas"),
              absl::string_view::npos)
        << result.status();
  }
}

}  // namespace
}  // namespace psrt
