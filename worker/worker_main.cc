// psrt_worker: one training replica (a "worker" or "chief" task), or the
// "evaluator" task.
//
//   psrt_worker --cluster_spec=cluster.json --job_name=worker --task_index=0 \
//       --sync_replicas --train_steps=2000
//
// The flags become a validated WorkerConfig (worker_flags.h), which the task
// builds and runs (worker_task.h). Exit status: 0 when training ended, 1 on
// an error, kernels::kDeviceFaultExitCode (200) when a GPU faulted, which
// launch.sh --restart_policy=ExitCode retries (a fresh process gets a fresh
// CUDA context).
#include "absl/status/status.h"
#include "common/rpc_util.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "kernels/device_fault.h"
#include "worker/worker_flags.h"
#include "worker/worker_task.h"

namespace {

absl::Status Main() {
  absl::StatusOr<psrt::WorkerConfig> config = psrt::WorkerConfigFromFlags();
  if (!config.ok()) return config.status();
  if (config->describe_model) return psrt::DescribeModel(*config);
  return psrt::RunWorkerTask(*std::move(config));
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("psrt worker task");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  psrt::KeepLargeAllocationsMapped();
  const absl::Status status = Main();
  if (!status.ok()) {
    LOG(ERROR) << status.message();
    return psrt::kernels::IsDeviceFault(status) ? psrt::kernels::kDeviceFaultExitCode : 1;
  }
  return 0;
}
