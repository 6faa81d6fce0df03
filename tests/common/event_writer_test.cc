#include "common/event_writer.h"

#include <dirent.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tfrecord.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/event.pb.h"

namespace psrt {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;
using ::testing::StartsWith;

// A fresh log directory per test (not created: Open must create it).
std::string LogDir(const std::string& name = "logs") {
  const auto* info = testing::UnitTest::GetInstance()->current_test_info();
  const std::string dir = absl::StrCat(testing::TempDir(), "/event_writer_test_",
                                       info->name(), "_", ::getpid());
  ::mkdir(dir.c_str(), 0755);
  return dir + "/" + name;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

// Reads an event file back with the TFRecord reader.
std::vector<tf::Event> ReadEvents(const std::string& path) {
  std::vector<tf::Event> events;
  absl::StatusOr<std::vector<std::string>> records = ReadTFRecordFile(path);
  EXPECT_TRUE(records.ok()) << records.status();
  if (!records.ok()) return events;
  for (const std::string& r : *records) {
    events.emplace_back();
    EXPECT_TRUE(events.back().ParseFromString(r));
  }
  return events;
}

TEST(EventWriterTest, WritesVersionThenScalars) {
  const std::string logdir = LogDir("nested/run1");
  const double before = std::chrono::duration<double>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  auto writer = EventWriter::Open(logdir);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->WriteScalar("loss", 100, 2.5f).ok());
  ASSERT_TRUE((*writer)->WriteScalar("loss", 200, 0.75f).ok());
  ASSERT_TRUE((*writer)->WriteScalars(200, {{"accuracy", 0.875f},
                                            {"examples_per_sec", 1234.5f}})
                  .ok());
  ASSERT_TRUE((*writer)->Close().ok());
  const std::string path = (*writer)->path();

  // One file, named like TensorFlow's.
  std::vector<std::string> names = ListDir(logdir);
  ASSERT_THAT(names, SizeIs(1));
  EXPECT_EQ(logdir + "/" + names[0], path);
  EXPECT_THAT(names[0], StartsWith("events.out.tfevents."));
  const std::string secs = names[0].substr(20, 10);
  EXPECT_EQ(names[0][30], '.');
  EXPECT_NEAR(std::stod(secs), before, 5);

  std::vector<tf::Event> events = ReadEvents(path);
  ASSERT_THAT(events, SizeIs(4));
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[0].what_case(), tf::Event::kFileVersion);
  for (const tf::Event& e : events) {
    EXPECT_GE(e.wall_time(), before - 1);
    EXPECT_LE(e.wall_time(), before + 60);
  }
  EXPECT_EQ(events[1].step(), 100);
  ASSERT_THAT(events[1].summary().value(), SizeIs(1));
  EXPECT_EQ(events[1].summary().value(0).tag(), "loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(events[2].step(), 200);
  EXPECT_EQ(events[2].summary().value(0).simple_value(), 0.75f);
  EXPECT_EQ(events[3].step(), 200);
  ASSERT_THAT(events[3].summary().value(), SizeIs(2));
  EXPECT_EQ(events[3].summary().value(0).tag(), "accuracy");
  EXPECT_EQ(events[3].summary().value(0).simple_value(), 0.875f);
  EXPECT_EQ(events[3].summary().value(1).tag(), "examples_per_sec");
  EXPECT_EQ(events[3].summary().value(1).simple_value(), 1234.5f);
  EXPECT_GE(events[3].wall_time(), events[1].wall_time());
}

TEST(EventWriterTest, FlushMakesEventsVisible) {
  EventWriterOptions options;
  options.flush_secs = 3600;  // Only explicit flushes.
  auto writer = EventWriter::Open(LogDir(), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_THAT(ReadEvents((*writer)->path()), SizeIs(1));  // Open flushes.
  ASSERT_TRUE((*writer)->WriteScalar("loss", 1, 1.0f).ok());
  ASSERT_TRUE((*writer)->Flush().ok());
  std::vector<tf::Event> events = ReadEvents((*writer)->path());
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[1].step(), 1);
}

TEST(EventWriterTest, FlushSecsZeroFlushesEveryWrite) {
  EventWriterOptions options;
  options.flush_secs = 0;
  auto writer = EventWriter::Open(LogDir(), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE((*writer)->WriteScalar("loss", step, 1.0f / step).ok());
    EXPECT_THAT(ReadEvents((*writer)->path()), SizeIs(1 + step));
  }
}

TEST(EventWriterTest, DestructorClosesTheFile) {
  std::string path;
  {
    auto writer = EventWriter::Open(LogDir());
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->WriteScalar("a", 7, 7.0f).ok());
    path = (*writer)->path();
  }
  std::vector<tf::Event> events = ReadEvents(path);
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[1].step(), 7);
}

TEST(EventWriterTest, TwoWritersInOneDirectoryGetTwoFiles) {
  const std::string logdir = LogDir();
  auto a = EventWriter::Open(logdir);
  auto b = EventWriter::Open(logdir);
  EventWriterOptions suffixed;
  suffixed.filename_suffix = ".worker1";
  auto c = EventWriter::Open(logdir, suffixed);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE((*a)->path(), (*b)->path());
  EXPECT_TRUE(absl::EndsWith((*c)->path(), ".worker1"));
  ASSERT_TRUE((*a)->WriteScalar("x", 1, 1.0f).ok());
  ASSERT_TRUE((*b)->WriteScalar("x", 1, 2.0f).ok());
  ASSERT_TRUE((*a)->Close().ok() && (*b)->Close().ok() && (*c)->Close().ok());
  EXPECT_THAT(ListDir(logdir), SizeIs(3));
  EXPECT_EQ(ReadEvents((*a)->path())[1].summary().value(0).simple_value(), 1.0f);
  EXPECT_EQ(ReadEvents((*b)->path())[1].summary().value(0).simple_value(), 2.0f);
}

TEST(EventWriterTest, ConcurrentWritersKeepEventsWhole) {
  auto writer = EventWriter::Open(LogDir());
  ASSERT_TRUE(writer.ok()) << writer.status();
  constexpr int kThreads = 4, kSteps = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string tag = absl::StrCat("thread", t);
      for (int step = 0; step < kSteps; ++step) {
        ASSERT_TRUE((*writer)->WriteScalar(tag, step, t * 1000 + step).ok());
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE((*writer)->Close().ok());
  std::vector<tf::Event> events = ReadEvents((*writer)->path());
  ASSERT_THAT(events, SizeIs(1 + kThreads * kSteps));
  std::vector<int> next(kThreads, 0);
  for (size_t i = 1; i < events.size(); ++i) {
    const tf::Summary::Value& v = events[i].summary().value(0);
    const int t = v.tag()[6] - '0';
    EXPECT_EQ(events[i].step(), next[t]);  // Each thread's order is kept.
    EXPECT_EQ(v.simple_value(), t * 1000 + next[t]);
    ++next[t];
  }
}

TEST(EventWriterTest, WriteAfterCloseFails) {
  auto writer = EventWriter::Open(LogDir());
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Close().ok());
  EXPECT_TRUE((*writer)->Close().ok());
  EXPECT_EQ((*writer)->WriteScalar("x", 1, 1).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(EventWriterTest, UnusableLogDirIsAnError) {
  const std::string file = LogDir("a_file");
  ASSERT_TRUE(TFRecordWriter::Open(file).ok());  // A file, not a directory.
  auto writer = EventWriter::Open(file + "/sub");
  EXPECT_FALSE(writer.ok());
  EXPECT_THAT(writer.status().message(), HasSubstr(file));
  EXPECT_EQ(EventWriter::Open("").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace psrt
