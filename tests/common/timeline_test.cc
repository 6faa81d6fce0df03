#include "common/timeline.h"

#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(TimelineTest, WritesChromeTraceEventsFromAnyThread) {
  const std::string path = testing::TempDir() + "timeline_test.json";
  {
    auto timeline = Timeline::Open(path, /*pid=*/3);
    ASSERT_TRUE(timeline.ok()) << timeline.status();
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        for (int step = 0; step < 50; ++step) {
          Timeline::Span span(timeline->get(), t == 0 ? "compute" : "reduce_scatter",
                              t == 0 ? "step" : "allreduce", step);
        }
      });
    }
    for (auto& thread : threads) thread.join();
    { Timeline::Span nothing(nullptr, "ignored", "step", 0); }
    ASSERT_TRUE((*timeline)->Close().ok());
    (*timeline)->Record("after close", "step", absl::Now(), absl::Now(), 0);  // Dropped.
  }
  // The file is one JSON array: 2 row names and 100 complete events.
  google::protobuf::ListValue events;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(path), &events).ok())
      << ReadFile(path);
  ASSERT_EQ(events.values_size(), 102);
  int compute = 0, named = 0;
  for (const google::protobuf::Value& value : events.values()) {
    const auto& fields = value.struct_value().fields();
    EXPECT_EQ(fields.at("pid").number_value(), 3);
    if (fields.at("ph").string_value() == "M") {
      ++named;
      continue;
    }
    EXPECT_EQ(fields.at("ph").string_value(), "X");
    EXPECT_GE(fields.at("ts").number_value(), 0);
    EXPECT_GE(fields.at("dur").number_value(), 0);
    if (fields.at("name").string_value() == "compute") {
      ++compute;
      EXPECT_EQ(fields.at("cat").string_value(), "step");
    }
  }
  EXPECT_EQ(named, 2);
  EXPECT_EQ(compute, 50);
}

TEST(TimelineTest, AnUnwritablePathIsNamed) {
  auto timeline = Timeline::Open("/nonexistent-dir/trace.json", 0);
  ASSERT_FALSE(timeline.ok());
  EXPECT_NE(timeline.status().message().find("/nonexistent-dir/trace.json"), std::string::npos);
}

}  // namespace
}  // namespace psrt
