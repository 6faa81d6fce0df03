// Fuzzes the cluster spec / TF_CONFIG parser (common/cluster_spec.h) with
// the input as JSON text, and checks what a parsed spec promises: every
// address splits, every replica and the TF_CONFIG task resolve.
#include <string>

#include "common/cluster_spec.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  std::string host;
  int port = 0;
  if (psrt::SplitHostPort(text, &host, &port).ok()) {
    CHECK(port >= 1 && port <= 65535) << port;
    CHECK(!host.empty());
  }

  absl::StatusOr<psrt::ClusterSpec> spec = psrt::ClusterSpec::Parse(text, "fuzz");
  // The TF_CONFIG path: the same text, the task from it or from flags.
  absl::StatusOr<psrt::ClusterConfig> config =
      psrt::ResolveClusterConfig("", std::string(text), "", 0);
  if (!spec.ok()) {
    CHECK(!config.ok());
    return 0;
  }
  CHECK_GE(spec->num_ps(), 0);  // 0: an allreduce-mode job.
  CHECK_GT(spec->num_replicas(), 0);
  for (const auto& [job, addresses] : spec->jobs()) {
    CHECK_EQ(spec->num_tasks(job), static_cast<int>(addresses.size()));
    for (int i = 0; i < spec->num_tasks(job); ++i) {
      CHECK(psrt::SplitHostPort(spec->address(job, i), &host, &port).ok());
      CHECK(spec->ValidateTask({job, i}).ok());
    }
    CHECK(!spec->ValidateTask({job, spec->num_tasks(job)}).ok());
  }
  for (int r = 0; r < spec->num_replicas(); ++r) spec->ReplicaAddress(r);
  if (spec->task().has_value()) {
    CHECK(config.ok()) << config.status();
    CHECK(spec->ValidateTask(*spec->task()).ok());
    const psrt::TaskId& task = config->task;
    if (task.job == "chief" || task.job == "worker") {
      const int replica = spec->ReplicaIndex(task);
      CHECK_EQ(spec->ReplicaAddress(replica), spec->address(task.job, task.index));
    }
  } else {
    CHECK(!config.ok());
  }
  // --job_name=worker --task_index=1 overriding the TF_CONFIG task.
  if (spec->ValidateTask({"worker", 1}).ok()) spec->ReplicaIndex({"worker", 1});
  return 0;
}
