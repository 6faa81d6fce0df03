// Trained models back to Keras and back, with real clusters on 127.0.0.1:
// a Functional Keras file with batch norms trains through 1 ps + 2 workers,
// its checkpoint (moving statistics included) is exported as Keras's
// .weights.h5 (psrt_export_checkpoint --keras_weights), and a new job
// started from that file (--init_from_keras_weights) holds exactly the
// trained values; a weights file of another model is refused by name.
// (Keras's own side, which needs Python: scripts/keras_round_trip.sh.)
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

class KerasRoundTripTest : public ClusterFixture {
 protected:
  std::string Keras(const std::string& name) const {
    return absl::StrCat(source_, "/tests/data/keras/", name);
  }
  // A job of the residual block (16x16x3 images, 5 classes) on random images.
  std::string Flags(const std::string& more) const {
    return absl::StrCat("--model_file=", Keras("residual_block_keras3.json"),
                        " --synthetic_data --batch_size=16 --optimizer=momentum "
                        "--learning_rate=0.05 ",
                        more);
  }
};

TEST_F(KerasRoundTripTest, ExportedWeightsStartAJobAtTheTrainedValues) {
  const std::string trained = dir_ + "/trained.safetensors";
  CommandResult r = Launch(MakeSpec(1, 2), dir_ + "/train",
                           Flags("--sync_replicas --train_steps=20 --save_checkpoint_steps=20 "
                                 "--final_params_out=" + trained),
                           "--checkpoint_dir " + dir_ + "/ckpt");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The checkpoint holds the batch norms' moving statistics, moved by training.
  absl::StatusOr<SafetensorsFile> params = ReadSafetensors(trained);
  ASSERT_TRUE(params.ok()) << params.status();
  int statistics = 0;
  for (const auto& [name, tensor] : params->tensors) {
    if (name.find("/moving_mean") == std::string::npos) continue;
    ++statistics;
    double sum = 0;
    for (float x : tensor.flat()) sum += std::fabs(x);
    EXPECT_GT(sum, 0) << name << " still holds its initial zeros";
  }
  EXPECT_EQ(statistics, 4);

  const std::string weights = dir_ + "/model.weights.h5";
  r = RunCommand(absl::StrCat(bin_, "/psrt_export_checkpoint --checkpoint_dir=", dir_,
                              "/ckpt --keras_weights=", weights,
                              " --model_file=", Keras("residual_block_keras3.json"), " 2>&1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("(step 20)"));

  // Another model's file: refused by name, and the --out beside it is not
  // written either.
  const std::string refused = dir_ + "/refused.safetensors";
  r = RunCommand(absl::StrCat(bin_, "/psrt_export_checkpoint --checkpoint_dir=", dir_,
                              "/ckpt --keras_weights=", dir_, "/refused.weights.h5 --out=", refused,
                              " --model_file=", Keras("plain_cnn_keras3.json"), " 2>&1"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("plain_cnn_keras3.json"));
  EXPECT_FALSE(std::filesystem::exists(refused)) << r.output;

  const std::string started = dir_ + "/started.safetensors";
  r = Launch(MakeSpec(1, 1, "one.json"), dir_ + "/start",
             Flags("--train_steps=0 --init_from_keras_weights=" + weights +
                   " --final_params_out=" + started));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(MaxAbsDiff(trained, started), 0.0);

  // Another model's weights: the chief refuses them, naming the layer and file.
  r = Launch(MakeSpec(1, 1, "other.json"), dir_ + "/other",
             Flags("--train_steps=5 --init_from_keras_weights=" +
                   Keras("plain_cnn_keras3.weights.h5")));
  EXPECT_NE(r.exit_code, 0);
  const std::string chief = ReadFile(dir_ + "/other/worker-0.log");
  EXPECT_THAT(chief, HasSubstr("plain_cnn_keras3.weights.h5"));
  EXPECT_THAT(chief, HasSubstr("layer \""));
}

}  // namespace
}  // namespace psrt
