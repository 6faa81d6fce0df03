// The flags of psrt_worker (worker_flags.cc defines them: `psrt_worker
// --help` lists them), read in this one place into a validated WorkerConfig.
//
// Thread safety: call from main, after gflags::ParseCommandLineFlags.
#ifndef PSRT_WORKER_WORKER_FLAGS_H_
#define PSRT_WORKER_WORKER_FLAGS_H_

#include "absl/status/statusor.h"
#include "worker/worker_config.h"

namespace psrt {

// The task from --cluster_spec/--job_name/--task_index or TF_CONFIG, and
// every other flag. InvalidArgument naming the flag (or the cluster spec's
// file and field) at fault; nothing is started. With --describe_model, the
// model's flags alone (the model is described without a cluster).
absl::StatusOr<WorkerConfig> WorkerConfigFromFlags();

}  // namespace psrt

#endif  // PSRT_WORKER_WORKER_FLAGS_H_
