// The psrt cluster of a Slurm job step, from the variables srun gives each
// task, the way TensorFlow's SlurmClusterResolver reads them:
//   SLURM_STEP_NODELIST        the step's nodes, in Slurm's hostlist syntax
//                              ("gpu[01-04,07],n3")
//   SLURM_STEP_TASKS_PER_NODE  tasks on each of them ("2(x3),1")
//   SLURM_PROCID               this task's rank, 0..SLURM_STEP_NUM_TASKS-1
//   SLURM_LOCALID              its rank on its node
// The job's variables (SLURM_JOB_NODELIST, ...) are not read: a batch script
// has them but is no step. Ranks are laid out as
// SLURM_DISTRIBUTION says: node by node (block, srun's default) or in turn
// (cyclic, sbatch's default); rank r listens on its node's name at
// base_port + its rank on that node. Roles go by rank: ranks 0..num_ps-1 are
// ps/0.., the rest worker/0.. (worker/0 the chief).
//
// Thread safety: functions of their arguments only.
#ifndef PSRT_COMMON_SLURM_CLUSTER_H_
#define PSRT_COMMON_SLURM_CLUSTER_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cluster_spec.h"

namespace psrt {

// The host names of a Slurm hostlist, in its order: comma-separated names,
// each with any number of bracketed ranges ("n[1-3,7]", "r[1-2]-n[01-02]",
// the last varying fastest); a range keeps the width of its first number
// ("[08-10]" is 08, 09, 10). InvalidArgument naming the list and the fault.
absl::StatusOr<std::vector<std::string>> ExpandSlurmHostlist(absl::string_view hostlist);

// One task count per node from Slurm's compressed form: "2(x3),1" is
// {2, 2, 2, 1}. InvalidArgument naming the text.
absl::StatusOr<std::vector<int>> ExpandSlurmTasksPerNode(absl::string_view counts);

struct SlurmClusterOptions {
  int num_ps = 0;         // Ranks 0..num_ps-1 are the ps tasks.
  int base_port = 2222;   // A task listens on base_port + its local rank.
};

// The job step's cluster and this task, from the variables `getenv` returns
// (null for an unset one). InvalidArgument naming the variable at fault: one
// missing (not inside an srun step), malformed, or inconsistent with the
// others (a rank out of range, a task count that the nodes do not add up
// to, a distribution other than block).
absl::StatusOr<ClusterConfig> ClusterFromSlurm(
    const std::function<const char*(const char*)>& getenv, const SlurmClusterOptions& options);

}  // namespace psrt

#endif  // PSRT_COMMON_SLURM_CLUSTER_H_
