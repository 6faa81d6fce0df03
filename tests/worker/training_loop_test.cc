// The training loop, the checkpoint policy, evaluation and the cluster
// recovery protocol against a FakeParameterStore: no servers, each test a
// fraction of a second. tests/worker/trainer_test.cc runs the same trainer
// against real parameter servers.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "models/model.h"
#include "tests/worker/fake_parameter_store.h"
#include "tests/worker/local_ps.h"
#include "worker/input/batch_source.h"
#include "worker/training/trainer.h"

namespace psrt {
namespace {

void ExpectSameValues(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t v = 0; v < want.size(); ++v) {
    ASSERT_EQ(got[v].shape(), want[v].shape()) << v;
    for (int64_t i = 0; i < want[v].num_elements(); ++i) {
      ASSERT_EQ(got[v].data()[i], want[v].data()[i]) << "variable " << v << ", element " << i;
    }
  }
}

// A model whose device faults in the backward pass of its `fault_at`-th
// step, right after it announced its last layer's gradients: a GPU's fault
// surfaces so, after some hooks ran and with the rest never announced.
class FaultingModel : public Model {
 public:
  FaultingModel(std::unique_ptr<Model> inner, int fault_at)
      : inner_(std::move(inner)), fault_at_(fault_at) {}
  const std::vector<VariableDef>& variables() const override { return inner_->variables(); }
  std::string device_name() const override { return inner_->device_name(); }
  kernels::DeviceMemoryStats device_memory() const override { return inner_->device_memory(); }
  absl::Status status() const override { return fault_; }
  void Initialize(uint64_t seed, std::vector<Tensor>* params) const override {
    inner_->Initialize(seed, params);
  }
  float ComputeGradients(const std::vector<Tensor>& params, const Tensor& images,
                         absl::Span<const int32_t> labels, std::vector<Tensor>* grads,
                         const StepHooks& hooks) override {
    if (++steps_ != fault_at_) return inner_->ComputeGradients(params, images, labels, grads, hooks);
    StepHooks faulting = hooks;
    faulting.gradients_ready = [&](int begin, int end) {
      if (!fault_.ok()) return;  // Past the fault: nothing more is announced.
      announced_ = {begin, end};
      if (hooks.gradients_ready) hooks.gradients_ready(begin, end);
      fault_ = absl::InternalError("injected device fault");
    };
    return inner_->ComputeGradients(params, images, labels, grads, faulting);
  }
  Evaluation Evaluate(const std::vector<Tensor>& params, const Tensor& images,
                      absl::Span<const int32_t> labels) override {
    return inner_->Evaluate(params, images, labels);
  }
  // The variables [first, second) announced before the fault.
  std::pair<int, int> announced() const { return announced_; }

 private:
  const std::unique_ptr<Model> inner_;
  const int fault_at_;
  int steps_ = 0;
  absl::Status fault_;
  std::pair<int, int> announced_{0, 0};
};

class TrainingLoopTest : public ::testing::Test {
 protected:
  TrainingLoopTest()
      : train_(SyntheticDataset(200, 16, 4, 1)), test_(SyntheticDataset(90, 16, 4, 2)) {
    model_ = NewTowers();
    store_ = std::make_unique<FakeParameterStore>(variables(), /*num_shards=*/2);
  }

  static std::unique_ptr<Model> NewMlp() {
    ModelOptions model_options;
    model_options.input_height = model_options.input_width = 4;
    model_options.num_classes = 4;
    model_options.hidden_units = {8};
    model_options.intra_op_threads = 1;
    return *NewModel("mlp", model_options);
  }
  static std::unique_ptr<Towers> NewTowers(std::unique_ptr<Model> model = NewMlp()) {
    std::vector<std::unique_ptr<Model>> models;
    models.push_back(std::move(model));
    return std::make_unique<Towers>(std::move(models));
  }
  std::vector<VariableDef> variables() const { return model_->tower(0)->variables(); }

  TrainerOptions Options(int64_t steps) const {
    TrainerOptions options;
    options.config = SyncConfig(1);
    options.config.set_learning_rate(0.1f);
    options.batch_size = 20;
    options.train_steps = steps;
    options.log_every_steps = 10;
    options.startup_timeout = absl::Milliseconds(10);
    return options;
  }
  absl::StatusOr<TrainResult> Run(const TrainerOptions& options) {
    Trainer trainer(options, model_.get(), store_.get(), &train_, &test_);
    return trainer.Run();
  }
  double Accuracy(const std::vector<Tensor>& params) {
    const Model::Evaluation e = model_->tower(0)->Evaluate(params, test_.images, test_.labels);
    return static_cast<double>(e.correct) / test_.size();
  }

  Dataset train_;
  Dataset test_;
  std::unique_ptr<Towers> model_;
  std::unique_ptr<FakeParameterStore> store_;
};

TEST_F(TrainingLoopTest, SyncStepsAdvanceTheGlobalStepAndTheChiefEndsTraining) {
  absl::StatusOr<TrainResult> result = Run(Options(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->global_step, 30);
  EXPECT_EQ(result->local_steps, 30);
  EXPECT_EQ(store_->version(0), 30);
  EXPECT_EQ(store_->version(1), 30);
  EXPECT_EQ(store_->pushes(), 30);
  EXPECT_EQ(store_->shutdowns(), 1);
  EXPECT_TRUE(store_->training_done());
}

TEST_F(TrainingLoopTest, TheChiefInitializesOnceWithANewRunId) {
  ASSERT_TRUE(Run(Options(5)).ok());
  ASSERT_EQ(store_->inits(), 1);
  EXPECT_EQ(store_->run_ids()[0].size(), 16u) << store_->run_ids()[0];
  EXPECT_TRUE(store_->restores().empty());
}

TEST_F(TrainingLoopTest, OverlappedStepsTrainExactlyLikeSequentialOnes) {
  TrainerOptions options = Options(12);
  options.overlap_comm = false;
  ASSERT_TRUE(Run(options).ok());
  const std::vector<Tensor> sequential = store_->Values();
  store_ = std::make_unique<FakeParameterStore>(variables(), 2);
  options.overlap_comm = true;
  ASSERT_TRUE(Run(options).ok());
  const std::vector<Tensor> overlapped = store_->Values();
  ExpectSameValues(overlapped, sequential);
}

// The third step faults on the device after its last layer's gradients
// left for the store: the shards still waiting for the others are never
// pushed, and the step fails with the fault.
TEST_F(TrainingLoopTest, ADeviceFaultMidBackwardPushesNothingUnfinished) {
  for (const bool overlap : {false, true}) {
    SCOPED_TRACE(overlap ? "overlapped" : "sequential");
    auto faulting = std::make_unique<FaultingModel>(NewMlp(), /*fault_at=*/3);
    const FaultingModel* model = faulting.get();
    model_ = NewTowers(std::move(faulting));
    store_ = std::make_unique<FakeParameterStore>(variables(), 2);
    TrainerOptions options = Options(10);
    options.overlap_comm = overlap;
    absl::StatusOr<TrainResult> result = Run(options);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
    EXPECT_NE(result.status().message().find("injected device fault"), std::string::npos)
        << result.status();
    const auto [begin, end] = model->announced();
    ASSERT_LT(begin, end);
    for (int k = 0; k < 2; ++k) {
      bool finished = true;  // Every variable of shard k was announced.
      for (int s : store_->placement().shard_slices[k]) {
        const int v = store_->placement().slices[s].variable;
        finished &= begin <= v && v < end;
      }
      if (!finished || !overlap) {
        EXPECT_EQ(store_->version(k), 2) << "shard " << k;
      } else {
        EXPECT_GE(store_->version(k), 2) << "shard " << k;
      }
    }
  }
}

TEST_F(TrainingLoopTest, SavesAtStartEveryNStepsAndAtTheEnd) {
  TrainerOptions options = Options(25);
  options.save_checkpoint_steps = 10;
  ASSERT_TRUE(Run(options).ok());
  EXPECT_EQ(store_->saves(), (std::vector<int64_t>{0, 10, 20, 25}));
}

TEST_F(TrainingLoopTest, NoCheckpointsWithoutACheckpointDirEverywhere) {
  store_ = std::make_unique<FakeParameterStore>(variables(), 2, /*checkpoint_dirs=*/false);
  TrainerOptions options = Options(25);
  options.save_checkpoint_steps = 10;
  ASSERT_TRUE(Run(options).ok());
  EXPECT_TRUE(store_->saves().empty());
}

TEST_F(TrainingLoopTest, SavesThatCannotBeWrittenStopTheJob) {
  store_->FailSaves(100, absl::InternalError("disk full"));
  TrainerOptions options = Options(50);
  options.save_checkpoint_steps = 10;
  options.max_failed_saves = 3;
  absl::StatusOr<TrainResult> result = Run(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
  EXPECT_NE(result.status().message().find("3 checkpoints in a row"), std::string::npos);
  EXPECT_EQ(store_->version(), 20);  // Failed at 0, 10 and 20.
  EXPECT_EQ(store_->shutdowns(), 0);  // A failed chief does not end training.
}

TEST_F(TrainingLoopTest, SavesRefusedForAMovedStateDoNotCount) {
  store_->FailSaves(3, absl::FailedPreconditionError("moved on"));
  TrainerOptions options = Options(40);
  options.save_checkpoint_steps = 10;
  options.max_failed_saves = 2;
  ASSERT_TRUE(Run(options).ok());
  EXPECT_EQ(store_->saves(), (std::vector<int64_t>{30, 40}));
}

TEST_F(TrainingLoopTest, EvaluatesTheFinalModelOnTheWholeTestSet) {
  TrainerOptions options = Options(30);
  options.eval_every_steps = 10;
  absl::StatusOr<TrainResult> result = Run(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_DOUBLE_EQ(result->test_accuracy, Accuracy(store_->Values()));
  EXPECT_GT(result->test_accuracy, 0.25);
}

// A test stream gives what the Dataset gives: 90 examples in batches of 20,
// the last one cut from a batch that runs into the next epoch.
TEST_F(TrainingLoopTest, AStreamedTestSetEvaluatesLikeTheDataset) {
  TrainerOptions options = Options(10);
  absl::StatusOr<TrainResult> from_dataset = Run(options);
  ASSERT_TRUE(from_dataset.ok()) << from_dataset.status();
  store_ = std::make_unique<FakeParameterStore>(variables(), 2);
  auto source = [](const Dataset* data, bool shuffle) {
    return [data, shuffle]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
      return std::unique_ptr<BatchSource>(
          std::make_unique<DatasetBatchSource>(data, 0, 1, shuffle, 1));
    };
  };
  Trainer trainer(options, model_.get(), store_.get(), source(&train_, true),
                  source(&test_, false), test_.size());
  absl::StatusOr<TrainResult> streamed = trainer.Run();
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_DOUBLE_EQ(streamed->test_accuracy, from_dataset->test_accuracy);
}

TEST_F(TrainingLoopTest, FailsOnANonFiniteLoss) {
  TrainerOptions options = Options(30);
  options.config.set_learning_rate(1e30f);
  absl::StatusOr<TrainResult> result = Run(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal) << result.status();
}

class RecoveryTest : public TrainingLoopTest {};

TEST_F(RecoveryTest, AResumedChiefRestoresTheNewestCheckpointEveryShardHolds) {
  TrainerOptions options = Options(30);
  options.save_checkpoint_steps = 10;
  ASSERT_TRUE(Run(options).ok());
  store_->DropCheckpoint(1, 30);  // Shard 1 never wrote 30.
  store_->RestartShard(0);        // Restores 30,
  store_->RestartShard(1);        // and 20.
  store_->NewClient();
  options.train_steps = 40;
  absl::StatusOr<TrainResult> result = Run(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(store_->restores(), (std::vector<int64_t>{20}));
  EXPECT_EQ(result->global_step, 40);
  EXPECT_EQ(result->local_steps, 20);
}

TEST_F(RecoveryTest, AResumedChiefKeepsACheckpointEveryShardRestored) {
  TrainerOptions options = Options(30);
  options.save_checkpoint_steps = 10;
  ASSERT_TRUE(Run(options).ok());
  store_->RestartShard(0);
  store_->RestartShard(1);
  store_->NewClient();
  options.train_steps = 35;
  absl::StatusOr<TrainResult> result = Run(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(store_->restores().empty());
  EXPECT_EQ(result->local_steps, 5);
  EXPECT_EQ(store_->inits(), 2);
}

TEST_F(RecoveryTest, AShardRestartMidRunRollsEveryShardBackAndTrainingCarriesOn) {
  TrainerOptions options = Options(30);
  options.save_checkpoint_steps = 10;
  store_->OnVersion(15, [this] { store_->RestartShard(1); });
  absl::StatusOr<TrainResult> result = Run(options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(store_->restores(), (std::vector<int64_t>{10}));
  EXPECT_EQ(result->global_step, 30);
  EXPECT_EQ(result->local_steps, 15 + 20);
  EXPECT_EQ(store_->version(0), 30);
  EXPECT_EQ(store_->version(1), 30);
}

// Both ps tasks die at step 15 and only ps/1 comes back: the chief waits
// --ps_wait_secs for ps/0, then fails naming it, instead of waiting for good.
TEST_F(RecoveryTest, AShardThatDoesNotComeBackFailsTheStepAfterThePsWait) {
  TrainerOptions options = Options(30);
  options.save_checkpoint_steps = 10;
  options.ps_wait = absl::Seconds(42);
  store_->OnVersion(15, [this] {
    store_->StopShard(0);
    store_->RestartShard(1);
  });
  absl::StatusOr<TrainResult> result = Run(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded) << result.status();
  EXPECT_NE(result.status().message().find("fake ps 0"), std::string::npos) << result.status();
  EXPECT_NE(result.status().message().find("--ps_wait_secs"), std::string::npos)
      << result.status();
  EXPECT_EQ(store_->last_server_wait(), absl::Seconds(42));
}

// Recovered at step 10 from a fault at 15, a sync run with fixed data order
// ends with the model of an uninterrupted one.
TEST_F(RecoveryTest, ARecoveredRunEndsWithTheModelOfAnUninterruptedOne) {
  TrainerOptions options = Options(20);
  options.shuffle = false;
  options.save_checkpoint_steps = 10;
  ASSERT_TRUE(Run(options).ok());
  const std::vector<Tensor> uninterrupted = store_->Values();
  store_ = std::make_unique<FakeParameterStore>(variables(), 2);
  store_->OnVersion(15, [this] { store_->RestartShard(0); });
  ASSERT_TRUE(Run(options).ok());
  const std::vector<Tensor> recovered = store_->Values();
  ExpectSameValues(recovered, uninterrupted);
}

TEST_F(RecoveryTest, AShardThatLostTheModelWithNoCommonCheckpointIsAnError) {
  store_ = std::make_unique<FakeParameterStore>(variables(), 2, /*checkpoint_dirs=*/false);
  TrainerOptions options = Options(30);
  store_->OnVersion(5, [this] { store_->RestartShard(1, /*restores=*/false); });
  absl::StatusOr<TrainResult> result = Run(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_NE(result.status().message().find("fake ps 1 lost the model"), std::string::npos)
      << result.status();
}

// A shard that restarts after the first checkpoint (taken at once) rolls
// the others back to it.
TEST_F(RecoveryTest, AShardThatLostTheModelIsRestoredToTheFirstCheckpoint) {
  store_->OnVersion(5, [this] { store_->RestartShard(1, /*restores=*/false); });
  absl::StatusOr<TrainResult> result = Run(Options(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(store_->restores(), (std::vector<int64_t>{0}));
  EXPECT_EQ(result->local_steps, 35);
}

TEST_F(RecoveryTest, ShardsOfDifferentRunsAreNeverConfirmedTogether) {
  TrainerOptions options = Options(10);
  options.save_checkpoint_steps = 10;
  ASSERT_TRUE(Run(options).ok());
  store_->DropCheckpoint(0, 0);
  store_->DropCheckpoint(0, 10);
  store_->RestartShard(0, /*restores=*/false);
  store_->RestartShard(1);
  store_->NewClient();
  // Shard 0 initialized by another job; shard 1 restored this one's.
  ASSERT_TRUE(store_->Init(options.config, store_->Values(), 0).ok());
  store_->SetRunId(0, "another");
  store_->RestartShard(1);
  options.train_steps = 20;
  absl::StatusOr<TrainResult> result = Run(options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_NE(result.status().message().find("different training runs"), std::string::npos)
      << result.status();
}

}  // namespace
}  // namespace psrt
