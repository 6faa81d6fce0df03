#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "models/model.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;

TEST(ModelRegistryTest, MakesMlp) {
  ModelOptions options;
  options.hidden_units = {8};
  absl::StatusOr<std::unique_ptr<Model>> model = NewModel("mlp", options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->variables().front().name, "hidden1/weights");
  EXPECT_EQ((*model)->variables().front().shape, (Shape{784, 8}));
}

TEST(ModelRegistryTest, MakesTheConvolutionalModels) {
  ModelOptions options;
  for (const char* name : {"lenet", "inception_mini"}) {
    absl::StatusOr<std::unique_ptr<Model>> model = NewModel(name, options);
    ASSERT_TRUE(model.ok()) << name << ": " << model.status();
  }
  EXPECT_EQ((*NewModel("lenet", options))->variables().front().name,
            "conv1/weights");
  options.input_height = options.input_width = 299;
  options.input_channels = 3;
  absl::StatusOr<std::unique_ptr<Model>> v3 = NewModel("inception_v3", options);
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ((*v3)->variables().front().shape, (Shape{3, 3, 3, 32}));
}

TEST(ModelRegistryTest, UnknownNameListsKnownModels) {
  absl::StatusOr<std::unique_ptr<Model>> model = NewModel("resnet18", ModelOptions());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("unknown model \"resnet18\""));
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("mlp, lenet, inception_mini, inception_v3, resnet50, resnet101, vgg16, "
                        "alexnet, wide_deep, dlrm"));
}

TEST(ModelRegistryTest, PassesOptionErrorsThrough) {
  ModelOptions options;
  options.num_classes = 0;
  EXPECT_EQ(NewModel("mlp", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace psrt
