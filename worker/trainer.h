// Trainer: one worker's training loop against the parameter servers.
//
//   pull(v) -> forward/backward on the next batch -> push(gradients of v)
//   -> pull(v + 1 in sync mode, the latest in async mode) -> ...
// until the global step reaches train_steps or the chief ends training. The
// chief (replica 0) initializes the variables first and, at the end,
// evaluates on the test set, prints
//   final: global_step=N test_accuracy=A
// and tells every shard that training is over. Other replicas wait until the
// model is ready, and say goodbye to the shards when they finish.
//
// Thread safety: not thread-safe; Run() is called once.
#ifndef PSRT_WORKER_TRAINER_H_
#define PSRT_WORKER_TRAINER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "models/model.h"
#include "proto/psrt.pb.h"
#include "worker/idx_dataset.h"
#include "worker/ps_client.h"

namespace psrt {

struct TrainerOptions {
  int replica = 0;       // 0 is the chief.
  int num_replicas = 1;  // Shards of the training set.
  // The chief sends this to the shards; other replicas check that their own
  // mode agrees with the chief's.
  proto::TrainingConfig config;
  int batch_size = 100;
  int64_t train_steps = 1000;
  int log_every_steps = 100;
  bool shuffle = true;
  uint64_t seed = 1;  // Initial values (chief) and data order.
  absl::Duration startup_timeout = absl::Seconds(300);
  // Chief only: where to write the final parameters (safetensors); empty
  // for none.
  std::string final_params_path;
};

struct TrainResult {
  int64_t global_step = 0;
  int64_t local_steps = 0;
  double test_accuracy = -1;  // Chief only.
};

class Trainer {
 public:
  // REQUIRES: all pointers outlive the trainer; `test` may be null for
  // replicas other than the chief.
  Trainer(const TrainerOptions& options, Model* model, PsClient* client,
          const Dataset* train, const Dataset* test);
  absl::StatusOr<TrainResult> Run();

 private:
  absl::StatusOr<double> Evaluate(const std::vector<Tensor>& params);

  const TrainerOptions options_;
  Model* const model_;
  PsClient* const client_;
  const Dataset* const train_;
  const Dataset* const test_;
};

}  // namespace psrt

#endif  // PSRT_WORKER_TRAINER_H_
