// WorkerConfig: everything a worker task (psrt_worker) is asked to do,
// validated. It is the one product of the task's flags (worker_flags.h, the
// only reader of FLAGS_ in psrt_worker besides the shared task flags of
// common/task_flags.h) and the one input of the task (worker_task.h), so the
// task can be built and tested from a config without flags.
//
// Plain data; the pointers it holds (security) are shared and immutable.
#ifndef PSRT_WORKER_WORKER_CONFIG_H_
#define PSRT_WORKER_WORKER_CONFIG_H_

#include <cstdint>
#include <memory>
#include <string>

#include "common/cluster_spec.h"
#include "common/placement.h"
#include "common/transport_security.h"
#include "kernels/device.h"
#include "models/model.h"
#include "worker/input/input_factory.h"
#include "worker/ring/collective.h"
#include "worker/store/ps_client.h"
#include "worker/training/trainer.h"

namespace psrt {

struct WorkerConfig {
  // ---- Who this task is. ----
  ClusterConfig cluster;
  // TLS and tokens of every channel (the chief's token for the chief).
  std::shared_ptr<const TransportSecurity> security;
  // Allreduce mode (a ring of the workers, no ps tasks), else ps mode.
  bool allreduce = false;
  // Ps mode with the dense variables averaged by a ring of the workers and
  // the embedding tables on the ps tasks (worker/store/hybrid_store.h).
  bool dense_allreduce = false;
  bool uses_ring() const { return allreduce || dense_allreduce; }
  bool evaluator = false;
  int replica = 0;  // -1: the evaluator.
  int num_replicas = 1;  // Elastic workers (--max_workers): the replicas that may join.
  bool elastic = false;  // --max_workers: workers join and leave.
  absl::Duration elastic_lease = absl::Seconds(5);  // Elastic workers: the chief's lease.
  int restarts = 0;  // Times the launcher restarted this task.

  // ---- The model and where it runs. ----
  std::string model;
  ModelOptions model_options;  // Its device is chosen per tower.
  std::string device = "auto";  // auto, cpu or gpu.
  int num_gpus = 1;             // Towers (the evaluator runs one).
  kernels::GpuMath gpu_math = kernels::GpuMath::kFp32;
  kernels::GpuConv gpu_conv = kernels::GpuConv::kAuto;
  bool describe_model = false;  // Print the variables and stop.

  InputOptions input;

  // ---- Where the parameters live. ----
  PlacementOptions placement;
  // Ps mode. The task sets `metrics`.
  PsClient::Options ps_client;
  // Allreduce mode. The task sets `timeline`.
  Collective::Options ring;
  std::string checkpoint_dir;
  int64_t fusion_bytes = 4000000;

  // ---- Training. The task sets `metrics` and `timeline`. ----
  TrainerOptions trainer;
  // > 0: the exponential learning-rate decay happens every this many
  // epochs, so trainer.config's decay_steps comes from the training set's
  // size (ResolveDecayEpochs), and examples_per_step is what a global step
  // consumes.
  double decay_epochs = 0;
  double examples_per_step = 1;

  // ---- Telemetry. ----
  std::string bind_host;  // Empty: this task's host in the cluster spec.
  int metrics_port = 0;   // 0: no /metrics.
  std::string timeline_path;  // This replica's trace file; empty: none.
};

}  // namespace psrt

#endif  // PSRT_WORKER_WORKER_CONFIG_H_
