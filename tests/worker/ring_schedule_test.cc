// RingSchedule: the ring schedule against an in-memory transport: W workers
// on W threads of one process, no servers. (collective_test.cc runs it over
// gRPC.)
#include "worker/ring/ring_schedule.h"

#include <cstring>
#include <map>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace psrt {
namespace {

// Mailboxes of every worker of one in-memory ring, by (receiver, op, step).
class Ring {
 public:
  explicit Ring(int size) : size_(size) {}
  int size() const { return size_; }

  void Put(int to, int64_t op, int step, absl::Span<const char> bytes) {
    absl::MutexLock lock(&mu_);
    mail_[{to, op, step}].assign(bytes.begin(), bytes.end());
  }
  std::vector<char> Take(int to, int64_t op, int step) {
    const Key key{to, op, step};
    absl::MutexLock lock(&mu_);
    auto arrived = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return mail_.count(key) > 0;
    };
    mu_.Await(absl::Condition(&arrived));
    std::vector<char> bytes = std::move(mail_[key]);
    mail_.erase(key);
    return bytes;
  }

 private:
  using Key = std::tuple<int, int64_t, int>;
  const int size_;
  absl::Mutex mu_;
  std::map<Key, std::vector<char>> mail_ ABSL_GUARDED_BY(mu_);
};

// Worker `rank`'s side of a Ring: a send is delivered at once. Every call
// after the first `fail_after` ones fails (-1: none).
class InMemoryTransport final : public RingTransport {
 public:
  InMemoryTransport(Ring* ring, int rank) : ring_(ring), rank_(rank) {}

  std::unique_ptr<Send> StartSend(int64_t op, int step, absl::Span<const char> bytes) override {
    ++calls_;
    if (!Broken()) ring_->Put((rank_ + 1) % ring_->size(), op, step, bytes);
    return std::make_unique<Send>();
  }
  absl::Status FinishSend(std::unique_ptr<Send>, bool) override {
    return Broken() ? absl::UnavailableError("next worker gone") : absl::OkStatus();
  }
  absl::Status Receive(int64_t op, int step, absl::Span<char> bytes, bool add) override {
    ++calls_;
    if (Broken()) return absl::DeadlineExceededError("previous worker gone");
    const std::vector<char> got = ring_->Take(rank_, op, step);
    if (got.size() != bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(got.size(), " bytes, want ", bytes.size()));
    }
    if (!add) {
      std::memcpy(bytes.data(), got.data(), got.size());
      return absl::OkStatus();
    }
    for (size_t i = 0; i < got.size() / sizeof(float); ++i) {
      float sum, x;
      std::memcpy(&sum, bytes.data() + i * sizeof(float), sizeof(float));
      std::memcpy(&x, got.data() + i * sizeof(float), sizeof(float));
      sum += x;
      std::memcpy(bytes.data() + i * sizeof(float), &sum, sizeof(float));
    }
    return absl::OkStatus();
  }

  int fail_after = -1;
  int calls() const { return calls_; }

 private:
  bool Broken() const { return fail_after >= 0 && calls_ > fail_after; }
  Ring* const ring_;
  const int rank_;
  int calls_ = 0;
};

// Runs `op(rank, schedule)` on every worker of a ring of `w`, each on its
// own thread, and returns each one's status.
template <class Op>
std::vector<absl::Status> RunRing(int w, Op op) {
  Ring ring(w);
  std::vector<std::unique_ptr<InMemoryTransport>> transports;
  std::vector<std::unique_ptr<RingSchedule>> schedules;
  for (int r = 0; r < w; ++r) {
    transports.push_back(std::make_unique<InMemoryTransport>(&ring, r));
    schedules.push_back(std::make_unique<RingSchedule>(r, w, transports[r].get()));
  }
  std::vector<absl::Status> statuses(w);
  std::vector<std::thread> threads;
  for (int r = 0; r < w; ++r) {
    threads.emplace_back([&, r] { statuses[r] = op(r, *schedules[r]); });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

TEST(RingScheduleTest, EveryWorkerGetsTheSameSum) {
  for (int w : {1, 2, 3, 5}) {
    for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{1000}}) {
      std::vector<std::vector<float>> data(w, std::vector<float>(n));
      for (int r = 0; r < w; ++r) {
        for (size_t i = 0; i < n; ++i) data[r][i] = 0.1f * (r + 1) + 0.01f * i;
      }
      std::vector<float> want(n, 0.0f);
      for (size_t i = 0; i < n; ++i) {
        for (int r = 0; r < w; ++r) want[i] += data[r][i];
      }
      const std::vector<absl::Status> statuses = RunRing(w, [&](int r, RingSchedule& ring) {
        return ring.AllreduceSum(absl::MakeSpan(data[r]));
      });
      for (int r = 0; r < w; ++r) {
        ASSERT_TRUE(statuses[r].ok()) << statuses[r];
        EXPECT_EQ(0, std::memcmp(data[r].data(), data[0].data(), n * sizeof(float)))
            << "worker " << r << " of " << w << ", n " << n;
        for (size_t i = 0; i < n; ++i) {
          EXPECT_NEAR(data[r][i], want[i], 1e-4) << w << " " << n << " " << i;
        }
      }
    }
  }
}

TEST(RingScheduleTest, BroadcastCopiesTheRootsValues) {
  for (int w : {1, 2, 4}) {
    for (int root = 0; root < w; ++root) {
      std::vector<std::vector<char>> data(w);
      for (int r = 0; r < w; ++r) data[r].assign(11, static_cast<char>('a' + r));
      const std::vector<absl::Status> statuses = RunRing(w, [&](int r, RingSchedule& ring) {
        return ring.Broadcast(absl::MakeSpan(data[r]), root);
      });
      for (int r = 0; r < w; ++r) {
        ASSERT_TRUE(statuses[r].ok()) << statuses[r];
        EXPECT_EQ(data[r], std::vector<char>(11, static_cast<char>('a' + root)));
      }
    }
  }
}

TEST(RingScheduleTest, SeveralOpsInARow) {
  constexpr int kWorkers = 3;
  std::vector<std::vector<float>> data(kWorkers, std::vector<float>(10, 1.0f));
  const std::vector<absl::Status> statuses = RunRing(kWorkers, [&](int r, RingSchedule& ring) {
    for (int i = 0; i < 3; ++i) {
      absl::Status status = ring.AllreduceSum(absl::MakeSpan(data[r]));
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  });
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    EXPECT_EQ(data[r], std::vector<float>(10, 27.0f));
  }
}

TEST(RingScheduleTest, TheFirstFailureSticks) {
  Ring ring(2);
  InMemoryTransport transport(&ring, 0);
  transport.fail_after = 0;  // The first receive fails.
  RingSchedule schedule(0, 2, &transport);
  std::vector<float> data(4, 1.0f);
  const absl::Status first = schedule.AllreduceSum(absl::MakeSpan(data));
  EXPECT_TRUE(absl::IsDeadlineExceeded(first)) << first;
  const int calls = transport.calls();
  // Later calls return the same error without reaching the transport.
  EXPECT_EQ(schedule.AllreduceSum(absl::MakeSpan(data)), first);
  std::vector<char> bytes(3);
  EXPECT_EQ(schedule.Broadcast(absl::MakeSpan(bytes), 0), first);
  EXPECT_EQ(schedule.Join(), first);
  EXPECT_EQ(transport.calls(), calls);
}

}  // namespace
}  // namespace psrt
