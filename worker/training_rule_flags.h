// The training rule from psrt_worker's flags (training_rule_flags.cc
// defines them): the optimizer, its hyperparameters and learning-rate
// schedule, sync or async, and the embedding tables' rule, admission and
// eviction, as the TrainingConfig the chief sends to every ps.
//
// Thread safety: call from main, after gflags::ParseCommandLineFlags.
#ifndef PSRT_WORKER_TRAINING_RULE_FLAGS_H_
#define PSRT_WORKER_TRAINING_RULE_FLAGS_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/psrt.pb.h"

namespace psrt {

// --max_workers (0: the spec's workers, fixed) and --elastic_lease_secs.
struct ElasticWorkers {
  int max_workers = 0;
  absl::Duration lease;
};
// InvalidArgument naming the flag when a worker of a spec of `spec_workers`
// workers, replica `replica`, cannot be elastic (`hybrid`: --dense_allreduce,
// whose ring and tables are not elastic).
absl::StatusOr<ElasticWorkers> ElasticWorkersFromFlags(int spec_workers, int replica,
                                                       bool hybrid);

// The rule for a cluster of `num_replicas` workers. With --decay_epochs (no
// --decay_steps) the decay steps wait for the training set's size
// (*decay_epochs > 0; ResolveDecayEpochs), a provisional 1 letting
// everything else be validated now. InvalidArgument naming the flag at fault.
// `allreduce`: allreduce mode, synchronous whatever --sync_replicas says.
absl::StatusOr<proto::TrainingConfig> TrainingConfigFromFlags(int num_replicas,
                                                              double* decay_epochs,
                                                              bool allreduce = false);

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_RULE_FLAGS_H_
