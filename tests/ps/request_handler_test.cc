// RequestHandler without a transport: one stripe check, pushes counted
// whatever their outcome, and pulls answered (at once or after a wait, with
// waited_us), cancelled, and counted when sent.
#include "ps/request_handler.h"

#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ps/shard_test_util.h"

namespace psrt {
namespace {

using shard_test::Bytes;
using shard_test::Config;
using shard_test::InitShard;
using shard_test::kSize;
using shard_test::Meta;
using ::testing::HasSubstr;

class RequestHandlerTest : public ::testing::Test {
 protected:
  RequestHandlerTest() : metrics_({"ps", 0}), ps_metrics_(&metrics_) {
    for (auto& shard : shards_) {
      shard = std::make_unique<ParameterShard>(ParameterShard::Options{});
      InitShard(shard.get(), Config(proto::SYNC, 1, 1));
    }
    handler_.emplace(std::vector<ParameterShard*>{shards_[0].get(), shards_[1].get()},
                     &ps_metrics_);
  }

  static proto::PushHeader PushHeader(int64_t version) {
    proto::PushHeader header;
    header.set_replica(0);
    header.set_version(version);
    *header.add_variables() = Meta("w", {kSize});
    return header;
  }

  // Pulls `stripe`; the answer once it comes (or `timeout` passes).
  struct Pulled {
    absl::Notification done;
    absl::StatusOr<RequestHandler::PullAnswer> answer;
  };
  RequestHandler::WaitingPull Pull(absl::string_view stripe, int64_t min_version,
                                   Pulled* pulled) {
    proto::PullRequest request;
    request.set_min_version(min_version);
    return handler_->Pull(stripe, absl::OkStatus(), request, absl::InfiniteFuture(),
                          [pulled](absl::StatusOr<RequestHandler::PullAnswer> answer) {
                            pulled->answer = std::move(answer);
                            pulled->done.Notify();
                          });
  }

  Metrics metrics_;
  PsMetrics ps_metrics_;
  std::unique_ptr<ParameterShard> shards_[2];
  std::optional<RequestHandler> handler_;
};

TEST_F(RequestHandlerTest, AStripeThisPsLacksIsRefusedInOneText) {
  for (absl::string_view stripe : {"2", "-1", "x"}) {
    absl::StatusOr<ParameterShard*> shard = handler_->Stripe(stripe);
    EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(shard.status().message()),
                HasSubstr(absl::StrCat("the call names stripe \"", stripe,
                                       "\", but this ps serves 2 (psrt_ps --ps_stripes)")));
  }
  EXPECT_EQ(*handler_->Stripe("1"), shards_[1].get());
}

TEST_F(RequestHandlerTest, PushesAreAppliedAndCountedWhateverTheirOutcome) {
  const std::vector<float> grad = {1, 2, 3, 4};
  absl::StatusOr<proto::PushResponse> pushed =
      handler_->Push("1", absl::OkStatus(), PushHeader(0), Bytes(grad).get(), 100);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  EXPECT_TRUE(pushed->accepted());
  EXPECT_EQ(shards_[1]->GetStatus().version(), 1);
  EXPECT_EQ(shards_[0]->GetStatus().version(), 0);
  // The transport's refusal, a missing stripe and the shard's own: counted.
  EXPECT_EQ(handler_->Push("0", absl::PermissionDeniedError("not you"), PushHeader(0), nullptr, 10)
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(handler_->Push("9", absl::OkStatus(), PushHeader(0), Bytes(grad).get(), 10)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(handler_->Push("0", absl::OkStatus(), PushHeader(0), Bytes({1}).get(), 10)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(shards_[0]->GetStatus().pushes_applied(), 0);
  const proto::TrafficStatus traffic = ps_metrics_.transfers().traffic();
  EXPECT_EQ(traffic.pushes(), 4);
  EXPECT_EQ(traffic.bytes_pushed(), 130);
}

TEST_F(RequestHandlerTest, APullIsAnsweredAtOnceOrAfterItsWait) {
  Pulled now;
  EXPECT_EQ(Pull("0", 0, &now).id, 0);  // Answered: nothing to cancel.
  ASSERT_TRUE(now.done.HasBeenNotified());
  ASSERT_TRUE(now.answer.ok()) << now.answer.status();
  EXPECT_FALSE(now.answer->did_wait);
  EXPECT_EQ(now.answer->values.size(), kSize * sizeof(float));
  EXPECT_EQ(now.answer->header.version(), 0);

  Pulled later;
  const RequestHandler::WaitingPull waiting = Pull("1", 1, &later);
  EXPECT_NE(waiting.id, 0);
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_FALSE(later.done.HasBeenNotified());
  const std::vector<float> grad = {1, 1, 1, 1};
  ASSERT_TRUE(handler_->Push("1", absl::OkStatus(), PushHeader(0), Bytes(grad).get(), 16).ok());
  later.done.WaitForNotification();
  ASSERT_TRUE(later.answer.ok()) << later.answer.status();
  EXPECT_TRUE(later.answer->did_wait);
  EXPECT_GE(later.answer->header.waited_us(), 20000);
  EXPECT_EQ(later.answer->header.waited_us(), absl::ToInt64Microseconds(later.answer->waited));
  const auto* values = reinterpret_cast<const float*>(later.answer->values.data());
  EXPECT_EQ(std::vector<float>(values, values + kSize), (std::vector<float>{-1, -1, -1, -1}));

  handler_->CountPull(*now.answer, 50);
  handler_->CountPull(*later.answer, 70);
  const proto::TrafficStatus traffic = ps_metrics_.transfers().traffic();
  EXPECT_EQ(traffic.pulls(), 2);
  EXPECT_EQ(traffic.bytes_pulled(), 120);
}

TEST_F(RequestHandlerTest, AWaitingPullIsCancelledAndBadPullsAreRefused) {
  Pulled cancelled;
  const RequestHandler::WaitingPull waiting = Pull("0", 5, &cancelled);
  EXPECT_EQ(shards_[0]->GetStatus().waiting_pulls(), 1);
  waiting.Cancel();
  ASSERT_TRUE(cancelled.done.HasBeenNotified());
  EXPECT_EQ(cancelled.answer.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(shards_[0]->GetStatus().waiting_pulls(), 0);
  waiting.Cancel();  // Answered already: nothing.

  Pulled missing;
  EXPECT_EQ(Pull("2", 0, &missing).id, 0);
  EXPECT_EQ(missing.answer.status().code(), absl::StatusCode::kInvalidArgument);
  Pulled unread;
  handler_->Pull("0", absl::InvalidArgumentError("not a pull"), proto::PullRequest(),
                 absl::InfiniteFuture(), [&unread](absl::StatusOr<RequestHandler::PullAnswer> a) {
                   unread.answer = std::move(a);
                   unread.done.Notify();
                 });
  EXPECT_EQ(unread.answer.status().message(), "not a pull");
}

}  // namespace
}  // namespace psrt
