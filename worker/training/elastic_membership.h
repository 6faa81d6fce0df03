// ElasticMembership: what the trainer asks of an elastic job's membership
// (sync mode with --max_workers; worker/worker_membership.h implements it
// over gRPC, with the protocol).
//
// Thread safety: as the implementation says.
#ifndef PSRT_WORKER_TRAINING_ELASTIC_MEMBERSHIP_H_
#define PSRT_WORKER_TRAINING_ELASTIC_MEMBERSHIP_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"

namespace psrt {

class ElasticMembership {
 public:
  virtual ~ElasticMembership() = default;
  // Before training: the first version this worker's gradients count at.
  virtual absl::StatusOr<int64_t> Join() = 0;
  // The chief, before it pushes `version` (the first it has not pushed):
  // admits, waits for --min_workers (giving up, OK, once `training_over`
  // says so: an operator ended training meanwhile), announces. Others:
  // nothing.
  virtual absl::Status AtStep(int64_t version, const std::function<bool()>& training_over) = 0;
  // After the chief's recovery (a restored shard knows the chief alone).
  virtual void Recovered() = 0;
  // An operator asked this worker to leave (psrtctl drain).
  virtual bool draining() const = 0;
  // This worker's last word: it stops training now.
  virtual void Leave() = 0;
};

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_ELASTIC_MEMBERSHIP_H_
