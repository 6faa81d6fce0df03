#include "worker/ring/elastic_ring.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/rpc_util.h"
#include "glog/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/psrt.grpc.pb.h"

namespace psrt {

class ElasticRing::Service final
    : public proto::Collective::WithRawCallbackMethod_Deliver<proto::Collective::Service> {
 public:
  explicit Service(ElasticRing* ring) : ring_(ring) {}
  grpc::ServerUnaryReactor* Deliver(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override {
    std::shared_ptr<Collective> ring;
    {
      absl::MutexLock lock(&ring_->mu_);
      ring = ring_->ring_;
    }
    absl::Status status;
    proto::CollectiveAck ack;
    if (ring == nullptr) {
      // Not in a ring yet: its sender retries (a ring's first op waits for
      // its members to start).
      status = absl::UnavailableError(absl::StrCat("allreduce: worker replica ",
                                                   ring_->replica_, " is in no ring yet"));
    } else {
      status = ring->Deliver(*request, &ack);
    }
    if (status.ok()) *response = SerializeToByteBuffer(ack);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }

 private:
  ElasticRing* const ring_;
};

absl::StatusOr<ElasticRing::Members> ElasticRing::FromList(const proto::MembersRequest& list) {
  if (list.generation() <= 0 || list.ring_addresses_size() != list.replicas_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("allreduce: the chief's list ", ListNumber(list.generation()), " names ",
                     list.replicas_size(), " members and ", list.ring_addresses_size(),
                     " ring addresses"));
  }
  Members members;
  members.generation = list.generation();
  members.replicas.assign(list.replicas().begin(), list.replicas().end());
  members.addresses.assign(list.ring_addresses().begin(), list.ring_addresses().end());
  return members;
}

ElasticRing::ElasticRing(RingOptions options, int replica)
    : options_(std::move(options)), replica_(replica), service_(std::make_unique<Service>(this)) {}

ElasticRing::~ElasticRing() = default;

grpc::Service* ElasticRing::service() { return service_.get(); }

absl::Status ElasticRing::Superseded(int64_t generation) const {
  return absl::AbortedError(absl::StrCat("allreduce: the elastic job's members changed (list ",
                                         ListNumber(newest_.generation), " after ",
                                         ListNumber(generation), "): the workers regroup"));
}

void ElasticRing::MembersChanged(Members members) {
  absl::MutexLock lock(&mu_);
  if (members.generation <= newest_.generation) return;
  newest_ = std::move(members);
  if (ring_ != nullptr) ring_->Abort(Superseded(generation_));
}

ElasticRing::Members ElasticRing::newest() const {
  absl::MutexLock lock(&mu_);
  return newest_;
}

bool ElasticRing::stale() const {
  absl::MutexLock lock(&mu_);
  return ring_ == nullptr || newest_.generation > generation_;
}

int64_t ElasticRing::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

absl::Status ElasticRing::Regroup(absl::Duration timeout) {
  Members members;
  {
    absl::MutexLock lock(&mu_);
    auto listed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return newest_.generation > generation_ &&
             std::count(newest_.replicas.begin(), newest_.replicas.end(), replica_) == 1;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&listed), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "allreduce: worker replica ", replica_, " was in no list of the chief's newer than ",
          ListNumber(generation_), " within ", absl::FormatDuration(timeout),
          newest_.generation > generation_ ? " (the newest leaves it out)" : ""));
    }
    members = newest_;
  }
  RingOptions options = options_;
  options.data_plane = false;
  options.generation = members.generation;
  options.addresses = members.addresses;
  options.rank = static_cast<int>(
      std::find(members.replicas.begin(), members.replicas.end(), replica_) -
      members.replicas.begin());
  auto ring = std::make_shared<Collective>(options);
  std::shared_ptr<Collective> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::move(ring_);
    ring_ = ring;
    current_ = ring.get();
    members_ = members;
    generation_ = members.generation;
    // A list told since the copy above: this ring is over before it began.
    if (newest_.generation > generation_) ring_->Abort(Superseded(generation_));
  }
  old.reset();  // Unless a service call still holds it.
  const absl::Status joined = ring->Join();
  if (!joined.ok()) {
    absl::MutexLock lock(&mu_);
    return newest_.generation > generation_ ? Superseded(generation_) : joined;
  }
  return absl::OkStatus();
}

}  // namespace psrt
