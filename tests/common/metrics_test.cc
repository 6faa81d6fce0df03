#include "common/metrics.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/prometheus_scrape.h"

namespace psrt {
namespace {

TEST(MetricsTest, PsCountersAreScrapedOverHttpWithTheirValues) {
  Metrics metrics({"ps", 3, /*restarts=*/2});
  PsMetrics ps(&metrics);
  ASSERT_TRUE(metrics.Serve("127.0.0.1", 0).ok());
  ASSERT_GT(metrics.port(), 0);

  for (int i = 0; i < 3; ++i) {
    ps.transfers().RecordPush(PushOutcome::kAccepted, 1000, absl::Milliseconds(2));
  }
  ps.transfers().RecordPush(PushOutcome::kStale, 1000, absl::Microseconds(500));
  ps.transfers().RecordPull(5000);
  ps.transfers().RecordPull(5000);
  ps.transfers().RecordPullWait(absl::Milliseconds(50));
  ps.SetVersion(7);
  ps.SetReady(true);

  const std::string scrape = HttpGet(metrics.port(), "/metrics");
  ASSERT_NE(scrape.find("200 OK"), std::string::npos) << scrape;
  const std::string labels = R"(job="ps",task="3")";
  EXPECT_EQ(Sample(scrape, "psrt_ps_pushes_total{" + labels + R"(,result="accepted"})"), 3);
  EXPECT_EQ(Sample(scrape, "psrt_ps_pushes_total{" + labels + R"(,result="stale"})"), 1);
  EXPECT_EQ(Sample(scrape, "psrt_ps_pushes_total{" + labels + R"(,result="rejected"})"), 0);
  EXPECT_EQ(Sample(scrape, "psrt_ps_pulls_total{" + labels + "}"), 2);
  EXPECT_EQ(Sample(scrape, "psrt_ps_pushed_bytes_total{" + labels + "}"), 4000);
  EXPECT_EQ(Sample(scrape, "psrt_ps_pulled_bytes_total{" + labels + "}"), 10000);
  EXPECT_EQ(Sample(scrape, "psrt_ps_push_seconds_count{" + labels + "}"), 4);
  EXPECT_NEAR(Sample(scrape, "psrt_ps_push_seconds_sum{" + labels + "}"), 0.0065, 1e-9);
  // Three 2 ms pushes and one of 0.5 ms.
  EXPECT_EQ(Sample(scrape, "psrt_ps_push_seconds_bucket{" + labels + R"(,le="0.001"})"), 1);
  EXPECT_EQ(Sample(scrape, "psrt_ps_push_seconds_bucket{" + labels + R"(,le="0.003"})"), 4);
  EXPECT_EQ(Sample(scrape, "psrt_ps_pull_wait_seconds_count{" + labels + "}"), 1);
  EXPECT_EQ(Sample(scrape, "psrt_ps_version{" + labels + "}"), 7);
  EXPECT_EQ(Sample(scrape, "psrt_ps_ready{" + labels + "}"), 1);
  EXPECT_EQ(Sample(scrape, "psrt_task_restarts{" + labels + "}"), 2);
  EXPECT_GT(Sample(scrape, "psrt_process_resident_memory_bytes{" + labels + "}"), 1 << 20);
  EXPECT_NEAR(Sample(scrape, "psrt_process_start_time_seconds{" + labels + "}"),
              absl::ToUnixSeconds(absl::Now()), 60);

  // The status RPC reads the same numbers.
  const proto::TrafficStatus traffic = ps.transfers().traffic();
  EXPECT_EQ(traffic.pushes(), 4);
  EXPECT_EQ(traffic.pulls(), 2);
  EXPECT_EQ(traffic.bytes_pushed(), 4000);
  EXPECT_EQ(traffic.bytes_pulled(), 10000);
  EXPECT_GT(traffic.pushes_per_sec(), 0);
  EXPECT_EQ(metrics.process_status().restarts(), 2);

  // Later updates show in the next scrape.
  ps.transfers().RecordPush(PushOutcome::kLate, 10, absl::ZeroDuration());
  ps.SetVersion(8);
  const std::string again = HttpGet(metrics.port(), "/metrics");
  EXPECT_EQ(Sample(again, "psrt_ps_pushes_total{" + labels + R"(,result="late"})"), 1);
  EXPECT_EQ(Sample(again, "psrt_ps_version{" + labels + "}"), 8);
}

TEST(MetricsTest, WorkerProgressStateAndListener) {
  Metrics metrics({"worker", 1});
  WorkerMetrics worker(&metrics);
  std::vector<proto::WorkerState> heard;
  worker.SetStateListener([&](proto::WorkerState state) { heard.push_back(state); });
  ASSERT_TRUE(metrics.Serve("127.0.0.1", 0).ok());

  EXPECT_EQ(worker.state(), proto::WORKER_WAITING);
  worker.SetState(proto::WORKER_TRAINING);
  worker.SetState(proto::WORKER_TRAINING);  // No change: not heard again.
  for (int step = 1; step <= 5; ++step) worker.RecordStep(10 + step, 100);
  worker.RecordRollback(0);
  worker.RecordRollback(7);
  EXPECT_EQ(worker.global_step(), 15);
  EXPECT_EQ(worker.local_steps(), 5);
  EXPECT_GT(worker.examples_per_sec(), 0);

  const std::string labels = R"(job="worker",task="1")";
  std::string scrape = HttpGet(metrics.port(), "/metrics");
  EXPECT_EQ(Sample(scrape, "psrt_worker_global_step{" + labels + "}"), 15);
  EXPECT_EQ(Sample(scrape, "psrt_worker_local_steps_total{" + labels + "}"), 5);
  EXPECT_EQ(Sample(scrape, "psrt_worker_examples_total{" + labels + "}"), 500);
  EXPECT_EQ(Sample(scrape, "psrt_worker_steps_rolled_back_total{" + labels + "}"), 7);
  EXPECT_GT(Sample(scrape, "psrt_worker_examples_per_second{" + labels + "}"), 0);
  EXPECT_EQ(Sample(scrape, "psrt_worker_state{" + labels + R"(,state="training"})"), 1);
  EXPECT_EQ(Sample(scrape, "psrt_worker_state{" + labels + R"(,state="waiting"})"), 0);

  worker.SetState(proto::WORKER_DONE);
  scrape = HttpGet(metrics.port(), "/metrics");
  EXPECT_EQ(Sample(scrape, "psrt_worker_state{" + labels + R"(,state="training"})"), 0);
  EXPECT_EQ(Sample(scrape, "psrt_worker_state{" + labels + R"(,state="done"})"), 1);
  EXPECT_EQ(heard, (std::vector<proto::WorkerState>{proto::WORKER_TRAINING,
                                                     proto::WORKER_DONE}));
}

TEST(MetricsTest, ServingOnATakenPortNamesIt) {
  Metrics first({"ps", 0});
  ASSERT_TRUE(first.Serve("127.0.0.1", 0).ok());
  Metrics second({"ps", 1});
  const absl::Status status = second.Serve("127.0.0.1", first.port());
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find(absl::StrCat("127.0.0.1:", first.port())),
            std::string::npos)
      << status;
}

TEST(RateMeterTest, RateOverTheLastSeconds) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  RateMeter meter(absl::Seconds(10), start);
  EXPECT_EQ(meter.PerSecond(start), 0);
  // Within the first second, the rate is over one second.
  meter.Add(30, start + absl::Milliseconds(100));
  EXPECT_NEAR(meter.PerSecond(start + absl::Milliseconds(200)), 30, 1e-9);
  meter.Add(70, start + absl::Milliseconds(300));
  // 100 per second for 4 seconds: the rate since the start.
  for (int s = 1; s < 4; ++s) meter.Add(100, start + absl::Seconds(s) + absl::Milliseconds(500));
  EXPECT_NEAR(meter.PerSecond(start + absl::Seconds(4)), 100, 1e-9);
  // Then nothing for 20 seconds: the window has forgotten it.
  EXPECT_EQ(meter.PerSecond(start + absl::Seconds(24)), 0);
  // 50 per second again, for the whole 10-second window.
  for (int s = 30; s < 40; ++s) meter.Add(50, start + absl::Seconds(s) + absl::Milliseconds(100));
  EXPECT_NEAR(meter.PerSecond(start + absl::Seconds(39) + absl::Milliseconds(500)),
              500.0 / 9.5, 1e-9);
}

TEST(ResidentMemoryTest, GrowsWhenMemoryIsTouched) {
  const int64_t before = ResidentMemoryBytes();
  EXPECT_GT(before, 1 << 20);
  constexpr size_t kBytes = 64 << 20;
  std::vector<char> block(kBytes, 1);  // Touches every page.
  EXPECT_GE(ResidentMemoryBytes(), before + static_cast<int64_t>(kBytes) * 3 / 4);
  EXPECT_EQ(block[kBytes - 1], 1);
}

}  // namespace
}  // namespace psrt
