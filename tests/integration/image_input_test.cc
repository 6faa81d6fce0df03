// Multi-process tests of image input: generated JPEG folders converted by
// scripts/images_to_tfrecord.sh, read by real psrt_worker processes (1 ps +
// 2 workers through scripts/launch.sh) with their own decoder threads.
#include <string>

#include "absl/strings/str_cat.h"
#include "common/tfrecord.h"
#include "gtest/gtest.h"
#include "proto/example.pb.h"
#include "tests/integration/cluster_fixture.h"

namespace psrt {
namespace {

class ImageInputTest : public ClusterFixture {
 protected:
  // 4 classes of 60 24x24 JPEGs, as 4 train shards and a 20% validation
  // split under dir_/records.
  void Convert() {
    CommandResult r = RunCommand(absl::StrCat(
        bin_, "/psrt_make_images --out=", dir_, "/images --classes=4 --per_class=60 --size=24",
        " && PSRT_BIN_DIR=", bin_, " ", source_, "/scripts/images_to_tfrecord.sh --in ", dir_,
        "/images --out ", dir_, "/records --train_shards 4 --validation_percent 20"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  std::string Flags(const std::string& train_data) {
    return absl::StrCat(
        "--sync_replicas --model=mlp --hidden_units=32 --num_classes=4 --train_data='",
        train_data, "' --test_data='", dir_, "/records/validation-*' --input_height=16 ",
        "--input_width=16 --input_channels=3 --input_threads=1 --batch_size=16 ",
        "--train_steps=100 --learning_rate=0.1 --log_every_steps=50 --progress=log");
  }
};

// With the images left on disk (--input_cache=disk): the same input path
// but for where the JPEG bytes come from.
TEST_F(ImageInputTest, TwoWorkersTrainOnConvertedJpegsShardedByFile) {
  Convert();
  CommandResult r = Launch(MakeSpec(1, 2), dir_ + "/logs",
                           Flags(dir_ + "/records/train-*") + " --input_cache=disk");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string chief = ReadFile(dir_ + "/logs/worker-0.log");
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(chief, &step, &accuracy)) << chief;
  EXPECT_EQ(step, 100);
  EXPECT_GE(accuracy, 0.6);  // Chance: 0.25.
  // 192 training images in 4 files: 2 files, 96 images, per worker.
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(absl::StrCat(dir_, "/logs/worker-", w, ".log"));
    EXPECT_NE(log.find(absl::StrCat("input: 96 image records in 2 file(s) for replica ", w)),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("input wait "), std::string::npos) << log;
    EXPECT_NE(log.find("input_ms="), std::string::npos) << log;
  }
}

// A record that is not an image: by default the worker that reads it stops,
// naming the file and record; with --corrupt_images=skip training goes on
// and the worker counts it.
TEST_F(ImageInputTest, ACorruptImageStopsTheJobOrIsSkipped) {
  Convert();
  {
    auto writer = TFRecordWriter::Open(dir_ + "/bad");
    ASSERT_TRUE(writer.ok()) << writer.status();
    tf::Example example;
    auto& features = *example.mutable_features()->mutable_feature();
    features["image/encoded"].mutable_bytes_list()->add_value("not a picture");
    features["image/class/label"].mutable_int64_list()->add_value(2);
    ASSERT_TRUE((*writer)->Write(example.SerializeAsString()).ok());
    ASSERT_TRUE((*writer)->Close().ok());
  }
  // Files 0..3 the shards, 4 the bad one: worker 0 reads 0, 2 and 4.
  const std::string data = absl::StrCat(dir_, "/records/train-*,", dir_, "/bad");
  CommandResult stop = Launch(MakeSpec(1, 2), dir_ + "/stop", Flags(data));
  EXPECT_NE(stop.exit_code, 0) << stop.output;
  const std::string stopped = ReadFile(dir_ + "/stop/worker-0.log");
  EXPECT_NE(stopped.find(dir_ + "/bad: record 0: not a JPEG or PNG image (13 bytes"),
            std::string::npos)
      << stopped;

  CommandResult skip =
      Launch(MakeSpec(1, 2), dir_ + "/skip", Flags(data) + " --corrupt_images=skip");
  ASSERT_EQ(skip.exit_code, 0) << skip.output;
  const std::string skipped = ReadFile(dir_ + "/skip/worker-0.log");
  EXPECT_NE(skipped.find("input: 1 corrupt image(s) of 97 skipped"), std::string::npos)
      << skipped;
  long step = 0;
  double accuracy = 0;
  EXPECT_TRUE(ParseFinal(skipped, &step, &accuracy)) << skipped;
}

// The ResNet example, shortened: ResNet-50 at 64x64 through the image
// pipeline, 1 ps + 2 workers, sync (150 steps reach about 0.86).
TEST_F(ImageInputTest, TheResnetExampleTrainsAboveChance) {
  CommandResult r = RunCommand(absl::StrCat(
      "PSRT_SKIP_SETUP=1 PSRT_BIN_DIR=", bin_, " PSRT_LOGDIR=", dir_, "/resnet ", source_,
      "/scripts/run_resnet_example.sh --train_steps=100 --eval_every_steps=100 2>&1 | tail -n 1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  long step = 0;
  double accuracy = 0;
  ASSERT_TRUE(ParseFinal(r.output, &step, &accuracy)) << r.output;
  EXPECT_EQ(step, 100);
  EXPECT_GE(accuracy, 0.3);  // Chance: 0.125; 0.38 at step 80, 0.86 at 150.
}

}  // namespace
}  // namespace psrt
