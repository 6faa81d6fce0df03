// The flags every psrt binary that speaks gRPC shares (psrt_ps,
// psrt_worker, psrtctl, pushpull_bench), defined once here instead of in
// each main file:
//
//   --tls_cert=FILE --tls_key=FILE --tls_ca=FILE   mutual TLS
//   --auth_token_file=FILE                         the shared auth token
//   PSRT_AUTH_TOKEN=TOKEN (environment)            the token, instead of a file
//   --chief_token_file=FILE, PSRT_CHIEF_TOKEN      the chief's own token (roles)
//   --ps_stripes=S                                 shards per ps process
//   --ps_replicas=0|1                              a backup copy of each shard
//   --bind_host=HOST                               the interface tasks listen on
//   --tensor_transport=grpc|socket, --data_port=P,
//   --local_data_plane                             the tensor data plane
//   --coordinator=HOST:PORT (or MASTER_ADDR and MASTER_PORT), --task_rank,
//   --num_tasks, --num_ps, --task_port, --advertise_host,
//   --rendezvous_timeout_secs                      a rendezvous (rendezvous.h)
//
// This file belongs to the binaries' side of the "flags are read only in
// main" rule: library code takes a TransportSecurity, never these flags.
#ifndef PSRT_COMMON_TASK_FLAGS_H_
#define PSRT_COMMON_TASK_FLAGS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/cluster_spec.h"
#include "common/tensor_transport.h"
#include "common/transport_security.h"

namespace psrt {

// Loads the transport security the flags and PSRT_AUTH_TOKEN ask for (see
// LoadTransportSecurity for the checks), and logs what is on; a task that
// `serves` RPCs warns when nothing is. Call it at start, after gflags has
// parsed the command line.
absl::StatusOr<std::shared_ptr<const TransportSecurity>> TransportSecurityFromFlags(
    bool serves = true);

// The cluster and this task: from --cluster_spec=FILE (`cluster_spec`, with
// `job_name` and `task_index`), else TF_CONFIG, else a rendezvous when one is
// asked for (--coordinator, or MASTER_ADDR and MASTER_PORT), whose rank and
// number of tasks come from the flags or from mpirun's, PMIx's, torchrun's,
// an Indexed Job's or Slurm's variables (each error names the flag or the
// variable). `security` authenticates the rendezvous. A --task_index given
// without --job_name replaces the index of the spec's own "task".
absl::StatusOr<ClusterConfig> ClusterConfigFromFlags(
    const std::string& cluster_spec, const std::string& job_name, int task_index,
    std::shared_ptr<const TransportSecurity> security);

// --bind_host: the interface a task listens on; empty: its host in the
// cluster (ListenHost in common/rpc_util.h).
std::string BindHostFromFlags();

// --tensor_transport: how pushes, pulls and ring segments move tensors.
absl::StatusOr<TensorTransport> TensorTransportFromFlags();
// --data_port: a ps's (or an allreduce worker's) data-plane port (0: any).
// InvalidArgument outside 0..65535.
absl::StatusOr<int> DataPortFromFlags();
// --local_data_plane: whether a ps's (or an allreduce worker's) data plane
// is also served on a Unix socket of its own for peers on its host.
bool LocalDataPlaneFromFlags();

// --ps_stripes: how many shards each ps process serves (proto/psrt.proto's
// "Stripes"); every ps task of a job must be given the same (a worker not
// given it asks them: worker_task.cc). InvalidArgument outside
// 1..kMaxPsStripes.
absl::StatusOr<int> PsStripesFromFlags();
constexpr int kMaxPsStripes = 16;
// --ps_replicas: backup copies of each shard (0 or 1); InvalidArgument
// otherwise.
absl::StatusOr<int> PsReplicasFromFlags();

}  // namespace psrt

#endif  // PSRT_COMMON_TASK_FLAGS_H_
