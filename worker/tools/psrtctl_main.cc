// psrtctl: operate a psrt cluster from the command line.
//
//   psrtctl tasks --cluster_spec=FILE      one line per task: job index address
//   psrtctl make_spec --ps=N --workers=M [--hosts=h1,h2] [--out=FILE]
//   psrtctl status --cluster_spec=FILE     one line per task: state, health,
//                                          step, throughput, memory; under
//                                          a ps, a line per embedding table
//                                          and stripe: its rows and memory
//                                          (exit 1 if a task is unreachable)
//   psrtctl shutdown --cluster_spec=FILE   end training; the shards exit
//   psrtctl drain --address=HOST:PORT      that worker of an elastic job
//                                          (--max_workers) leaves it after
//                                          its current step
//   psrtctl health --address=HOST:PORT     exit 0 if that task's health
//                                          service says SERVING (a probe
//                                          that can carry TLS and the token)
//   psrtctl slurm_env --ps=N [--base_port=P]
//                                          inside an srun step: this task's
//                                          TF_CONFIG and role from Slurm's
//                                          variables (common/slurm_cluster.h),
//                                          as shell assignments for eval
//   psrtctl devices                        the GPUs the driver and the CUDA
//                                          runtime see, and whether the CUDA
//                                          kernels load (exit 1 if a CUDA
//                                          build's cannot, with dlopen's
//                                          reason)
//
// The cluster spec is validated exactly as the ps and worker binaries do it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/cluster_spec.h"
#include "common/placement.h"
#include "common/rpc_util.h"
#include "common/rank_cluster.h"
#include "common/slurm_cluster.h"
#include "common/task_flags.h"
#include "common/status_macros.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "kernels/device.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/psrt.grpc.pb.h"
#include "worker/store/ps_client.h"

DEFINE_string(cluster_spec, "", "ClusterSpec JSON file; empty: TF_CONFIG.");
DEFINE_int32(ps, 1,
             "make_spec, slurm_env: number of ps tasks (0: an allreduce-mode job).");
DEFINE_int32(workers, 1, "make_spec: number of worker tasks.");
DEFINE_string(hosts, "127.0.0.1",
              "make_spec: comma-separated hosts; tasks are spread over them in "
              "turn. Ports are free ports on 127.0.0.1/localhost, and "
              "--base_port + n on other hosts.");
DEFINE_int32(base_port, 2222,
             "make_spec: first port on hosts other than this one; slurm_env: a task "
             "listens on it plus its rank on its node.");
DEFINE_string(out, "", "make_spec: output file; empty: stdout.");
DEFINE_string(address, "", "health: the task to ask, HOST:PORT.");

namespace {

bool IsLocalHost(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

// A socket, closed with its owner.
class ScopedSocket {
 public:
  explicit ScopedSocket(int fd) : fd_(fd) {}
  ScopedSocket(ScopedSocket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  ScopedSocket& operator=(ScopedSocket&&) = delete;
  ~ScopedSocket() {
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  int fd_;
};

// A port that nothing is bound to on any interface, held (its socket stays
// bound, in `held`) so that the next call cannot get the same port. Drawn at
// random below the kernel's ephemeral range: a port from that range (the
// kernel's answer to a bind to port 0) can be taken, between the spec's
// writing and the task's bind, by any program's outgoing connection or bind
// to port 0. The kernel's choice when that range leaves no room below it.
absl::StatusOr<int> FreeLocalPort(std::vector<ScopedSocket>* held) {
  int ephemeral_low = 32768;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  constexpr int kLowest = 10000;
  std::mt19937 draw(std::random_device{}());
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = ephemeral_low > kLowest + 64
                         ? std::uniform_int_distribution<int>(kLowest, ephemeral_low - 1)(draw)
                         : 0;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return absl::InternalError("socket() failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(port);
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ::close(fd);
      continue;
    }
    held->emplace_back(fd);
    return ntohs(addr.sin_port);
  }
  return absl::InternalError("found no free port in 100 tries");
}

absl::StatusOr<psrt::ClusterSpec> LoadSpec() {
  if (!FLAGS_cluster_spec.empty()) return psrt::ClusterSpec::FromFile(FLAGS_cluster_spec);
  const char* tf_config = std::getenv("TF_CONFIG");
  if (tf_config == nullptr) {
    return absl::InvalidArgumentError("no cluster: pass --cluster_spec=FILE or set TF_CONFIG");
  }
  return psrt::ClusterSpec::Parse(tf_config, "TF_CONFIG");
}

absl::Status Tasks() {
  ASSIGN_OR_RETURN(psrt::ClusterSpec spec, LoadSpec());
  for (const auto& [job, addresses] : spec.jobs()) {
    for (size_t i = 0; i < addresses.size(); ++i) {
      std::printf("%s %zu %s\n", job.c_str(), i, addresses[i].c_str());
    }
  }
  return absl::OkStatus();
}

absl::Status MakeSpec() {
  if (FLAGS_ps < 0 || FLAGS_workers < 1) {
    return absl::InvalidArgumentError(
        "--workers must be at least 1, --ps at least 0 (0: an allreduce-mode job)");
  }
  std::vector<std::string> hosts = absl::StrSplit(FLAGS_hosts, ',', absl::SkipEmpty());
  if (hosts.empty()) return absl::InvalidArgumentError("--hosts is empty");
  std::vector<int> next_port(hosts.size(), FLAGS_base_port);
  std::vector<ScopedSocket> held;  // The ports chosen so far, until the spec is written.
  size_t next_host = 0;
  auto make_job = [&](int n) -> absl::StatusOr<std::vector<std::string>> {
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
      const size_t h = next_host++ % hosts.size();
      int port = 0;
      if (IsLocalHost(hosts[h])) {
        ASSIGN_OR_RETURN(port, FreeLocalPort(&held));
      } else {
        port = next_port[h]++;
      }
      const std::string host =
          hosts[h].find(':') != std::string::npos ? "[" + hosts[h] + "]" : hosts[h];
      out.push_back(absl::StrCat("\"", host, ":", port, "\""));
    }
    return out;
  };
  ASSIGN_OR_RETURN(std::vector<std::string> ps, make_job(FLAGS_ps));
  ASSIGN_OR_RETURN(std::vector<std::string> workers, make_job(FLAGS_workers));
  const std::string json = absl::StrCat(
      "{\n", ps.empty() ? "" : absl::StrCat("  \"ps\": [", absl::StrJoin(ps, ", "), "],\n"),
      "  \"worker\": [", absl::StrJoin(workers, ", "), "]\n}\n");
  RETURN_IF_ERROR(psrt::ClusterSpec::Parse(json, "generated spec").status());
  if (FLAGS_out.empty()) {
    std::fputs(json.c_str(), stdout);
    return absl::OkStatus();
  }
  std::ofstream out(FLAGS_out);
  out << json;
  if (!out.good()) return absl::InternalError("cannot write " + FLAGS_out);
  return absl::OkStatus();
}

// The flags' transport security, presenting the chief's token when given:
// an operator may end training.
absl::StatusOr<std::shared_ptr<const psrt::TransportSecurity>> OperatorSecurity() {
  ASSIGN_OR_RETURN(std::shared_ptr<const psrt::TransportSecurity> loaded,
                   psrt::TransportSecurityFromFlags(/*serves=*/false));
  return std::make_shared<const psrt::TransportSecurity>(loaded->ForChief());
}

// A client that only talks to the shards (no variables).
absl::StatusOr<std::unique_ptr<psrt::PsClient>> OperatorClient() {
  ASSIGN_OR_RETURN(psrt::ClusterSpec spec, LoadSpec());
  if (spec.num_ps() == 0) {
    return absl::FailedPreconditionError(
        "psrtctl shutdown ends a job through its parameter servers, and this cluster spec has "
        "none (an allreduce-mode job): stop its workers instead (Ctrl-C the launcher, or "
        "stop the tasks); started again, the job resumes from its --checkpoint_dir");
  }
  psrt::PsClient::Options options;
  for (int k = 0; k < spec.num_ps(); ++k) options.ps_addresses.push_back(spec.address("ps", k));
  options.replica = -1;
  options.rpc_timeout = absl::Seconds(5);
  ASSIGN_OR_RETURN(options.security, OperatorSecurity());
  ASSIGN_OR_RETURN(psrt::Placement placement,
                   psrt::ComputePlacement({}, spec.num_ps(), psrt::PlacementOptions()));
  return std::make_unique<psrt::PsClient>(options, std::move(placement),
                                          std::vector<psrt::VariableDef>());
}

// One task's line of `psrtctl status`, from the standard health service and
// the task's status RPC (GetStatus on a ps, GetWorkerStatus on the others).
struct TaskReport {
  bool reachable = false;
  std::string line;
};

constexpr absl::Duration kProbeTimeout = absl::Seconds(3);

std::string FormatProcess(const psrt::proto::ProcessStatus& process) {
  return absl::StrFormat("rss=%.1fMiB uptime=%.0fs restarts=%d",
                         process.resident_memory_bytes() / 1048576.0,
                         process.uptime_secs(), process.restarts());
}

// The task's overall health ("" service): SERVING, NOT_SERVING, ...
absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kProbeTimeout));
  grpc::health::v1::HealthCheckResponse response;
  RETURN_IF_ERROR(psrt::FromGrpcStatus(grpc::health::v1::Health::NewStub(channel)->Check(
      &context, grpc::health::v1::HealthCheckRequest(), &response)));
  return grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status());
}

// Asks `address` for its health, then calls `rpc` (a status RPC, with a
// deadline); returns the health, or the first error.
template <class Rpc>
absl::StatusOr<std::string> Probe(const std::string& address,
                                  const psrt::TransportSecurity& security, const Rpc& rpc) {
  auto channel = psrt::NewChannel(address, security);
  ASSIGN_OR_RETURN(std::string health, CheckHealth(channel));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kProbeTimeout));
  RETURN_IF_ERROR(psrt::FromGrpcStatus(rpc(channel, &context)));
  return health;
}

TaskReport Unreachable(const std::string& name, const std::string& address,
                       const absl::Status& status) {
  return {false, absl::StrFormat("%-12s %-22s unreachable  (%s)", name, address,
                                 status.message())};
}

TaskReport ProbePs(const std::string& name, const std::string& address,
                   const psrt::TransportSecurity& security) {
  psrt::proto::StatusResponse s;
  absl::StatusOr<std::string> health = Probe(
      address, security, [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context) {
        return psrt::proto::ParameterServer::NewStub(channel)->GetStatus(
            context, psrt::proto::StatusRequest(), &s);
      });
  if (!health.ok()) return Unreachable(name, address, health.status());
  const char* state = s.training_done() ? "done" : s.ready() ? "serving" : "not ready";
  std::string line = absl::StrFormat(
      "%-12s %-22s %-12s health=%s version=%d mode=%s gradients_accepted=%d "
      "stale_dropped=%d pushes/s=%.1f MB/s=%.1f %s",
      name, address, state, *health, s.version(), psrt::proto::SyncMode_Name(s.config().mode()),
      s.pushes_applied(), s.stale_pushes_dropped(), s.traffic().pushes_per_sec(),
      s.traffic().bytes_per_sec() / 1e6, FormatProcess(s.process()));
  // Each stripe's part of each embedding table, one line each (a status
  // call answers for the stripe it names: stripe 0 when it names none).
  for (int stripe = 0; stripe < std::max(1, s.stripes()); ++stripe) {
    psrt::proto::StatusResponse stripe_status;
    if (stripe > 0) {
      absl::StatusOr<std::string> probed = Probe(
          address, security,
          [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context) {
            context->AddMetadata(psrt::kStripeMetadata, std::to_string(stripe));
            return psrt::proto::ParameterServer::NewStub(channel)->GetStatus(
                context, psrt::proto::StatusRequest(), &stripe_status);
          });
      if (!probed.ok()) return Unreachable(name, address, probed.status());
    }
    for (const psrt::proto::TableStatus& table : (stripe > 0 ? stripe_status : s).tables()) {
      absl::StrAppendFormat(&line, "\n%-12s   table %s stripe=%d dim=%d rows=%d memory=%.1fMiB",
                            "", table.name(), stripe, table.dim(), table.rows(),
                            table.bytes() / 1048576.0);
      // Admission and eviction, when they have done anything.
      if (table.evicted_rows() + table.unadmitted_gradients() + table.candidates() > 0) {
        absl::StrAppendFormat(&line, " evicted=%d unadmitted_gradients=%d candidates=%d",
                              table.evicted_rows(), table.unadmitted_gradients(),
                              table.candidates());
      }
    }
  }
  return {true, line};
}

TaskReport ProbeWorker(const std::string& name, const std::string& address,
                       const psrt::TransportSecurity& security) {
  psrt::proto::WorkerStatusResponse s;
  absl::StatusOr<std::string> health = Probe(
      address, security, [&](const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext* context) {
        return psrt::proto::WorkerStatus::NewStub(channel)->GetWorkerStatus(
            context, psrt::proto::WorkerStatusRequest(), &s);
      });
  if (!health.ok()) return Unreachable(name, address, health.status());
  std::string state = absl::AsciiStrToLower(
      absl::StripPrefix(psrt::proto::WorkerState_Name(s.state()), "WORKER_"));
  return {true, absl::StrFormat(
                    "%-12s %-22s %-12s health=%s step=%d local_steps=%d examples/s=%.1f %s",
                    name, address, state, *health, s.global_step(), s.local_steps(),
                    s.examples_per_sec(), FormatProcess(s.process()))};
}

// One line per task, every task probed at once; fails when a task is
// unreachable (after printing every line).
absl::Status Status() {
  ASSIGN_OR_RETURN(psrt::ClusterSpec spec, LoadSpec());
  ASSIGN_OR_RETURN(std::shared_ptr<const psrt::TransportSecurity> loaded, OperatorSecurity());
  const auto security = loaded ? loaded : std::make_shared<const psrt::TransportSecurity>();
  std::vector<std::future<TaskReport>> reports;
  for (const char* job : {"ps", "chief", "worker", "evaluator"}) {
    auto found = spec.jobs().find(job);
    if (found == spec.jobs().end()) continue;
    for (size_t i = 0; i < found->second.size(); ++i) {
      const std::string name = absl::StrCat(job, "/", i);
      const std::string address = found->second[i];
      const bool ps = std::string(job) == "ps";
      reports.push_back(std::async(std::launch::async, [=] {
        return ps ? ProbePs(name, address, *security) : ProbeWorker(name, address, *security);
      }));
    }
  }
  int unreachable = 0;
  for (auto& future : reports) {
    TaskReport report = future.get();
    unreachable += report.reachable ? 0 : 1;
    std::printf("%s\n", report.line.c_str());
  }
  if (unreachable > 0) {
    return absl::UnavailableError(
        absl::StrCat(unreachable, " of ", reports.size(), " tasks unreachable"));
  }
  return absl::OkStatus();
}

// One task's health, as a Kubernetes exec probe asks it.
absl::Status Health() {
  if (FLAGS_address.empty()) return absl::InvalidArgumentError("--address is required");
  ASSIGN_OR_RETURN(std::shared_ptr<const psrt::TransportSecurity> security, OperatorSecurity());
  ASSIGN_OR_RETURN(std::string health,
                   CheckHealth(psrt::NewChannel(FLAGS_address, *security)));
  std::printf("%s %s\n", FLAGS_address.c_str(), health.c_str());
  if (health != "SERVING") return absl::UnavailableError(FLAGS_address + " is " + health);
  return absl::OkStatus();
}

// Asks one worker of an elastic job to leave it (WorkerStatus.Drain).
absl::Status Drain() {
  if (FLAGS_address.empty()) {
    return absl::InvalidArgumentError(
        "--address (the worker's, from the cluster spec) is required");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const psrt::TransportSecurity> security, OperatorSecurity());
  auto stub = psrt::proto::WorkerStatus::NewStub(psrt::NewChannel(FLAGS_address, *security));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  psrt::proto::DrainRequest request;
  psrt::proto::DrainResponse response;
  const absl::Status drained = psrt::FromGrpcStatus(stub->Drain(&context, request, &response));
  if (absl::IsUnimplemented(drained)) {  // gRPC says nothing more.
    return absl::InvalidArgumentError(absl::StrCat(
        FLAGS_address, " serves no worker's status service: --address must be a worker's (a ps "
        "task, or another program, listens there)"));
  }
  RETURN_IF_ERROR(drained);
  std::printf("drain: %s leaves after its current step\n", FLAGS_address.c_str());
  return absl::OkStatus();
}

// One line: devices: cuda_build=yes|no driver_gpus=N cuda_kernels=loaded
// runtime_gpus=N cudnn=VERSION (or cudnn=not_loaded, with the reason on a
// second line: GPUs then convolve through im2col), or
// cuda_kernels=not_loaded (reason) and an error.
absl::Status Devices() {
  const bool cuda = psrt::kernels::BuiltWithCuda();
  std::printf("devices: cuda_build=%s driver_gpus=%d", cuda ? "yes" : "no",
              psrt::kernels::VisibleGpuCount());
  if (!cuda) {
    std::printf("\n");
    return absl::OkStatus();
  }
  absl::StatusOr<int> runtime_gpus = psrt::kernels::LoadCudaKernels();
  if (!runtime_gpus.ok()) {
    std::printf(" cuda_kernels=not_loaded\n");
    return runtime_gpus.status();
  }
  std::printf(" cuda_kernels=loaded runtime_gpus=%d", *runtime_gpus);
  absl::StatusOr<std::string> cudnn = psrt::kernels::CudnnVersion();
  if (cudnn.ok()) {
    std::printf(" cudnn=%s\n", cudnn->c_str());
  } else {
    std::printf(" cudnn=not_loaded\ncudnn: %s\n", std::string(cudnn.status().message()).c_str());
  }
  return absl::OkStatus();
}

// Inside an srun step: two shell assignments, TF_CONFIG (exported) and
// PSRT_TASK_TYPE ("ps" or "worker"), for scripts/slurm/psrt_task.sh's eval.
// Single quotes are safe: the JSON holds none (host names are checked).
absl::Status SlurmEnv() {
  psrt::SlurmClusterOptions options;
  options.num_ps = FLAGS_ps;
  options.base_port = FLAGS_base_port;
  ASSIGN_OR_RETURN(psrt::ClusterConfig config,
                   psrt::ClusterFromSlurm([](const char* name) { return std::getenv(name); },
                                          options));
  std::printf("export TF_CONFIG='%s'\nPSRT_TASK_TYPE=%s\n", psrt::ToTfConfig(config).c_str(),
              config.task.job.c_str());
  return absl::OkStatus();
}

absl::Status Shutdown() {
  ASSIGN_OR_RETURN(auto client, OperatorClient());
  RETURN_IF_ERROR(client->WaitForServers(absl::Seconds(5)));
  RETURN_IF_ERROR(client->Shutdown());
  std::printf("shutdown: every ps (%d) ended training\n", client->num_shards());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "psrtctl tasks|make_spec|status|shutdown|drain|health|devices|slurm_env [flags]; see "
      "--help");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  const std::string command = argc > 1 ? argv[1] : "";
  absl::Status status;
  if (command == "tasks") {
    status = Tasks();
  } else if (command == "make_spec") {
    status = MakeSpec();
  } else if (command == "status") {
    status = Status();
  } else if (command == "shutdown") {
    status = Shutdown();
  } else if (command == "health") {
    status = Health();
  } else if (command == "drain") {
    status = Drain();
  } else if (command == "devices") {
    status = Devices();
  } else if (command == "slurm_env") {
    status = SlurmEnv();
  } else {
    std::fprintf(stderr,
                 "usage: psrtctl tasks|make_spec|status|shutdown|drain|health|devices|slurm_env "
                 "[flags]\n");
    return 2;
  }
  if (!status.ok()) {
    std::fprintf(stderr, "psrtctl %s: %s\n", command.c_str(),
                 std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
