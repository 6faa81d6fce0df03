// The training rule from psrt_worker's flags (training_rule_flags.cc
// defines them): the optimizer, its hyperparameters and learning-rate
// schedule, sync or async, and the embedding tables' rule, admission and
// eviction, as the TrainingConfig the chief sends to every ps.
//
// Thread safety: call from main, after gflags::ParseCommandLineFlags.
#ifndef PSRT_WORKER_TRAINING_RULE_FLAGS_H_
#define PSRT_WORKER_TRAINING_RULE_FLAGS_H_

#include "absl/status/statusor.h"
#include "proto/psrt.pb.h"

namespace psrt {

// The rule for a cluster of `num_replicas` workers. With --decay_epochs (no
// --decay_steps) the decay steps wait for the training set's size
// (*decay_epochs > 0; ResolveDecayEpochs), a provisional 1 letting
// everything else be validated now. InvalidArgument naming the flag at fault.
absl::StatusOr<proto::TrainingConfig> TrainingConfigFromFlags(int num_replicas,
                                                              double* decay_epochs);

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINING_RULE_FLAGS_H_
