// The worker task: builds what a WorkerConfig asks for and trains.
//
// RunWorkerTask builds, in order: telemetry (metrics, the status and health
// service on the task's own address, the timeline), the towers (one model
// per device), the ring of the workers in allreduce mode, the input
// (worker/input/input_factory.h), the store (PsClient in ps mode,
// AllreduceStore in allreduce mode), and the Trainer; then runs the trainer
// (or the evaluator loop) to the end.
//
// Thread safety: call once per process.
#ifndef PSRT_WORKER_WORKER_TASK_H_
#define PSRT_WORKER_WORKER_TASK_H_

#include "absl/status/status.h"
#include "worker/worker_config.h"

namespace psrt {

// Trains (or evaluates) as `config` says; the first error, or OK when
// training ended. The learning-rate decay in epochs is resolved against the
// training set here (ResolveDecayEpochs).
absl::Status RunWorkerTask(WorkerConfig config);

// The model's variables and parameter count, on stdout (--describe_model).
absl::Status DescribeModel(const WorkerConfig& config);

// trainer.config's exponential decay steps for a decay every
// config->decay_epochs epochs of `train_examples` examples (nothing when
// decay_epochs is 0). InvalidArgument if the result is not a valid rule, or
// when the size is unknown (train_examples 0: streamed input).
absl::Status ResolveDecayEpochs(int64_t train_examples, WorkerConfig* config);

}  // namespace psrt

#endif  // PSRT_WORKER_WORKER_TASK_H_
