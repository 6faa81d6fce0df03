#include "ps/request_handler.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace psrt {

RequestHandler::RequestHandler(std::vector<ParameterShard*> shards, PsMetrics* metrics)
    : shards_(std::move(shards)), metrics_(metrics) {
  CHECK(!shards_.empty());
}

absl::StatusOr<ParameterShard*> RequestHandler::Stripe(absl::string_view stripe) const {
  int index = -1;
  if (!absl::SimpleAtoi(stripe, &index) || index < 0 ||
      index >= static_cast<int>(shards_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("the call names stripe \"", stripe, "\", but this ps serves ", shards_.size(),
                     " (psrt_ps --ps_stripes): give every task of the job the same --ps_stripes"));
  }
  return shards_[index];
}

absl::StatusOr<proto::PushResponse> RequestHandler::Push(absl::string_view stripe,
                                                         const absl::Status& read,
                                                         const proto::PushHeader& header,
                                                         ByteSource* data,
                                                         int64_t wire_bytes) const {
  const absl::Time start = absl::Now();
  absl::StatusOr<ParameterShard*> shard = Stripe(stripe);
  const absl::StatusOr<proto::PushResponse> reply =
      !shard.ok() ? shard.status() : !read.ok() ? read : (*shard)->Push(header, data);
  if (metrics_ != nullptr) {
    metrics_->transfers().RecordPush(OutcomeOf(reply.ok(), reply.ok() && reply->accepted(),
                                               reply.ok() && reply->training_done()),
                                     wire_bytes, absl::Now() - start);
    if (reply.ok()) metrics_->SetVersion(reply->version());
  }
  return reply;
}

RequestHandler::WaitingPull RequestHandler::Pull(absl::string_view stripe,
                                                 const absl::Status& read,
                                                 const proto::PullRequest& request,
                                                 absl::Time latest, PullDone done) const {
  absl::StatusOr<ParameterShard*> shard = Stripe(stripe);
  const absl::Status refused = shard.ok() ? read : shard.status();
  absl::StatusOr<ParameterShard::PullOptions> options =
      refused.ok() ? (*shard)->PullOptionsFor(request, latest) : refused;
  if (!options.ok()) {
    done(options.status());
    return {};
  }
  const absl::Time start = absl::Now();
  auto answer = [start, done = std::move(done)](absl::StatusOr<ParameterShard::PullReply> reply) {
    if (!reply.ok()) {
      done(reply.status());
      return;
    }
    PullAnswer answer;
    answer.waited = absl::Now() - start;
    answer.did_wait = reply->waited;
    answer.header = std::move(reply->header);
    answer.header.set_waited_us(absl::ToInt64Microseconds(answer.waited));
    answer.values = {reinterpret_cast<const char*>(reply->snapshot->values.data()),
                     reply->num_bytes};
    answer.snapshot = std::move(reply->snapshot);
    if (reply->rows != nullptr) {
      answer.rows = {reinterpret_cast<const char*>(reply->rows->data()),
                     reply->rows->size() * sizeof(float)};
      answer.row_buffer = std::move(reply->rows);
    }
    done(std::move(answer));
  };
  return {*shard, (*shard)->Pull(*options, std::move(answer))};
}

void RequestHandler::CountPull(const PullAnswer& answer, int64_t wire_bytes) const {
  if (metrics_ == nullptr) return;
  metrics_->transfers().RecordPull(wire_bytes);
  if (answer.did_wait) metrics_->transfers().RecordPullWait(answer.waited);
}

}  // namespace psrt
