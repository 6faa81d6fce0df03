// Multi-process tests: real psrt_ps and psrt_worker processes talking gRPC on
// 127.0.0.1, started by scripts/launch.sh (or by hand, for TF_CONFIG), on the
// real Fashion-MNIST data that scripts/setup.sh installs.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <regex>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/safetensors.h"
#include "common/tfrecord.h"
#include "proto/event.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

using ClusterTest = ClusterFixture;

TEST_F(ClusterTest, SyncTrainingWithTwoPsAndTwoWorkers) {
  const std::string spec = MakeSpec(2, 2);
  CommandResult r = Launch(spec, dir_ + "/logs",
                           "--sync_replicas --train_steps=300 --optimizer=momentum "
                           "--learning_rate=0.02 --log_every_steps=100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/logs/worker-0.log"), &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 300);
  EXPECT_GE(accuracy, 0.75);
  // Both shards moved in lockstep to exactly the final step, and exited.
  for (int k = 0; k < 2; ++k) {
    const std::string log = ReadFile(absl::StrCat(dir_, "/logs/ps-", k, ".log"));
    EXPECT_NE(log.find("done: 300 versions"), std::string::npos) << log;
  }
  EXPECT_NE(ReadFile(dir_ + "/logs/worker-1.log").find("global step 300"), std::string::npos);
}

TEST_F(ClusterTest, AsyncTrainingWithTwoPsAndTwoWorkers) {
  const std::string spec = MakeSpec(2, 2);
  CommandResult r = Launch(spec, dir_ + "/logs",
                           "--train_steps=400 --optimizer=momentum "
                           "--learning_rate=0.01 --log_every_steps=100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/logs/worker-0.log"), &step, &accuracy)) << r.output;
  EXPECT_GE(step, 400);
  EXPECT_GE(accuracy, 0.7);
}

TEST_F(ClusterTest, BackupWorkersDoNotBlockSyncTraining) {
  // 3 workers, 2 gradients aggregated per step: the third is a backup.
  const std::string spec = MakeSpec(1, 3);
  CommandResult r = Launch(spec, dir_ + "/logs",
                           "--sync_replicas --replicas_to_aggregate=2 --train_steps=200 "
                           "--learning_rate=0.1 --log_every_steps=100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/logs/worker-0.log"), &step, &accuracy));
  EXPECT_EQ(step, 200);
  EXPECT_NE(ReadFile(dir_ + "/logs/ps-0.log").find("done: 200 versions"), std::string::npos);
}

// The proof that synchronous distribution is exact: 2 workers with batch B in
// fully synchronous mode end with the same parameters as 1 worker with batch
// 2B on the same examples (plain SGD, fixed data order).
TEST_F(ClusterTest, SyncTwoWorkersEqualOneWorkerOnTheCombinedBatch) {
  const std::string flags =
      "--sync_replicas --optimizer=sgd --learning_rate=0.1 --train_steps=40 "
      "--noshuffle --partition_threshold_bytes=100000 --hidden_units=64";
  // The two workers reach the shards over their Unix sockets, the one
  // worker over TCP only: the transport changes nothing.
  const std::string two = MakeSpec(2, 2, "two.json");
  CommandResult r2 = Launch(two, dir_ + "/two",
                            flags + " --unix_socket --batch_size=50 --final_params_out=" +
                                dir_ + "/two.safetensors",
                            "--ps_flags --unix_socket");
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_NE(ReadFile(dir_ + "/two/worker-1.log").find(") over unix-abstract:psrt-"),
            std::string::npos);
  const std::string one = MakeSpec(2, 1, "one.json");
  CommandResult r1 = Launch(one, dir_ + "/one",
                            flags + " --batch_size=100 --final_params_out=" + dir_ + "/one.safetensors",
                            "--ps_flags --local_data_plane=false");
  ASSERT_EQ(r1.exit_code, 0) << r1.output;

  auto a = ReadSafetensors(dir_ + "/two.safetensors");
  auto b = ReadSafetensors(dir_ + "/one.safetensors");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->metadata["global_step"], "40");
  ASSERT_EQ(a->tensors.size(), b->tensors.size());
  ASSERT_EQ(a->tensors.size(), 4u);
  for (size_t i = 0; i < a->tensors.size(); ++i) {
    const Tensor& x = a->tensors[i].second;
    const Tensor& y = b->tensors[i].second;
    ASSERT_EQ(x.shape(), y.shape()) << a->tensors[i].first;
    double max_diff = 0, max_abs = 0;
    for (int64_t j = 0; j < x.num_elements(); ++j) {
      max_diff = std::max(max_diff, double(std::fabs(x.data()[j] - y.data()[j])));
      max_abs = std::max(max_abs, double(std::fabs(y.data()[j])));
    }
    EXPECT_LE(max_diff, 1e-5 * std::max(1.0, max_abs)) << a->tensors[i].first;
  }
  // Training moved the parameters: this is not two copies of the initial state.
  CommandResult r0 = Launch(one, dir_ + "/zero",
                            flags + " --train_steps=0 --final_params_out=" + dir_ + "/zero.safetensors");
  ASSERT_EQ(r0.exit_code, 0) << r0.output;
  auto initial = ReadSafetensors(dir_ + "/zero.safetensors");
  ASSERT_TRUE(initial.ok()) << initial.status();
  double moved = 0;
  const Tensor& w0 = initial->tensors[0].second;
  const Tensor& w1 = b->tensors[0].second;
  for (int64_t j = 0; j < w0.num_elements(); ++j) {
    moved = std::max(moved, double(std::fabs(w0.data()[j] - w1.data()[j])));
  }
  EXPECT_GT(moved, 1e-3);
}

TEST_F(ClusterTest, BoundedStalenessKeepsWorkersWithinOneStep) {
  // Asynchronous with staleness 0: every worker waits for the others after
  // each step, so their step counts end at most one apart.
  const std::string spec = MakeSpec(1, 2);
  CommandResult r = Launch(spec, dir_ + "/logs",
                           "--staleness=0 --train_steps=200 --learning_rate=0.05 "
                           "--log_every_steps=50");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  static const std::regex kSteps(R"(finished: (\d+) local steps)");
  long steps[2];
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(absl::StrCat(dir_, "/logs/worker-", w, ".log"));
    ASSERT_TRUE(std::regex_search(log, m, kSteps)) << log;
    steps[w] = std::stol(m[1]);
  }
  EXPECT_GE(steps[0] + steps[1], 200);
  EXPECT_LE(std::abs(steps[0] - steps[1]), 1) << steps[0] << " vs " << steps[1];
}

TEST_F(ClusterTest, EvaluatorTaskAndTfRecordInputAndTensorBoardEvents) {
  // TFRecords made by the converter (the 10000 test images, for speed).
  CommandResult convert = RunCommand(absl::StrCat(
      "PSRT_BIN_DIR=", bin_, " ", source_, "/scripts/idx_to_tfrecord.sh --out_dir ", dir_,
      "/tfr"));
  ASSERT_EQ(convert.exit_code, 0) << convert.output;
  const std::string data = dir_ + "/tfr/test.tfrecords";
  // A TF_CONFIG-shaped spec with an evaluator task.
  std::string spec = ReadFile(MakeSpec(1, 3));
  spec = std::regex_replace(spec, std::regex(R"(("worker": \[[^,]*, [^,]*), ([^\]]*)\])"),
                            "$1], \"evaluator\": [$2]");
  std::ofstream(dir_ + "/eval.json") << spec;
  CommandResult r = Launch(dir_ + "/eval.json", dir_ + "/logs",
                           absl::StrCat("--sync_replicas --train_steps=300 --eval_every_steps=100 "
                                        "--learning_rate=0.1 --moving_average_decay=0.99 "
                                        "--eval_moving_average --train_data=", data,
                                        " --test_data=", data, " --logdir=", dir_, "/tb"));
  ASSERT_EQ(r.exit_code, 0) << spec << r.output;
  const std::string evaluator = ReadFile(dir_ + "/logs/evaluator-0.log");
  EXPECT_NE(evaluator.find("eval: step 300, test_accuracy"), std::string::npos) << evaluator;
  EXPECT_NE(evaluator.find("(moving averages)"), std::string::npos);
  EXPECT_NE(ReadFile(dir_ + "/logs/worker-0.log").find("10000 training examples"),
            std::string::npos);

  // The chief's and the evaluator's event files hold the scalars.
  for (const std::string sub : {"/tb", "/tb/eval"}) {
    CommandResult files = RunCommand("ls " + dir_ + sub + "/events.out.tfevents.*");
    ASSERT_EQ(files.exit_code, 0) << files.output;
    auto reader = TFRecordReader::Open(files.output.substr(0, files.output.find('\n')));
    ASSERT_TRUE(reader.ok()) << reader.status();
    std::set<std::string> tags;
    std::string record;
    while (true) {
      auto more = (*reader)->ReadRecord(&record);
      ASSERT_TRUE(more.ok()) << more.status();
      if (!*more) break;
      tf::Event event;
      ASSERT_TRUE(event.ParseFromString(record));
      for (const auto& value : event.summary().value()) tags.insert(value.tag());
    }
    EXPECT_EQ(tags.count("eval/accuracy"), 1u) << sub;
    if (sub == "/tb") {
      for (const char* tag : {"loss", "learning_rate", "examples_per_sec",
                              "stale_gradients_dropped"}) {
        EXPECT_EQ(tags.count(tag), 1u) << tag;
      }
    }
  }
}

TEST_F(ClusterTest, MalformedSpecIsRefusedBeforeAnythingStarts) {
  const std::string spec = dir_ + "/bad.json";
  std::ofstream(spec) << R"({"ps": ["127.0.0.1:99999"], "worker": ["127.0.0.1:2223"]})";
  CommandResult r = Launch(spec, dir_ + "/logs", "--train_steps=10");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(spec), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("99999"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("started"), std::string::npos) << r.output;
}

TEST_F(ClusterTest, FailingTaskStopsTheClusterAndIsNamed) {
  const std::string spec = MakeSpec(1, 2);
  const absl::Time start = absl::Now();
  CommandResult r = Launch(spec, dir_ + "/logs", "--train_steps=10 --optimizer=bogus");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("failed with exit code 1"), std::string::npos) << r.output;
  EXPECT_TRUE(r.output.find("task worker/0") != std::string::npos ||
              r.output.find("task worker/1") != std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bogus"), std::string::npos) << r.output;
  // The parameter server was stopped rather than left waiting.
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

TEST_F(ClusterTest, SyntheticDataTrainsAModelOfAnotherSizeAndRealDataOfTheWrongSizeIsNamed) {
  const std::string spec = MakeSpec(1, 1);
  CommandResult r = Launch(spec, dir_ + "/logs",
                           "--model=lenet --input_height=32 --input_width=32 --synthetic_data "
                           "--batch_size=16 --train_steps=20 --log_every_steps=10");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/logs/worker-0.log"), &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 20);

  // The same model on Fashion-MNIST's 28x28 images: refused at start,
  // naming both sizes and the data.
  r = Launch(spec, dir_ + "/logs2", "--model=lenet --input_height=32 --input_width=32 "
                                    "--train_steps=20");
  EXPECT_NE(r.exit_code, 0) << r.output;
  const std::string log = ReadFile(dir_ + "/logs2/worker-0.log");
  EXPECT_NE(log.find("784 values (28x28)"), std::string::npos) << log;
  EXPECT_NE(log.find("built for 32x32x1"), std::string::npos) << log;
  EXPECT_NE(log.find("fashion-mnist"), std::string::npos) << log;
}

// Describing a model is a question about the model alone: no cluster spec,
// no TF_CONFIG, no device.
TEST_F(ClusterTest, DescribeModelNeedsNoCluster) {
  CommandResult r = RunCommand(absl::StrCat("env -u TF_CONFIG ", bin_,
                                            "/psrt_worker --describe_model --model=mlp "
                                            "--hidden_units=8 --device=cpu 2>&1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // 784x8 + 8 + 8x10 + 10.
  EXPECT_NE(r.output.find("params=6370"), std::string::npos) << r.output;
}

// torchvision's resnet50 has 25,557,032 parameters; Keras's count_params()
// would add a moving mean and variance for each of its batch norms' 26,560
// channels (53,120 values).
TEST_F(ClusterTest, DescribeModelCountsResnet50AsTorchvisionAndKeras) {
  CommandResult r = RunCommand(absl::StrCat(
      "env -u TF_CONFIG ", bin_,
      "/psrt_worker --describe_model --model=resnet50 --num_classes=1000 --input_height=224 "
      "--input_width=224 --input_channels=3 --device=cpu 2>&1 | tail -n 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "params_with_moving_statistics=25610152\nparams=25557032\n");
}

// The Keras MNIST tutorial's convnet, as Keras 3 wrote it, trained by a
// cluster on Fashion-MNIST: its shape and classes come from the file.
TEST_F(ClusterTest, AKerasModelFileTrainsAboveChance) {
  const std::string spec = MakeSpec(1, 2);
  CommandResult r = Launch(spec, dir_ + "/logs",
                           absl::StrCat("--model_file=", PSRT_SOURCE_DIR,
                                        "/tests/data/keras/mnist_convnet_keras3.json "
                                        "--sync_replicas --train_steps=200 --optimizer=momentum "
                                        "--learning_rate=0.05 --log_every_steps=100"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(ReadFile(dir_ + "/logs/worker-0.log"), &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 200);
  EXPECT_GE(accuracy, 0.6);  // Chance is 0.1; 500 steps reach 0.86.
  // A flag that disagrees with the file is named before anything trains.
  CommandResult wrong = RunCommand(absl::StrCat(
      "env -u TF_CONFIG ", bin_, "/psrt_worker --describe_model --device=cpu --model_file=",
      PSRT_SOURCE_DIR, "/tests/data/keras/mnist_convnet_keras3.json --num_classes=5 2>&1"));
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("--num_classes=5, but the model file"), std::string::npos)
      << wrong.output;
}

TEST_F(ClusterTest, TasksStartedByHandFromTfConfig) {
  const std::string spec = MakeSpec(1, 1);
  std::string cluster = ReadFile(spec);
  cluster.erase(std::remove(cluster.begin(), cluster.end(), '\n'), cluster.end());
  auto tf_config = [&](const std::string& type) {
    return absl::StrCat("TF_CONFIG='{\"cluster\": ", cluster, ", \"task\": {\"type\": \"",
                        type, "\", \"index\": 0}}' ");
  };
  const std::string ps = absl::StrCat(tf_config("ps"), bin_, "/psrt_ps > ", dir_,
                                      "/ps.log 2>&1 & echo $! > ", dir_, "/ps.pid");
  RunCommand(ps);
  // Never leave the ps running, whatever happens below.
  struct StopPs {
    std::string pid_file;
    ~StopPs() { RunCommand("kill $(cat " + pid_file + ") 2>/dev/null"); }
  } stop_ps{dir_ + "/ps.pid"};
  // --task_index alone overrides TF_CONFIG's index (it used to be ignored:
  // this worker then ran as worker/0).
  CommandResult other_index = RunCommand(
      absl::StrCat(tf_config("worker"), "timeout 60 ", bin_, "/psrt_worker --task_index=4 2>&1"));
  EXPECT_NE(other_index.exit_code, 0) << other_index.output;
  EXPECT_NE(other_index.output.find(
                "task worker/4: index 4 out of range for job \"worker\" (valid range 0..0)"),
            std::string::npos)
      << other_index.output;
  CommandResult worker = RunCommand(absl::StrCat(
      tf_config("worker"), "timeout 120 ", bin_,
      "/psrt_worker --sync_replicas --train_steps=50 --log_every_steps=25"));
  ASSERT_EQ(worker.exit_code, 0) << worker.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(worker.output, &step, &accuracy)) << worker.output;
  EXPECT_EQ(step, 50);
  // The ps exits by itself once the only worker said goodbye.
  for (int i = 0; i < 100 && ReadFile(dir_ + "/ps.log").find("done:") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_NE(ReadFile(dir_ + "/ps.log").find("done: 50 versions"), std::string::npos);
}

}  // namespace
}  // namespace psrt
