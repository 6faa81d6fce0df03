// psrt_ps: one parameter-server task.
//
//   psrt_ps --cluster_spec=cluster.json --job_name=ps --task_index=0
//
// Serves its shards (--ps_stripes of them: shards T*S .. T*S+S-1 of task T),
// and with --ps_replicas=1 the backup copies of task T-1's after them,
// until the chief ends training and every worker has said goodbye (or
// --shutdown_grace_secs have passed), then exits 0.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "common/cpu_budget.h"
#include "common/health_reporter.h"
#include "common/metrics.h"
#include "common/rpc_util.h"
#include "common/task_flags.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "ps/parameter_shard.h"
#include "dataplane/frame_connection.h"
#include "ps/dataplane_server.h"
#include "ps/ps_service.h"
#include "ps/grpc_replica_peer.h"

DEFINE_bool(check_replica_certificates, false,
            "With TLS: take a push as replica r only from a caller whose certificate names "
            "replica r's host as the cluster spec writes it, so a worker pushes only as "
            "itself (give each host its own certificate; tasks on one host share it).");
DEFINE_string(cluster_spec, "",
              "ClusterSpec JSON file (TensorFlow's format, or TF_CONFIG's). "
              "Empty: read the TF_CONFIG environment variable.");
DEFINE_string(job_name, "", "This task's job; must be \"ps\". Empty: from TF_CONFIG.");
DEFINE_int32(task_index, 0, "This task's index within its job.");
DEFINE_double(shutdown_grace_secs, 30,
              "After the chief ends training, wait at most this long for the "
              "other workers to say goodbye before exiting.");
DEFINE_double(chief_timeout_secs, 1800,
              "Once the shards hold a model, exit with an error when the chief "
              "has not pushed or pulled (or called Init, Save or Restore) for "
              "this long and has not ended training: it failed and nobody "
              "restarted it. A pull of the chief's that waits counts as word "
              "from it; keep this above its longest evaluation.");
DEFINE_string(checkpoint_dir, "",
              "Directory of this task's checkpoints (a file per stripe): the "
              "chief's saves go there, and at start each stripe restores its "
              "newest intact one.");
DEFINE_int64(max_grpc_memory_mb, 0,
             "Hold gRPC's buffers of all connections together to this many MB (0: no "
             "bound): a request that does not fit is refused with RESOURCE_EXHAUSTED. Size "
             "it to the largest push times the workers, with room to spare.");
DEFINE_int64(max_message_mb, 2048,
             "Largest request accepted, in MiB; larger ones are refused "
             "before they are buffered.");
DEFINE_int32(max_waiting_pulls, 1024,
             "Pulls that may wait for a version at once, per stripe; more are "
             "refused (RESOURCE_EXHAUSTED), so that a flood of pulls cannot "
             "grow memory or slow every push.");
DEFINE_int32(threads, 0, "Threads that apply updates, per stripe; 0: one per core.");
DEFINE_string(nonfinite_gradients, "reject",
              "A pushed gradient holding NaN or Inf is never applied: "
              "\"reject\" fails the push (the worker stops with the error), "
              "\"skip\" drops it and counts it (psrtctl status).");

DEFINE_int32(metrics_port, 0,
             "Serve Prometheus metrics on http://--bind_host:PORT/metrics; "
             "0: off.");
DEFINE_bool(unix_socket, false,
            "Also serve gRPC on the abstract Unix socket psrt-PORT, for workers "
            "on this host (psrt_worker --unix_socket), with the same credentials "
            "(workers with TLS stay on TCP).");
DEFINE_double(pull_timeout_secs, 300,
              "How long a pull may wait for the next version when the worker "
              "names no timeout.");

int main(int argc, char** argv) {
  gflags::SetUsageMessage("psrt parameter-server task");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  psrt::KeepLargeAllocationsMapped();

  absl::StatusOr<std::shared_ptr<const psrt::TransportSecurity>> security =
      psrt::TransportSecurityFromFlags();
  if (!security.ok()) {
    LOG(ERROR) << security.status().message();
    return 2;
  }
  absl::StatusOr<psrt::ClusterConfig> cluster = psrt::ClusterConfigFromFlags(
      FLAGS_cluster_spec, FLAGS_job_name, FLAGS_task_index, *security);
  if (!cluster.ok()) {
    LOG(ERROR) << cluster.status().message();
    return 2;
  }
  if (cluster->task.job != "ps") {
    LOG(ERROR) << "psrt_ps runs ps tasks, but this task is "
               << cluster->task.ToString() << " (use psrt_worker)";
    return 2;
  }
  const std::string& address = cluster->spec.address("ps", cluster->task.index);
  std::string host;
  int port = 0;
  if (absl::Status s = psrt::SplitHostPort(address, &host, &port); !s.ok()) {
    LOG(ERROR) << s.message();
    return 2;
  }

  if (FLAGS_max_grpc_memory_mb < 0) {
    LOG(ERROR) << "--max_grpc_memory_mb must be 0 (no bound) or positive, got "
               << FLAGS_max_grpc_memory_mb;
    return 2;
  }
  if (FLAGS_max_message_mb < 1 || FLAGS_max_message_mb > 2048) {
    LOG(ERROR) << "--max_message_mb must be in 1..2048 (gRPC caps a message below 2 GiB), got "
               << FLAGS_max_message_mb;
    return 2;
  }
  if (FLAGS_max_waiting_pulls < 1) {
    LOG(ERROR) << "--max_waiting_pulls must be positive, got " << FLAGS_max_waiting_pulls;
    return 2;
  }
  if (FLAGS_nonfinite_gradients != "reject" && FLAGS_nonfinite_gradients != "skip") {
    LOG(ERROR) << "--nonfinite_gradients must be reject or skip, got \""
               << FLAGS_nonfinite_gradients << "\"";
    return 2;
  }

  // Telemetry: metrics (served with --metrics_port), status and health.
  int restarts = 0;
  if (const char* count = std::getenv("PSRT_RESTART_COUNT")) absl::SimpleAtoi(count, &restarts);
  psrt::Metrics metrics({"ps", cluster->task.index, restarts});
  psrt::PsMetrics ps_metrics(&metrics);
  if (FLAGS_metrics_port > 0) {
    if (absl::Status s = metrics.Serve(psrt::ListenHost(psrt::BindHostFromFlags(), host),
                                       FLAGS_metrics_port);
        !s.ok()) {
      LOG(ERROR) << "--metrics_port: " << s.message();
      return 2;
    }
  }
  psrt::HealthReporter health({psrt::proto::ParameterServer::service_full_name()});
  psrt::HealthReporter::EnableHealthService();

  absl::StatusOr<int> stripes = psrt::PsStripesFromFlags();
  if (!stripes.ok()) {
    LOG(ERROR) << stripes.status().message();
    return 2;
  }
  absl::StatusOr<psrt::TensorTransport> transport = psrt::TensorTransportFromFlags();
  absl::StatusOr<int> data_port = psrt::DataPortFromFlags();
  for (const absl::Status& s : {transport.status(), data_port.status()}) {
    if (!s.ok()) {
      LOG(ERROR) << s.message();
      return 2;
    }
  }
  if (*transport == psrt::TensorTransport::kDataPlane && (*security)->tls()) {
    LOG(ERROR) << "--tensor_transport=data_plane: the data plane has no TLS, and TLS is on: use "
                  "--tensor_transport=grpc or auto (tensors then travel encrypted)";
    return 2;
  }
  if (!FLAGS_checkpoint_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(FLAGS_checkpoint_dir, error);
    if (error) {
      LOG(ERROR) << "--checkpoint_dir " << FLAGS_checkpoint_dir << ": " << error.message();
      return 2;
    }
  }
  absl::StatusOr<int> replicas = psrt::PsReplicasFromFlags();
  if (!replicas.ok()) {
    LOG(ERROR) << replicas.status().message();
    return 2;
  }
  const int num_ps = cluster->spec.num_ps();
  if (*replicas > 0 && num_ps < 2) {
    LOG(ERROR) << "--ps_replicas=" << *replicas << " keeps each shard's backup on another ps "
               << "task, and the cluster spec names " << num_ps << ": give it 2 or more";
    return 2;
  }
  // With replicas, stripes S .. 2S-1 are the backup copies of the previous
  // task's shards, and each stripe's other copy is on the next or the
  // previous task.
  const int task = cluster->task.index;
  const int next = (task + 1) % num_ps;
  const int previous = (task + num_ps - 1) % num_ps;
  std::vector<std::unique_ptr<psrt::ParameterShard>> shards;
  std::vector<psrt::ParameterShard*> stripe_shards;
  for (int stripe = 0; stripe < *stripes * (1 + *replicas); ++stripe) {
    const bool backup_copy = stripe >= *stripes;
    const int owner = backup_copy ? previous : task;  // The task whose shard it is.
    psrt::ParameterShard::Options options;
    options.skip_nonfinite_gradients = FLAGS_nonfinite_gradients == "skip";
    options.default_pull_timeout = absl::Seconds(FLAGS_pull_timeout_secs);
    options.threads = FLAGS_threads;
    options.max_waiting_pulls = FLAGS_max_waiting_pulls;
    options.checkpoint_dir = FLAGS_checkpoint_dir;
    options.shard = owner * *stripes + stripe % *stripes;
    options.num_shards = num_ps * *stripes;
    // Restored once the server listens (below), so that probes and workers
    // see a live task while a large checkpoint loads.
    options.restore_at_start = !backup_copy;
    if (*replicas > 0) {
      const int peer_task = backup_copy ? previous : next;
      const int peer_stripe = backup_copy ? stripe - *stripes : stripe + *stripes;
      options.peer = std::make_shared<psrt::GrpcReplicaPeer>(
          psrt::NewChannel(cluster->spec.address("ps", peer_task), **security), peer_stripe,
          absl::StrCat("ps/", peer_task, " stripe ", peer_stripe));
      options.starts_as_backup = backup_copy;
    }
    shards.push_back(std::make_unique<psrt::ParameterShard>(options));
    stripe_shards.push_back(shards.back().get());
  }
  // The embedding tables' gauges, summed over the stripes (docs/sparse.md);
  // a stripe busy restoring or saving counts with its last figures, so that
  // a scrape waits at most about 20 ms for each. Removed before the shards go.
  using TableField = int64_t (psrt::proto::TableStatus::*)() const;
  const struct {
    const char* name;
    const char* help;
    TableField field;
  } table_gauges[] = {
      {"psrt_ps_table_rows", "Embedding rows this task holds.",
       &psrt::proto::TableStatus::rows},
      {"psrt_ps_table_bytes", "Bytes of the embedding tables this task holds.",
       &psrt::proto::TableStatus::bytes},
      {"psrt_ps_table_evicted_rows", "Embedding rows dropped for age or the row budget.",
       &psrt::proto::TableStatus::evicted_rows},
      {"psrt_ps_table_unadmitted_gradients",
       "Gradient rows dropped because their id was not yet admitted.",
       &psrt::proto::TableStatus::unadmitted_gradients},
      {"psrt_ps_table_candidates", "Ids looked up and waiting for admission.",
       &psrt::proto::TableStatus::candidates},
  };
  // One read of the stripes serves the five gauges of a scrape.
  struct LastTables {
    absl::Mutex mu;
    absl::Time read = absl::InfinitePast();
    std::vector<std::vector<psrt::proto::TableStatus>> per_stripe;
  };
  auto last_tables = std::make_shared<LastTables>();
  last_tables->per_stripe.resize(shards.size());
  for (const auto& gauge : table_gauges) {
    metrics.AddGaugeCallback(gauge.name, gauge.help,
                             [&shards, last_tables, field = gauge.field] {
      absl::MutexLock lock(&last_tables->mu);
      if (absl::Now() - last_tables->read > absl::Milliseconds(100)) {
        for (size_t k = 0; k < shards.size(); ++k) {
          // A push holds a stripe for a moment: a few tries, 1 ms apart,
          // find it free, so that a busy stripe is not left out of a first
          // scrape (it has no last figures yet). A save or restore holds it
          // for seconds: then its last figures stand.
          for (int attempt = 0; attempt < 20; ++attempt) {
            if (shards[k]->TryTableStatus(&last_tables->per_stripe[k])) break;
            absl::SleepFor(absl::Milliseconds(1));
          }
        }
        last_tables->read = absl::Now();
      }
      double total = 0;
      for (size_t k = 0; k < shards.size(); ++k) {
        for (const psrt::proto::TableStatus& table : last_tables->per_stripe[k]) {
          total += static_cast<double>((table.*field)());
        }
      }
      return total;
    });
  }
  if (*replicas > 0) {
    metrics.AddGaugeCallback("psrt_ps_takeovers",
                             "Times a backup copy on this task took over as its shard's primary.",
                             [&shards] {
                               double total = 0;
                               for (const auto& shard : shards) total += shard->takeovers();
                               return total;
                             });
  }
  absl::Cleanup remove_table_gauges = [&metrics] {
    metrics.RemoveGaugeCallbacks("psrt_ps_table_");
    metrics.RemoveGaugeCallbacks("psrt_ps_takeovers");
  };
  psrt::PsService::Roles roles;
  roles.chief_only_admin = (*security)->has_chief_token();
  if (FLAGS_check_replica_certificates) {
    if (!(*security)->tls()) {
      LOG(ERROR) << "--check_replica_certificates needs TLS (--tls_cert, --tls_key, "
                    "--tls_ca): without it no caller has a certificate";
      return 2;
    }
    for (int r = 0; r < cluster->spec.num_replicas(); ++r) {
      std::string replica_host;
      int replica_port = 0;
      // The spec was validated: every address splits.
      CHECK(psrt::SplitHostPort(cluster->spec.ReplicaAddress(r), &replica_host, &replica_port)
                .ok());
      roles.replica_hosts.push_back(replica_host);
    }
  }
  psrt::PsService service(stripe_shards, &ps_metrics, &health, std::move(roles));
  service.set_ps_replicas(*replicas);

  // The tensor data plane beside gRPC (ps/dataplane_server.h): TCP on the
  // task's host, and a Unix socket (--local_data_plane). Up before gRPC, so
  // that no status a worker reads lacks them.
  std::vector<std::unique_ptr<psrt::DataPlaneServer>> data_planes;
  if (*transport == psrt::TensorTransport::kAuto && (*security)->tls()) {
    LOG(INFO) << "no data plane: TLS is on (tensors over gRPC, encrypted)";
  } else if (*transport != psrt::TensorTransport::kGrpc) {
    psrt::DataPlaneServer::Options options;
    options.max_data_bytes = static_cast<uint64_t>(FLAGS_max_message_mb) << 20;
    options.security = *security;
    options.metrics = &ps_metrics;
    std::vector<std::string> addresses = {psrt::JoinHostPort(
        psrt::ListenHost(psrt::BindHostFromFlags(), host), *data_port)};
    if (psrt::LocalDataPlaneFromFlags()) {
      addresses.push_back(psrt::dataplane::NewLocalDataPlaneAddress(port));
    }
    for (const std::string& address : addresses) {
      options.listen_address = address;
      absl::StatusOr<std::unique_ptr<psrt::DataPlaneServer>> data_plane =
          psrt::DataPlaneServer::Start(stripe_shards, options);
      // A port of the kernel's choosing may be the gRPC port, not bound yet.
      while (data_plane.ok() && *data_port == 0 && (*data_plane)->port() == port) {
        data_plane = psrt::DataPlaneServer::Start(stripe_shards, options);
      }
      if (!data_plane.ok() && address != addresses.front()) {
        // Optional, as an allreduce worker's: workers take TCP without it.
        LOG(WARNING) << cluster->task.ToString() << ": the data plane over TCP only: "
                     << data_plane.status().message();
        continue;
      }
      if (!data_plane.ok()) {
        LOG(ERROR) << cluster->task.ToString() << ": --data_port: "
                   << data_plane.status().message();
        return 1;
      }
      LOG(INFO) << cluster->task.ToString() << " data plane on " << (*data_plane)->address();
      data_planes.push_back(*std::move(data_plane));
    }
    service.set_data_plane(data_planes.front()->port(),
                           data_planes.size() > 1 ? data_planes.back()->address() : "");
  }
  grpc::ServerBuilder builder;
  psrt::ConfigurePsServer(&builder, FLAGS_max_message_mb << 20, FLAGS_max_grpc_memory_mb << 20);
  const std::string listen = psrt::JoinHostPort(psrt::ListenHost(psrt::BindHostFromFlags(), host), port);
  int bound_port = 0;
  builder.AddListeningPort(listen, (*security)->ServerCredentials(), &bound_port);
  if (FLAGS_unix_socket) {
    builder.AddListeningPort(psrt::LocalSocketAddress(port),
                             (*security)->ServerCredentials());
  }
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    LOG(ERROR) << cluster->task.ToString() << ": cannot listen on " << listen << " ("
               << psrt::WhyCannotListen(listen) << ")";
    return 1;
  }
  health.Attach(server.get());

  service.ReportReadiness();
  const psrt::CpuBudget cpu_budget = psrt::ProcessCpuBudget();
  LOG(INFO) << cluster->task.ToString() << " serving on " << listen
            << " (" << *stripes << (*stripes == 1 ? " shard" : " stripes") << ", "
            << (FLAGS_threads > 0 ? absl::StrCat(FLAGS_threads, " update threads each")
                                  : absl::StrCat(cpu_budget.cores, " update threads each: ",
                                                 cpu_budget.reason))
            << ")"
            << (FLAGS_metrics_port > 0 ? absl::StrCat(", metrics on port ", metrics.port())
                                       : "");
  for (int stripe = 0; stripe < *stripes; ++stripe) {
    psrt::ParameterShard* shard = shards[stripe].get();
    // A copy whose other copy survived its restart is filled from it.
    if (*replicas > 0 && shard->JoinReplicas()) continue;
    if (absl::Status s = shard->RestoreLatest(); !s.ok()) {
      LOG(ERROR) << s.message();
      server->Shutdown();
      return 1;
    }
  }
  service.ReportReadiness();

  // Shutdown reaches every stripe at once, so they finish together.
  absl::Status finished;
  for (auto& shard : shards) {
    finished = shard->WaitUntilFinished(absl::Seconds(FLAGS_shutdown_grace_secs),
                                        absl::Seconds(FLAGS_chief_timeout_secs));
    if (!finished.ok()) break;
  }
  data_planes.clear();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  health.Detach();
  if (!finished.ok()) {
    LOG(ERROR) << cluster->task.ToString() << ": " << finished.message();
    return 1;
  }
  // What this task held and moved, for balance across the ps tasks
  // (scripts/bench_ctr.sh reads it).
  int64_t rows = 0;
  std::vector<std::string> primaries;  // Each primary copy: "shard:version".
  for (const auto& shard : shards) {
    const psrt::proto::StatusResponse status = shard->GetStatus();
    for (const psrt::proto::TableStatus& table : status.tables()) rows += table.rows();
    if (!status.backup() && status.initialized()) {
      primaries.push_back(absl::StrCat(status.shard(), ":", status.version()));
    }
  }
  const psrt::proto::TrafficStatus traffic = ps_metrics.transfers().traffic();
  LOG(INFO) << cluster->task.ToString() << " done: " << shards[0]->GetStatus().version()
            << " versions; table_rows=" << rows << " pushed_bytes=" << traffic.bytes_pushed()
            << " pulled_bytes=" << traffic.bytes_pulled()
            << (*replicas > 0 ? absl::StrCat(" primaries=", absl::StrJoin(primaries, ","))
                              : "");
  return 0;
}
