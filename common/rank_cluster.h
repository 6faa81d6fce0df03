// A cluster of numbered tasks ("ranks"), as cluster managers that give each
// process only a rank make it (Slurm's srun, mpirun, a Kubernetes Indexed
// Job; common/slurm_cluster.h, common/rendezvous.h): ranks 0..num_ps-1 are
// ps/0.., the rest worker/0.. (worker/0, rank num_ps, is the chief), as
// TensorFlow's SlurmClusterResolver assigns them.
//
// Thread safety: functions of their arguments only.
#ifndef PSRT_COMMON_RANK_CLUSTER_H_
#define PSRT_COMMON_RANK_CLUSTER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cluster_spec.h"

namespace psrt {

// The cluster of `addresses` (rank r's "host:port" at r) and rank `rank`'s
// task in it. InvalidArgument, starting with `source`, for no worker left
// (num_ps >= addresses.size()), a rank out of range, or an address the
// cluster spec refuses (malformed, or two ranks on one address).
absl::StatusOr<ClusterConfig> ClusterOfRanks(const std::vector<std::string>& addresses,
                                             int num_ps, int rank, absl::string_view source);

// TF_CONFIG's JSON for `config`: {"cluster": {...}, "task": {...}}, which
// ClusterSpec::Parse reads back.
std::string ToTfConfig(const ClusterConfig& config);

}  // namespace psrt

#endif  // PSRT_COMMON_RANK_CLUSTER_H_
