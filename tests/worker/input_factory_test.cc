#include "worker/input/input_factory.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

InputOptions Synthetic() {
  InputOptions options;
  options.synthetic = true;
  options.batch_size = 10;
  options.model = "lenet";
  return options;
}

TEST(InputFactoryTest, EachReplicaOpensWhatItReads) {
  // The chief trains and evaluates, another replica only trains, the
  // evaluator only evaluates.
  absl::StatusOr<WorkerInput> chief = OpenWorkerInput(Synthetic(), 0, 3);
  ASSERT_TRUE(chief.ok()) << chief.status();
  EXPECT_FALSE(chief->streamed);
  EXPECT_EQ(chief->train.size(), 10);
  EXPECT_EQ(chief->train_examples, 10);
  EXPECT_EQ(chief->test.size(), 10);
  EXPECT_EQ(chief->train.images.dim(1), 28 * 28);

  absl::StatusOr<WorkerInput> replica = OpenWorkerInput(Synthetic(), 2, 3);
  ASSERT_TRUE(replica.ok()) << replica.status();
  EXPECT_EQ(replica->train.size(), 10);
  EXPECT_EQ(replica->test.size(), 0);

  absl::StatusOr<WorkerInput> evaluator = OpenWorkerInput(Synthetic(), -1, 3);
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  EXPECT_EQ(evaluator->train.size(), 0);
  EXPECT_EQ(evaluator->test.size(), 10);
}

TEST(InputFactoryTest, ReadsIdxFilesAndRefusesAnotherImageSize) {
  InputOptions options;
  options.data_dir = kFashionMnistDir;
  options.model = "lenet";
  absl::StatusOr<WorkerInput> input = OpenWorkerInput(options, 1, 2);
  if (absl::IsNotFound(input.status())) GTEST_SKIP() << kFashionMnistDir << " is missing";
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->train_examples, 60000);
  EXPECT_EQ(input->test.size(), 0);  // Replica 1 does not evaluate.

  // --pixel_range=0-255: the file's bytes themselves.
  InputOptions bytes = options;
  bytes.pixel_max = 255;
  absl::StatusOr<WorkerInput> unscaled = OpenWorkerInput(bytes, 1, 2);
  ASSERT_TRUE(unscaled.ok()) << unscaled.status();
  const absl::Span<const float> unit = input->train.images.flat();
  const absl::Span<const float> byte = unscaled->train.images.flat();
  ASSERT_EQ(unit.size(), byte.size());
  float brightest = 0;
  int64_t off = 0;  // Values not a byte, or not the 0-1 value times 255.
  for (size_t i = 0; i < unit.size(); ++i) {
    off += byte[i] != std::round(byte[i]) || std::abs(byte[i] / 255 - unit[i]) > 1e-7f;
    brightest = std::max(brightest, byte[i]);
  }
  EXPECT_EQ(off, 0);
  EXPECT_EQ(brightest, 255);

  options.height = options.width = 32;
  input = OpenWorkerInput(options, 0, 2);
  ASSERT_FALSE(input.ok());
  EXPECT_THAT(std::string(input.status().message()),
              HasSubstr(std::string(kFashionMnistDir) + " holds images of 784 values (28x28), "
                        "but --model=lenet is built for 32x32x1"));
}

TEST(InputFactoryTest, BadChoicesNameTheirFlag) {
  EXPECT_THAT(std::string(ParseInputFormat("jpeg").status().message()),
              HasSubstr("--data_format: \"jpeg\""));
  EXPECT_EQ(*ParseInputFormat("images"), InputOptions::Format::kImages);
  InputOptions images = Synthetic();
  images.format = InputOptions::Format::kImages;
  EXPECT_THAT(std::string(OpenWorkerInput(images, 0, 1).status().message()),
              HasSubstr("--data_format=images reads no --synthetic_data"));
  InputOptions missing;
  missing.format = InputOptions::Format::kImages;
  missing.channels = 3;
  EXPECT_THAT(std::string(OpenWorkerInput(missing, 0, 1).status().message()),
              HasSubstr("image records need both --train_data and --test_data"));
  missing.channels = 2;
  EXPECT_THAT(std::string(OpenWorkerInput(missing, 0, 1).status().message()),
              HasSubstr("--input_channels=2"));
}

}  // namespace
}  // namespace psrt
