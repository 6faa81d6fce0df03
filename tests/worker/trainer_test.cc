#include "worker/training/trainer.h"

#include <unistd.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/placement.h"
#include "common/safetensors.h"
#include "gtest/gtest.h"
#include "models/model.h"
#include "common/status_macros.h"
#include "common/tfrecord.h"
#include "tests/worker/local_ps.h"
#include "worker/input/image_decoder.h"
#include "worker/input/image_pipeline.h"
#include "worker/input/image_records.h"
#include "worker/input/synthetic_images.h"

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

// A chief alone training a small MLP on synthetic data, sync, against one
// in-process ps task of two stripes with contiguous placement.
class LocalTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/trainer_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(std::system(("rm -rf " + dir_ + " && mkdir -p " + dir_).c_str()), 0);
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  absl::StatusOr<TrainResult> Train(TrainerOptions options, LocalPs* ps) {
    ModelOptions model_options;
    model_options.input_height = model_options.input_width = 8;
    model_options.hidden_units = {16};
    model_options.intra_op_threads = 1;
    absl::StatusOr<std::unique_ptr<Model>> model = NewModel("mlp", model_options);
    EXPECT_TRUE(model.ok()) << model.status();
    const std::vector<VariableDef> variables = (*model)->variables();
    std::vector<std::unique_ptr<Model>> models;
    models.push_back(std::move(*model));
    Towers towers(std::move(models));
    PlacementOptions placement;
    placement.strategy = PlacementStrategy::kContiguous;
    auto client = NewClient({ps}, 0, variables, absl::Seconds(60), /*stripes=*/2, nullptr,
                            placement);
    const Dataset train = SyntheticDataset(400, 64, 10, 1);
    const Dataset test = SyntheticDataset(100, 64, 10, 2);
    options.config = SyncConfig(1);
    options.config.set_learning_rate(0.05f);
    options.batch_size = 20;
    options.log_every_steps = 10;
    options.startup_timeout = absl::Seconds(30);
    Trainer trainer(options, &towers, client.get(), &train, &test);
    return trainer.Run();
  }

  static ModelOptions ImageModelOptions() {
    ModelOptions model_options;
    model_options.input_height = model_options.input_width = 8;
    model_options.input_channels = 3;
    model_options.num_classes = 4;
    model_options.hidden_units = {16};
    model_options.intra_op_threads = 1;
    return model_options;
  }

  static ImagePipelineOptions ImageInput() {
    ImagePipelineOptions input;
    input.height = input.width = 8;
    input.channels = 3;
    input.batch_size = 20;
    input.threads = 2;
    return input;
  }

  static absl::StatusOr<std::shared_ptr<const ImageShard>> ReadShard(const std::string& file) {
    ImageShardOptions shard_options;
    shard_options.num_classes = 4;
    ASSIGN_OR_RETURN(ImageShard read, ReadImageShard({file}, shard_options));
    return std::make_shared<const ImageShard>(std::move(read));
  }

  // The MLP on 8x8 RGB crops of the records in `train_file`, 4 classes,
  // fed by an ImagePipeline; evaluated on central crops of `test_file`'s,
  // streamed from another. Counts the training pipelines made in *sources.
  absl::StatusOr<TrainResult> TrainOnImages(TrainerOptions options, LocalPs* ps,
                                            const std::string& train_file,
                                            const std::string& test_file, int* sources,
                                            int threads = 2) {
    absl::StatusOr<std::unique_ptr<Model>> model = NewModel("mlp", ImageModelOptions());
    EXPECT_TRUE(model.ok()) << model.status();
    const std::vector<VariableDef> variables = (*model)->variables();
    std::vector<std::unique_ptr<Model>> models;
    models.push_back(std::move(*model));
    Towers towers(std::move(models));
    auto client = NewClient({ps}, 0, variables, absl::Seconds(60), /*stripes=*/2);
    ASSIGN_OR_RETURN(std::shared_ptr<const ImageShard> shard, ReadShard(train_file));
    ASSIGN_OR_RETURN(std::shared_ptr<const ImageShard> test, ReadShard(test_file));
    ImagePipelineOptions input = ImageInput();
    input.threads = threads;
    ImagePipelineOptions eval = input;
    eval.train = false;
    eval.shuffle = false;
    options.config = SyncConfig(1);
    options.config.set_learning_rate(0.1f);
    options.batch_size = 20;
    options.log_every_steps = 10;
    options.startup_timeout = absl::Seconds(30);
    auto source = [&]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
      ++*sources;
      return std::unique_ptr<BatchSource>(std::make_unique<ImagePipeline>(shard, input));
    };
    auto test_source = [&]() -> absl::StatusOr<std::unique_ptr<BatchSource>> {
      return std::unique_ptr<BatchSource>(std::make_unique<ImagePipeline>(test, eval));
    };
    Trainer trainer(options, &towers, client.get(), source, test_source, test->size());
    return trainer.Run();
  }

  // 200 build_image_data.py records of 16x16 generated JPEGs, 4 classes;
  // the one at `corrupt` (if any) truncated.
  std::string WriteImageRecords(const std::string& name, int corrupt = -1, int count = 200) {
    const std::string path = dir_ + "/" + name;
    auto writer = TFRecordWriter::Open(path);
    EXPECT_TRUE(writer.ok());
    for (int n = 0; n < count; ++n) {
      ImageRecord record;
      record.encoded = *EncodeJpeg(SyntheticImage(n % 4, 4, 16, 16, n + 1000 * name.size()));
      if (n == corrupt) record.encoded.resize(record.encoded.size() / 2);
      record.label = 1 + n % 4;
      EXPECT_TRUE((*writer)->Write(SerializeImageExample(record)).ok());
    }
    EXPECT_TRUE((*writer)->Close().ok());
    return path;
  }

  std::string dir_;
};

// Training batches from the image pipeline: decoded, cropped and flipped
// JPEGs train the model well above chance (0.25). The streamed evaluation
// of 190 test images (the last batch of 10 runs into the next epoch) gives
// what the final parameters give on the whole test set decoded at once.
TEST_F(LocalTrainingTest, TrainsOnDecodedImagesAndEvaluatesAStreamedTestSet) {
  LocalPs ps(0, /*stripes=*/2);
  TrainerOptions options;
  options.train_steps = 60;
  options.final_params_path = dir_ + "/final.safetensors";
  int sources = 0;
  const std::string test_file = WriteImageRecords("test_set", -1, /*count=*/190);
  absl::StatusOr<TrainResult> result =
      TrainOnImages(options, &ps, WriteImageRecords("train"), test_file, &sources);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->global_step, 60);
  EXPECT_EQ(sources, 1);
  EXPECT_GT(result->test_accuracy, 0.6);

  absl::StatusOr<std::unique_ptr<Model>> model = NewModel("mlp", ImageModelOptions());
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors(options.final_params_path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<Tensor> params;
  for (const VariableDef& v : (*model)->variables()) {
    for (auto& [name, tensor] : file->tensors) {
      if (name == v.name) params.push_back(std::move(tensor));
    }
  }
  ASSERT_EQ(params.size(), (*model)->variables().size());
  absl::StatusOr<std::shared_ptr<const ImageShard>> test = ReadShard(test_file);
  ASSERT_TRUE(test.ok()) << test.status();
  absl::StatusOr<Dataset> decoded = DecodeImageDataset(*test, ImageInput());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const Model::Evaluation all = (*model)->Evaluate(params, decoded->images, decoded->labels);
  EXPECT_EQ(all.correct, static_cast<int64_t>(std::lround(result->test_accuracy * 190)));
}

// The decoder threads change nothing: training ends at the same values, bit
// for bit, with 1 and 4 of them.
TEST_F(LocalTrainingTest, ImageTrainingDoesNotDependOnDecoderThreads) {
  const std::string train = WriteImageRecords("train");
  const std::string test = WriteImageRecords("test_set", -1, /*count=*/40);
  std::vector<SafetensorsFile> finals;
  for (int threads : {1, 4}) {
    LocalPs ps(0, /*stripes=*/2);
    TrainerOptions options;
    options.train_steps = 25;
    options.final_params_path = absl::StrCat(dir_, "/final_", threads, ".safetensors");
    int sources = 0;
    absl::StatusOr<TrainResult> result =
        TrainOnImages(options, &ps, train, test, &sources, threads);
    ASSERT_TRUE(result.ok()) << result.status();
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(options.final_params_path);
    ASSERT_TRUE(file.ok()) << file.status();
    finals.push_back(*std::move(file));
  }
  ASSERT_EQ(finals[0].tensors.size(), finals[1].tensors.size());
  for (size_t i = 0; i < finals[0].tensors.size(); ++i) {
    const Tensor& a = finals[0].tensors[i].second;
    const Tensor& b = finals[1].tensors[i].second;
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_TRUE(std::equal(a.flat().begin(), a.flat().end(), b.flat().begin()))
        << finals[0].tensors[i].first;
  }
}

// A corrupt image ends training with the pipeline's error, naming the file
// and the record.
TEST_F(LocalTrainingTest, ACorruptImageStopsTrainingNamingFileAndRecord) {
  LocalPs ps(0, /*stripes=*/2);
  TrainerOptions options;
  options.train_steps = 60;
  options.shuffle = false;
  const std::string records = WriteImageRecords("train", /*corrupt=*/150);
  int sources = 0;
  absl::StatusOr<TrainResult> result =
      TrainOnImages(options, &ps, records, WriteImageRecords("test_set"), &sources);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.status().message().find(records + ": record 150: JPEG: "),
            absl::string_view::npos)
      << result.status();
}

// The overlapped pipeline sends the same gradients of the same batches at
// the same versions: training ends at the same values, bit for bit, with
// weight decay applied layer by layer and with evaluations closing the push
// gate on their steps.
TEST_F(LocalTrainingTest, OverlappedStepsTrainExactlyLikeSequentialOnes) {
  std::vector<SafetensorsFile> finals;
  for (bool overlap : {false, true}) {
    LocalPs ps(0, /*stripes=*/2);
    TrainerOptions options;
    options.overlap_comm = overlap;
    options.train_steps = 30;
    options.weight_decay = 1e-3f;
    options.eval_every_steps = 7;
    options.final_params_path = absl::StrCat(dir_, "/final_", overlap, ".safetensors");
    absl::StatusOr<TrainResult> result = Train(options, &ps);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->global_step, 30);
    EXPECT_EQ(result->local_steps, 30);
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(options.final_params_path);
    ASSERT_TRUE(file.ok()) << file.status();
    finals.push_back(*std::move(file));
  }
  ASSERT_EQ(finals[0].tensors.size(), finals[1].tensors.size());
  for (size_t i = 0; i < finals[0].tensors.size(); ++i) {
    const Tensor& a = finals[0].tensors[i].second;
    const Tensor& b = finals[1].tensors[i].second;
    EXPECT_EQ(finals[0].tensors[i].first, finals[1].tensors[i].first);
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_TRUE(std::equal(a.flat().begin(), a.flat().end(), b.flat().begin()))
        << finals[0].tensors[i].first;
  }
}

// A shard that cannot write its checkpoints (its directory is a file, as a
// full or broken disk would fail them) stops the chief after
// max_failed_saves saves in a row, loudly, instead of training on with
// nothing to recover to; with 0 it trains on.
TEST_F(LocalTrainingTest, SavesThatCannotBeWrittenStopTheJob) {
  const std::string not_a_dir = dir_ + "/file";
  ASSERT_EQ(std::system(("touch " + not_a_dir).c_str()), 0);
  ParameterShard::Options shard_options;
  shard_options.checkpoint_dir = not_a_dir;
  {
    LocalPs ps(0, /*stripes=*/2, nullptr, shard_options);
    TrainerOptions options;
    options.train_steps = 100;
    options.save_checkpoint_steps = 5;
    options.max_failed_saves = 3;
    absl::StatusOr<TrainResult> result = Train(options, &ps);
    ASSERT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << result.status();
    EXPECT_NE(result.status().message().find("3 checkpoints in a row could not be written "
                                             "(the last, checkpoint 10"),
              absl::string_view::npos)
        << result.status();
    EXPECT_NE(result.status().message().find(not_a_dir), absl::string_view::npos)
        << result.status();
    // Training stopped there: the chief never ended it.
    EXPECT_FALSE(ps.shard(0).GetStatus().training_done());
    EXPECT_LE(ps.shard(0).GetStatus().version(), 10);
  }
  LocalPs ps(0, /*stripes=*/2, nullptr, shard_options);
  TrainerOptions options;
  options.train_steps = 20;
  options.save_checkpoint_steps = 5;
  options.max_failed_saves = 0;
  absl::StatusOr<TrainResult> result = Train(options, &ps);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->global_step, 20);
}

// Every checkpoint names its run; a ps task whose stripes restored files of
// two runs (a checkpoint directory shared with another job) is refused with
// both runs named, instead of training on a mix of two models.
TEST_F(LocalTrainingTest, ShardsHoldingCheckpointsOfDifferentRunsAreNeverConfirmedTogether) {
  std::vector<std::string> runs;
  for (const std::string run : {"a", "b"}) {
    ParameterShard::Options shard_options;
    shard_options.checkpoint_dir = dir_ + "/" + run;
    ASSERT_EQ(std::system(("mkdir " + shard_options.checkpoint_dir).c_str()), 0);
    LocalPs ps(0, /*stripes=*/2, nullptr, shard_options);
    TrainerOptions options;
    options.train_steps = 5;
    options.save_checkpoint_steps = 5;
    ASSERT_TRUE(Train(options, &ps).ok());
    runs.push_back(ps.shard(0).GetStatus().config().run_id());
    EXPECT_EQ(runs.back().size(), 16u);
    EXPECT_EQ(ps.shard(1).GetStatus().config().run_id(), runs.back());
    absl::StatusOr<SafetensorsFile> file = ReadSafetensors(
        shard_options.checkpoint_dir + "/model.ckpt-5.ps-1-of-2.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_NE(file->metadata["header"].find(runs.back()), std::string::npos);
  }
  ASSERT_NE(runs[0], runs[1]);

  // Stripe 0's files from run a, stripe 1's from run b, both at step 5.
  const std::string mixed = dir_ + "/mixed";
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", mixed, " && cp ", dir_, "/a/*ps-0-of-2* ",
                                     dir_, "/b/*ps-1-of-2* ", mixed)
                            .c_str()),
            0);
  ParameterShard::Options shard_options;
  shard_options.checkpoint_dir = mixed;
  shard_options.restore_at_start = true;
  LocalPs ps(0, /*stripes=*/2, nullptr, shard_options);
  for (int stripe = 0; stripe < 2; ++stripe) {
    ASSERT_TRUE(ps.shard(stripe).RestoreLatest().ok());
    ASSERT_EQ(ps.shard(stripe).GetStatus().restored_step(), 5);
  }
  TrainerOptions options;
  options.train_steps = 10;
  absl::StatusOr<TrainResult> result = Train(options, &ps);
  ASSERT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
  EXPECT_NE(result.status().message().find("different training runs"), absl::string_view::npos)
      << result.status();
  EXPECT_NE(result.status().message().find(runs[0]), absl::string_view::npos);
  EXPECT_NE(result.status().message().find(runs[1]), absl::string_view::npos);
  EXPECT_FALSE(ps.shard(0).GetStatus().ready());
}

}  // namespace
}  // namespace psrt
