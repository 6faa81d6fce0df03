#include "common/task_flags.h"

#include <unistd.h>

#include <cstdlib>
#include <initializer_list>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rendezvous.h"
#include "common/status_macros.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_string(tls_cert, "",
              "PEM certificate (chain) this task presents to its peers, signed "
              "by --tls_ca. With --tls_key and --tls_ca: mutual TLS on every "
              "connection (scripts/make_test_certs.sh makes test ones).");
DEFINE_string(tls_key, "", "PEM private key of --tls_cert (unencrypted; chmod 600).");
DEFINE_string(tls_ca, "",
              "PEM certificate of the cluster's CA: peers must present a "
              "certificate it signed, and servers one naming their host.");
DEFINE_string(auth_token_file, "",
              "File holding the cluster's shared auth token (one line); every "
              "RPC must carry it. The PSRT_AUTH_TOKEN environment variable "
              "works instead. Empty and unset: no token.");

DEFINE_string(chief_token_file, "",
              "File holding the chief's own token (one line), besides the "
              "workers' --auth_token_file: parameter servers then take Init, "
              "Save, Restore and the end of training only from calls with it. "
              "Give it to the chief, the ps tasks and operators (psrtctl), not "
              "to other workers. PSRT_CHIEF_TOKEN works instead.");
DEFINE_int32(ps_stripes, 2,
             "Shards each ps process serves, each over its own connection: a "
             "large model then moves as several concurrent streams. Give every "
             "ps task of a job the same value; workers and the evaluator not "
             "given it ask the ps tasks at start. A job "
             "may resume with another value: its checkpoint is resharded "
             "(docs/checkpoints-and-recovery.md). Shards left without a "
             "variable (a small model) just move with the others.");
DEFINE_int32(ps_replicas, 0,
             "1: every shard has a backup copy on the next ps task, which takes "
             "over (no rollback, no step lost) when the shard's ps task dies; "
             "needs 2 or more ps tasks. Give the ps tasks and every worker the "
             "same value (launch.sh: --ps_flags=--ps_replicas=1 and after --).");

DEFINE_string(bind_host, "",
              "Interface the task listens on (the port comes from the cluster "
              "spec), and --metrics_port's and a rendezvous's at rank 0; empty: "
              "the host the spec (or --coordinator) names. 0.0.0.0: every "
              "interface (containers, whose spec names a service address).");
DEFINE_string(tensor_transport, "auto",
              "How pushes and pulls move tensors: data_plane (psrt's data plane: "
              "connections of its own beside gRPC, which keeps the control "
              "plane; frames gathered from and received into the tensors; "
              "`socket` is its old name), grpc (inside gRPC messages), or auto: "
              "data_plane without TLS, grpc with TLS (the data plane has no TLS; "
              "data_plane with TLS on is refused at start). A ps serves the data "
              "plane with data_plane and auto (no TLS); "
              "a worker with auto uses it when every ps task serves it. In "
              "allreduce mode the ring's segments take it too (every worker "
              "must choose alike).");
DEFINE_int32(data_port, 0,
             "ps, and workers in allreduce mode: the TCP port of the data plane "
             "(--tensor_transport=data_plane) on the task's host; 0: any free one "
             "(the others learn it from the task: a ps's status, a worker's "
             "answer to a ping).");
DEFINE_bool(local_data_plane, true,
            "ps, and workers in allreduce mode: also serve the data plane on an "
            "abstract Unix socket of a name of this process alone, which peers "
            "on this host (network namespace) learn from it and take instead of "
            "TCP; false: TCP only (a relay or shaper in front of the task that "
            "every peer must pass).");
DEFINE_string(coordinator, "",
              "HOST:PORT of a rendezvous (common/rendezvous.h), for managers that "
              "give each task only a rank and the number of tasks (mpirun, a "
              "Kubernetes Indexed Job): rank 0 serves it there, the others "
              "register with it, and every task gets the cluster. Empty: "
              "MASTER_ADDR:MASTER_PORT when both are set. Used only without "
              "--cluster_spec and TF_CONFIG.");
DEFINE_int32(task_rank, -1,
             "Rendezvous: this task's rank; -1: from OMPI_COMM_WORLD_RANK, "
             "PMIX_RANK, RANK, JOB_COMPLETION_INDEX or SLURM_PROCID.");
DEFINE_int32(num_tasks, 0,
             "Rendezvous: the number of tasks; 0: from OMPI_COMM_WORLD_SIZE, "
             "WORLD_SIZE or SLURM_NTASKS.");
DEFINE_int32(num_ps, 0,
             "Rendezvous: ranks 0..num_ps-1 are the ps tasks, the others "
             "workers (worker/0, rank num_ps, the chief); 0: an allreduce job.");
DEFINE_int32(task_port, 2222,
             "Rendezvous: this task serves on this port plus its rank on its "
             "host (OMPI_COMM_WORLD_LOCAL_RANK, LOCAL_RANK or SLURM_LOCALID).");
DEFINE_string(advertise_host, "",
              "Rendezvous: the host name the other tasks reach this one at; "
              "empty: this machine's host name.");
DEFINE_double(rendezvous_timeout_secs, 300,
              "Rendezvous: how long the tasks wait for each other.");

namespace psrt {
namespace {

// The first of `names` that is set, as "NAME=value"; empty if none.
std::string FirstVariable(std::initializer_list<const char*> names, int* value,
                          std::string* error) {
  for (const char* name : names) {
    const char* text = std::getenv(name);
    if (text == nullptr) continue;
    if (!absl::SimpleAtoi(text, value) || *value < 0) {
      *error = absl::StrCat(name, "=\"", text, "\" is not a whole number");
    }
    return absl::StrCat(name, "=", text);
  }
  return "";
}

bool RendezvousRequested() {
  return !FLAGS_coordinator.empty() ||
         (std::getenv("MASTER_ADDR") != nullptr && std::getenv("MASTER_PORT") != nullptr);
}

absl::StatusOr<ClusterConfig> ClusterFromRendezvousFlags(
    std::shared_ptr<const TransportSecurity> security) {
  RendezvousOptions options;
  options.coordinator = FLAGS_coordinator.empty()
                            ? absl::StrCat(std::getenv("MASTER_ADDR"), ":",
                                           std::getenv("MASTER_PORT"))
                            : FLAGS_coordinator;
  std::string error;
  options.rank = FLAGS_task_rank;
  if (options.rank < 0 &&
      FirstVariable({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK", "JOB_COMPLETION_INDEX",
                     "SLURM_PROCID"},
                    &options.rank, &error)
          .empty()) {
    return absl::InvalidArgumentError(
        "rendezvous: no rank: pass --task_rank, or start the task with mpirun, torchrun's "
        "variables (RANK), a Kubernetes Indexed Job or srun");
  }
  options.world_size = FLAGS_num_tasks;
  if (options.world_size <= 0 &&
      FirstVariable({"OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS"}, &options.world_size,
                    &error)
          .empty()) {
    return absl::InvalidArgumentError(
        "rendezvous: no number of tasks: pass --num_tasks (a Kubernetes Indexed Job's "
        "completions), or start the task with mpirun, torchrun's variables (WORLD_SIZE) or srun");
  }
  int local_rank = 0;
  FirstVariable({"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"}, &local_rank,
                &error);
  if (!error.empty()) return absl::InvalidArgumentError("rendezvous: " + error);
  std::string host = FLAGS_advertise_host;
  if (host.empty()) {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) {
      return absl::InternalError("rendezvous: cannot read this machine's host name: pass "
                                 "--advertise_host");
    }
    host = name;
  }
  if (FLAGS_task_port + local_rank < 1 || FLAGS_task_port + local_rank > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--task_port=", FLAGS_task_port,
                                                   " + local rank ", local_rank,
                                                   " is not a port (1..65535)"));
  }
  options.address = absl::StrCat(host.find(':') != std::string::npos ? "[" + host + "]" : host,
                                 ":", FLAGS_task_port + local_rank);
  options.num_ps = FLAGS_num_ps;
  options.listen_host = FLAGS_bind_host;
  options.timeout = absl::Seconds(FLAGS_rendezvous_timeout_secs);
  options.security = std::move(security);
  LOG(INFO) << "rendezvous: rank " << options.rank << " of " << options.world_size << " at "
            << options.address << ", coordinator " << options.coordinator;
  return Rendezvous(options);
}

}  // namespace

absl::StatusOr<ClusterConfig> ClusterConfigFromFlags(
    const std::string& cluster_spec, const std::string& job_name, int task_index,
    std::shared_ptr<const TransportSecurity> security) {
  const char* tf_config = std::getenv("TF_CONFIG");
  if (cluster_spec.empty() && tf_config == nullptr && RendezvousRequested()) {
    return ClusterFromRendezvousFlags(std::move(security));
  }
  ASSIGN_OR_RETURN(ClusterConfig config, ResolveClusterConfig(cluster_spec, tf_config ? tf_config : "",
                                                              job_name, task_index));
  // --task_index alone overrides the index of the "task" the spec gives
  // (with --job_name, both are the task already).
  gflags::CommandLineFlagInfo index_flag;
  if (job_name.empty() && gflags::GetCommandLineFlagInfo("task_index", &index_flag) &&
      !index_flag.is_default && config.task.index != task_index) {
    config.task.index = task_index;
    RETURN_IF_ERROR(config.spec.ValidateTask(config.task));
  }
  return config;
}

std::string BindHostFromFlags() { return FLAGS_bind_host; }

absl::StatusOr<TensorTransport> TensorTransportFromFlags() {
  if (FLAGS_tensor_transport == "auto") return TensorTransport::kAuto;
  if (FLAGS_tensor_transport == "grpc") return TensorTransport::kGrpc;
  if (FLAGS_tensor_transport == "data_plane" || FLAGS_tensor_transport == "socket") {
    return TensorTransport::kDataPlane;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--tensor_transport must be auto, data_plane (or socket) or grpc, got \"", FLAGS_tensor_transport,
      "\""));
}

absl::StatusOr<int> DataPortFromFlags() {
  if (FLAGS_data_port < 0 || FLAGS_data_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data_port must be in 0..65535, got ", FLAGS_data_port));
  }
  return FLAGS_data_port;
}

bool LocalDataPlaneFromFlags() { return FLAGS_local_data_plane; }

absl::StatusOr<int> PsStripesFromFlags() {
  if (FLAGS_ps_stripes < 1 || FLAGS_ps_stripes > kMaxPsStripes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ps_stripes must be in 1..", kMaxPsStripes, ", got ", FLAGS_ps_stripes));
  }
  return FLAGS_ps_stripes;
}

absl::StatusOr<int> PsReplicasFromFlags() {
  if (FLAGS_ps_replicas != 0 && FLAGS_ps_replicas != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ps_replicas must be 0 or 1, got ", FLAGS_ps_replicas));
  }
  return FLAGS_ps_replicas;
}

absl::StatusOr<std::shared_ptr<const TransportSecurity>> TransportSecurityFromFlags(
    bool serves) {
  TransportSecurityOptions options;
  options.tls_cert_file = FLAGS_tls_cert;
  options.tls_key_file = FLAGS_tls_key;
  options.tls_ca_file = FLAGS_tls_ca;
  options.auth_token_file = FLAGS_auth_token_file;
  if (const char* token = std::getenv("PSRT_AUTH_TOKEN")) options.auth_token = token;
  options.chief_token_file = FLAGS_chief_token_file;
  if (const char* token = std::getenv("PSRT_CHIEF_TOKEN")) options.chief_token = token;
  ASSIGN_OR_RETURN(TransportSecurity security, LoadTransportSecurity(options));
  if (security.has_auth_token() && !security.tls()) {
    LOG(WARNING) << "auth token without TLS: the token travels in cleartext; "
                    "add --tls_cert, --tls_key and --tls_ca on untrusted networks";
  }
  if (security.tls() || security.has_auth_token()) {
    LOG(INFO) << "transport security: " << security.Describe();
  } else if (serves) {
    LOG(WARNING) << "no TLS and no auth token: anyone who can reach this task's port can "
                    "push, pull, checkpoint, restore or end the job. Fine on a trusted "
                    "network or one machine; elsewhere set --tls_cert, --tls_key and "
                    "--tls_ca and an auth token (--auth_token_file or PSRT_AUTH_TOKEN; "
                    "scripts/make_test_certs.sh makes a test CA)";
  }
  return std::make_shared<const TransportSecurity>(std::move(security));
}

}  // namespace psrt
