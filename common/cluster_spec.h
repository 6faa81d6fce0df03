// ClusterSpec: the static description of a psrt cluster, in TensorFlow's
// ClusterSpec JSON, and the identity of this process within it.
//
// Two shapes are accepted, from a file or from the TF_CONFIG variable:
//   {"ps": ["10.0.0.1:2222", "10.0.0.2:2222"], "worker": ["10.0.0.3:2222"]}
//   {"cluster": {"ps": [...], "worker": [...]},
//    "task": {"type": "worker", "index": 0}}
// Jobs: "ps" (none: an allreduce-mode job, worker/store/allreduce_store.h),
// "worker" (required unless "chief" is present),
// "chief" (at most one task) and "evaluator". Every address is "host:port"
// ("[v6addr]:port" for IPv6), unique across the whole cluster.
//
// Worker numbering: psrt numbers the training replicas 0..W-1. With a
// "chief" job the chief is replica 0 and worker i is replica i+1; without
// one, worker i is replica i and worker 0 is the chief.
//
// Thread safety: immutable after parsing; safe to share.
#ifndef PSRT_COMMON_CLUSTER_SPEC_H_
#define PSRT_COMMON_CLUSTER_SPEC_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace psrt {

struct TaskId {
  std::string job;  // "ps", "worker", "chief" or "evaluator".
  int index = 0;
  std::string ToString() const;  // "ps/0"
};

class ClusterSpec {
 public:
  // Parses either shape above. `source` names where the text came from
  // ("cluster spec file /tmp/c.json" or "TF_CONFIG") and starts every error
  // message (InvalidArgument), which also names the offending field, e.g.
  //   "cluster spec file c.json: job \"ps\" task 1: bad address \"x:99999\":
  //    port must be in 1..65535".
  // In the TF_CONFIG shape the top level may hold only "cluster", "task" and
  // "environment" (ignored), and "task" only "type" and "index". A job in
  // TensorFlow's dict form {"0": "host:port"} is refused: use a list.
  // When the text has a "task" member, task() returns it (validated).
  static absl::StatusOr<ClusterSpec> Parse(absl::string_view json,
                                           absl::string_view source);
  // Reads and parses a file; errors start "cluster spec file <path>: ".
  static absl::StatusOr<ClusterSpec> FromFile(const std::string& path);

  // Number of tasks of a job (0 when the job is absent).
  int num_tasks(absl::string_view job) const;
  // REQUIRES: 0 <= index < num_tasks(job).
  const std::string& address(absl::string_view job, int index) const;
  const std::map<std::string, std::vector<std::string>>& jobs() const {
    return jobs_;
  }
  const std::optional<TaskId>& task() const { return task_; }

  // Checks that `task` names an existing task; the error (InvalidArgument,
  // prefixed with the parse source) names the job, the index and the valid
  // range.
  absl::Status ValidateTask(const TaskId& task) const;

  int num_ps() const { return num_tasks("ps"); }
  // Number of training replicas: chief (if any) + workers.
  int num_replicas() const;
  // Replica number of a "chief" or "worker" task (see the header comment).
  // REQUIRES: ValidateTask(task).ok() and task.job is "chief" or "worker".
  int ReplicaIndex(const TaskId& task) const;
  // Address of replica r. REQUIRES: 0 <= replica < num_replicas().
  const std::string& ReplicaAddress(int replica) const;

 private:
  std::map<std::string, std::vector<std::string>> jobs_;
  std::optional<TaskId> task_;
  std::string source_;  // Prefix of ValidateTask's errors.
};

// Resolves the cluster and this process's task the way TensorFlow's classic
// examples do: `--cluster_spec=FILE` when `cluster_spec_path` is non-empty,
// otherwise the TF_CONFIG text `tf_config` (the caller reads the variable);
// `job_name`/`task_index` from flags override the TF_CONFIG task when
// job_name is non-empty. The file wins when both are given. Errors when
// neither source is given ("no cluster: pass --cluster_spec=FILE or set
// TF_CONFIG"), when no task is known, or when the task is out of range.
struct ClusterConfig {
  ClusterSpec spec;
  TaskId task;
};
absl::StatusOr<ClusterConfig> ResolveClusterConfig(
    const std::string& cluster_spec_path, const std::string& tf_config,
    const std::string& job_name, int task_index);

// Splits "host:port" / "[v6]:port" (host without brackets) into its parts;
// the port must be decimal in 1..65535. InvalidArgument text names the
// address, e.g. "bad address \"::1:2222\": IPv6 addresses must be
// bracketed, e.g. \"[::1]:2222\"".
absl::Status SplitHostPort(absl::string_view address, std::string* host,
                           int* port);

}  // namespace psrt

#endif  // PSRT_COMMON_CLUSTER_SPEC_H_
