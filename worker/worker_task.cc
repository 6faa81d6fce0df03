#include "worker/worker_task.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/synchronization/mutex.h"
#include "common/backoff.h"
#include "common/cpu_budget.h"
#include "common/metrics.h"
#include "common/rpc_util.h"
#include "common/splitmix.h"
#include "common/status_macros.h"
#include "common/timeline.h"
#include "common/training_config.h"
#include "common/transport_security.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "models/model.h"
#include "proto/psrt.grpc.pb.h"
#include "worker/store/allreduce_store.h"
#include "worker/store/hybrid_store.h"
#include "worker/ring/collective.h"
#include "worker/ring/elastic_ring.h"
#include "worker/store/ps_client.h"
#include "worker/training/towers.h"
#include "worker/training/trainer.h"
#include "worker/worker_membership.h"
#include "worker/worker_status_service.h"

namespace psrt {
namespace {

// This task's status and health service, on its own address of the cluster
// spec. A task that cannot listen there (the port is taken) still trains:
// the service is for watching the task, and a training job should not fail
// for want of it; the warning says why it cannot be watched.
std::unique_ptr<WorkerStatusServer> StartStatusServer(const WorkerConfig& config,
                                                      WorkerMetrics* metrics,
                                                      std::vector<grpc::Service*> services,
                                                      std::function<absl::Status()> drain) {
  const ClusterConfig& cluster = config.cluster;
  std::string host;
  int port = 0;
  absl::Status status = SplitHostPort(
      cluster.spec.address(cluster.task.job, cluster.task.index), &host, &port);
  WorkerStatusServer::Options options;
  options.listen_address = JoinHostPort(ListenHost(config.bind_host, host), port);
  options.credentials = config.security->ServerCredentials();
  options.job = cluster.task.job;
  options.task_index = cluster.task.index;
  options.replica = config.replica;
  options.services = std::move(services);
  options.drain = std::move(drain);
  // Allreduce mode: the previous worker may reach the ring here too.
  if (config.uses_ring() && config.ring.unix_socket) {
    options.local_socket = LocalSocketAddress(port);
  }
  absl::StatusOr<std::unique_ptr<WorkerStatusServer>> server =
      status.ok() ? WorkerStatusServer::Start(options, metrics) : status;
  if (!server.ok()) {
    LOG(WARNING) << cluster.task.ToString() << " serves no status or health: "
                 << server.status().message() << "; training anyway";
    return nullptr;
  }
  LOG(INFO) << cluster.task.ToString() << " status and health on " << options.listen_address;
  return *std::move(server);
}

absl::Status ServeMetrics(const WorkerConfig& config, Metrics* metrics) {
  if (config.metrics_port <= 0) return absl::OkStatus();
  const ClusterConfig& cluster = config.cluster;
  std::string spec_host;
  int spec_port = 0;
  RETURN_IF_ERROR(SplitHostPort(cluster.spec.address(cluster.task.job, cluster.task.index),
                                &spec_host, &spec_port));
  absl::Status serving = metrics->Serve(ListenHost(config.bind_host, spec_host),
                                        config.metrics_port);
  if (!serving.ok()) {
    return absl::UnavailableError(absl::StrCat("--metrics_port: ", serving.message()));
  }
  LOG(INFO) << cluster.task.ToString() << " metrics on port " << metrics->port();
  return absl::OkStatus();
}

// One model per tower device (the evaluator evaluates on one).
absl::StatusOr<std::vector<std::unique_ptr<Model>>> MakeTowers(const WorkerConfig& config) {
  // Counting GPUs asks the driver alone: a process that ends up on the CPU
  // never loads cudart or cuBLAS. --device=cpu does not even ask.
  int visible_gpus = config.device == "cpu" ? 0 : kernels::VisibleGpuCount();
  if (config.device == "auto" && visible_gpus > 0) {
    // A driver sees a GPU, but auto runs on it only where our CUDA kernels
    // (and their cudart and cuBLAS) load and the runtime agrees.
    absl::StatusOr<int> runtime_gpus = kernels::LoadCudaKernels();
    if (!runtime_gpus.ok() || *runtime_gpus == 0) {
      LOG(WARNING) << "--device=auto: the driver sees " << visible_gpus
                   << " GPUs, but this process cannot use them ("
                   << (runtime_gpus.ok() ? "the CUDA runtime sees none"
                                         : std::string(runtime_gpus.status().message()))
                   << "); running on the CPU";
      visible_gpus = 0;
    } else {
      visible_gpus = std::min(visible_gpus, *runtime_gpus);
    }
  }
  ASSIGN_OR_RETURN(std::vector<kernels::DeviceSpec> devices,
                   ChooseTowerDevices(config.device, config.evaluator ? 1 : config.num_gpus,
                                      visible_gpus));
  std::vector<std::unique_ptr<Model>> towers;
  ModelOptions options = config.model_options;
  for (const kernels::DeviceSpec& device : devices) {
    options.device = device;
    options.device.gpu_math = config.gpu_math;
    options.device.gpu_conv = config.gpu_conv;
    ASSIGN_OR_RETURN(std::unique_ptr<Model> tower, NewModel(config.model, options));
    LOG(INFO) << "tower " << towers.size() << " of " << config.model << " on "
              << tower->device_name() << " (--device=" << config.device << ", "
              << visible_gpus << " GPUs visible"
              << (options.intra_op_threads <= 0
                      ? "; --intra_op_threads=0: " + ProcessCpuBudget().reason
                      : std::string())
              << ")";
    towers.push_back(std::move(tower));
  }
  return towers;
}

// The stripes the ps tasks serve, for a worker not given --ps_stripes:
// asked of each ps task in turn, with backoff, until one answers (a job of
// replicated shards may have lost one for good); the client's
// WaitForServers then holds every task to it.
absl::StatusOr<int> AskPsStripes(const PsClient::Options& client, absl::Duration timeout) {
  const TransportSecurity plaintext;
  const TransportSecurity& security = client.security ? *client.security : plaintext;
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(2));
  const absl::Time give_up = absl::Now() + timeout;
  absl::Time next_log = absl::Now() + absl::Seconds(5);
  while (true) {
    std::vector<std::string> errors;
    for (size_t t = 0; t < client.ps_addresses.size(); ++t) {
      const std::string& address = client.ps_addresses[t];
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      proto::StatusResponse reply;
      const absl::Status status = FromGrpcStatus(
          proto::ParameterServer::NewStub(NewChannel(address, security))
              ->GetStatus(&context, proto::StatusRequest(), &reply));
      if (status.ok()) {
        const int stripes = std::max(1, reply.stripes());
        LOG(INFO) << "the ps tasks serve " << stripes << " stripes each (ps/" << t
                  << "'s --ps_stripes)";
        return stripes;
      }
      if (absl::IsUnauthenticated(status)) {
        return absl::UnauthenticatedError(absl::StrCat("ps/", t, " (", address, "): ",
                                                       status.message()));
      }
      errors.push_back(absl::StrCat("ps/", t, " (", address, "): ", status.message()));
    }
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no parameter server answered within ", absl::FormatDuration(timeout),
          " (asked for its --ps_stripes): ", absl::StrJoin(errors, "; ")));
    }
    if (absl::Now() >= next_log) {
      LOG(INFO) << "waiting for a parameter server: " << absl::StrJoin(errors, "; ");
      next_log = absl::Now() + absl::Seconds(5);
    }
    absl::SleepFor(backoff.Next());
  }
}

absl::StatusOr<std::unique_ptr<ParameterStore>> MakeStore(const WorkerConfig& config,
                                                          const Model& model,
                                                          Collective* ring,
                                                          ElasticRing* elastic_ring,
                                                          Timeline* timeline,
                                                          WorkerMetrics* metrics) {
  const std::string task = config.cluster.task.ToString();
  if (config.allreduce && !model.tables().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model=", config.model, " keeps its embedding tables on parameter servers; allreduce "
        "mode has none (give the cluster ps tasks)"));
  }
  if (config.dense_allreduce && model.tables().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dense_allreduce puts a model's embedding tables on the ps tasks and --model=",
        config.model, " has none (a dense model trains on the ring alone: --mode=allreduce)"));
  }
  std::unique_ptr<AllreduceStore> dense;  // The ring's part: every variable or (hybrid) dense.
  if (config.uses_ring()) {
    // The hybrid's dense files must not meet the ps tasks' in their directory.
    const std::string dir = config.checkpoint_dir.empty() || config.allreduce
                                ? config.checkpoint_dir
                                : config.checkpoint_dir + "/dense";
    if (!dir.empty()) {
      std::error_code error;
      std::filesystem::create_directories(dir, error);
      if (error) {
        return absl::InvalidArgumentError(
            absl::StrCat("--checkpoint_dir ", dir, ": ", error.message()));
      }
    }
    AllreduceStore::Options options;
    options.collective = ring;
    options.elastic = elastic_ring;
    // A ring that broke waits for the chief's list without the member
    // gone: its lease, then a member's call period and a margin.
    options.membership_wait = config.elastic_lease * 1.5 + absl::Seconds(2);
    options.regroup_timeout = config.trainer.startup_timeout;
    options.checkpoint_dir = dir;
    options.fusion_bytes = config.fusion_bytes;
    options.timeline = timeline;
    dense = std::make_unique<AllreduceStore>(options, model.variables());
  }
  if (config.allreduce) {
    LOG(INFO) << task << " is worker " << config.replica << " of " << config.num_replicas
              << " (allreduce mode: a ring of the workers, no parameter servers)";
    return std::unique_ptr<ParameterStore>(std::move(dense));
  }
  const int num_ps = config.cluster.spec.num_ps();
  PsClient::Options options = config.ps_client;
  if (options.ps_stripes == 0 && !options.ps_addresses.empty()) {
    ASSIGN_OR_RETURN(options.ps_stripes,
                     AskPsStripes(options, config.trainer.startup_timeout));
  }
  options.ps_stripes = std::max(1, options.ps_stripes);
  ASSIGN_OR_RETURN(
      Placement placement,
      ComputePlacement(config.dense_allreduce ? std::vector<VariableDef>() : model.variables(),
                       std::max(1, num_ps * options.ps_stripes), config.placement));
  options.metrics = &metrics->transfers();
  options.timeline = timeline;
  // Every variable, whole, and the placement's options: each shard saves
  // them, so that its checkpoints restore onto another number of shards.
  for (const VariableDef& variable : model.variables()) {
    proto::VariableMeta& meta = *options.layout.add_variables();
    meta.set_name(variable.name);
    meta.set_dtype(proto::DT_FLOAT);
    for (int64_t d : variable.shape) meta.add_shape(d);
  }
  options.layout.set_placement(PlacementStrategyName(config.placement.strategy));
  options.layout.set_partition_threshold_bytes(config.placement.partition_threshold_bytes);
  for (size_t t = 0; t < model.tables().size(); ++t) {
    proto::TableMeta& table = options.tables.emplace_back();
    table.set_name(model.tables()[t].name);
    table.set_dim(model.tables()[t].dim);
    table.set_zero_rows(model.tables()[t].zero_rows);
    // Rows from (seed, table, id) alone: the chief's seed, as for the
    // dense variables.
    table.set_seed(SplitMix64(config.trainer.seed + t));
  }
  LOG(INFO) << task << " is "
            << (config.evaluator ? "the evaluator" : "replica " + std::to_string(config.replica))
            << " of " << config.num_replicas << " ("
            << (config.trainer.config.mode() == proto::SYNC ? "sync" : "async") << "), "
            << num_ps << " parameter servers"
            << (config.dense_allreduce ? " for the tables, the dense part on a ring of the workers"
                                       : "");
  if (config.dense_allreduce) {
    return std::unique_ptr<ParameterStore>(std::make_unique<HybridStore>(
        std::move(dense),
        std::make_unique<PsClient>(options, std::move(placement), std::vector<VariableDef>())));
  }
  return std::unique_ptr<ParameterStore>(
      std::make_unique<PsClient>(options, std::move(placement), model.variables()));
}

}  // namespace

absl::Status ResolveDecayEpochs(int64_t train_examples, WorkerConfig* config) {
  if (config->decay_epochs <= 0) return absl::OkStatus();
  if (train_examples <= 0) {
    // Streamed input (Criteo logs) is not counted ahead.
    return absl::InvalidArgumentError(
        "--learning_rate_decay=exponential: this input's size is not known ahead, so "
        "--decay_epochs cannot be turned into steps; give --decay_steps");
  }
  const double steps_per_epoch =
      std::max<double>(1, train_examples / config->examples_per_step);
  config->trainer.config.mutable_schedule()->set_decay_steps(
      std::max<int64_t>(1, std::llround(config->decay_epochs * steps_per_epoch)));
  return ValidateTrainingConfig(config->trainer.config);
}

absl::Status DescribeModel(const WorkerConfig& config) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                   NewModel(config.model, config.model_options));
  for (const VariableDef& v : model->variables()) {
    std::printf("%s %s\n", v.name.c_str(), ShapeToString(v.shape).c_str());
  }
  const ParameterCount count = CountParameters(*model);
  std::printf("params_with_moving_statistics=%lld\n", static_cast<long long>(count.all));
  std::printf("params=%lld\n", static_cast<long long>(count.trainable));
  return absl::OkStatus();
}

absl::Status RunWorkerTask(WorkerConfig config) {
  const ClusterConfig& cluster = config.cluster;
  // Telemetry: metrics (--metrics_port); status and health on the task's port.
  Metrics metrics({cluster.task.job, cluster.task.index, config.restarts});
  WorkerMetrics worker_metrics(&metrics);
  RETURN_IF_ERROR(ServeMetrics(config, &metrics));
  std::unique_ptr<Timeline> timeline;
  if (!config.timeline_path.empty()) {
    ASSIGN_OR_RETURN(timeline,
                     Timeline::Open(config.timeline_path, std::max(config.replica, 0)));
  }
  // Allreduce mode and --dense_allreduce: the ring of the workers, served
  // on each one's address; an elastic job's rings, one per list of members.
  const bool elastic = config.trainer.config.max_workers() > 0 && !config.evaluator;
  std::unique_ptr<Collective> ring;
  std::unique_ptr<ElasticRing> elastic_ring;
  std::vector<grpc::Service*> services;
  if (config.uses_ring()) {
    Collective::Options options = config.ring;
    options.timeline = timeline.get();
    std::string host;
    int port = 0;
    if (SplitHostPort(options.addresses[options.rank], &host, &port).ok()) {
      options.data_listen_host = ListenHost(config.bind_host, host);
    }
    if (elastic) {
      elastic_ring = std::make_unique<ElasticRing>(options, config.replica);
      services.push_back(elastic_ring->service());
    } else {
      ring = std::make_unique<Collective>(options);
      services.push_back(ring->service());
    }
  }
  // Tells this worker's elastic ring a list of the chief's.
  auto tell_ring = [ring = elastic_ring.get()](const proto::MembersRequest& list) {
    absl::StatusOr<ElasticRing::Members> members = ElasticRing::FromList(list);
    if (!members.ok()) return members.status();
    ring->MembersChanged(*std::move(members));
    return absl::OkStatus();
  };
  // Elastic workers: the chief keeps the list of members and announces it
  // to the shards, once the store to announce with exists (in allreduce
  // mode to its ring); the others call the chief.
  struct AnnounceTarget {
    absl::Mutex mu;
    ParameterStore* store ABSL_GUARDED_BY(mu) = nullptr;
  };
  auto announce_target = std::make_shared<AnnounceTarget>();
  std::unique_ptr<MembershipRegistry> registry;
  std::unique_ptr<MembershipClient> membership_client;
  std::function<absl::Status()> drain;
  if (elastic && config.replica == 0) {
    MembershipRegistry::Options options;
    options.min_workers = config.trainer.config.min_workers();
    options.max_workers = config.trainer.config.max_workers();
    options.lease = config.elastic_lease;
    options.min_workers_timeout = config.trainer.startup_timeout;
    options.ring = elastic_ring != nullptr;
    if (options.ring) options.ring_address = config.ring.addresses[config.replica];
    registry = std::make_unique<MembershipRegistry>(
        options,
        [announce_target, tell_ring, allreduce = options.ring](
            const proto::MembersRequest& request) -> absl::StatusOr<int64_t> {
          if (allreduce) {
            RETURN_IF_ERROR(tell_ring(request));
            return int64_t{0};
          }
          absl::MutexLock lock(&announce_target->mu);
          if (announce_target->store == nullptr) {
            return absl::UnavailableError("the parameter servers are not reached yet");
          }
          return announce_target->store->SetMembers(request);
        });
    services.push_back(registry->service());
  } else if (elastic) {
    MembershipClient::OnList on_list;
    std::string ring_address;
    if (elastic_ring != nullptr) {
      ring_address = config.ring.addresses[config.replica];
      on_list = [tell_ring](const proto::MembersRequest& list) {
        const absl::Status told = tell_ring(list);
        LOG_IF(WARNING, !told.ok()) << told.message();
      };
    }
    membership_client = std::make_unique<MembershipClient>(
        NewChannel(cluster.spec.ReplicaAddress(0), *config.security), config.replica,
        config.elastic_lease, config.trainer.startup_timeout, ring_address, std::move(on_list));
    drain = [client = membership_client.get()] {
      client->RequestDrain();
      return absl::OkStatus();
    };
  }
  std::unique_ptr<WorkerStatusServer> status_server =
      StartStatusServer(config, &worker_metrics, services, std::move(drain));
  if (config.uses_ring() && status_server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("allreduce mode: ", cluster.task.ToString(), " cannot serve the ring on ",
                     cluster.spec.address(cluster.task.job, cluster.task.index)));
  }
  if (registry != nullptr && status_server == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "elastic workers: the chief, ", cluster.task.ToString(),
        ", cannot serve the workers' calls on ",
        cluster.spec.address(cluster.task.job, cluster.task.index)));
  }

  ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Model>> tower_models, MakeTowers(config));
  Towers towers(std::move(tower_models));
  ASSIGN_OR_RETURN(WorkerInput input,
                   OpenWorkerInput(config.input, config.replica, config.num_replicas));
  LOG(INFO) << cluster.task.ToString() << ": " << input.train_examples << " training examples";
  RETURN_IF_ERROR(ResolveDecayEpochs(input.train_examples, &config));
  ASSIGN_OR_RETURN(std::unique_ptr<ParameterStore> store,
                   MakeStore(config, *towers.tower(0), ring.get(), elastic_ring.get(),
                             timeline.get(), &worker_metrics));

  {
    absl::MutexLock lock(&announce_target->mu);
    announce_target->store = store.get();
  }
  absl::Cleanup stop_announcing = [&announce_target] {
    absl::MutexLock lock(&announce_target->mu);
    announce_target->store = nullptr;
  };

  TrainerOptions options = config.trainer;
  if (registry != nullptr) options.membership = registry.get();
  if (membership_client != nullptr) options.membership = membership_client.get();
  options.metrics = &worker_metrics;
  options.timeline = timeline.get();
  std::unique_ptr<Trainer> trainer;
  if (input.streamed) {
    trainer = std::make_unique<Trainer>(options, &towers, store.get(), input.train_source,
                                        input.test_source, input.test_examples);
  } else {
    trainer = std::make_unique<Trainer>(options, &towers, store.get(), &input.train,
                                        config.replica <= 0 ? &input.test : nullptr);
  }
  absl::Status status = config.evaluator ? trainer->RunEvaluator() : trainer->Run().status();
  if (timeline != nullptr && status.ok()) status = timeline->Close();
  worker_metrics.SetState(status.ok() ? proto::WORKER_DONE : proto::WORKER_FAILED);
  return status;
}

}  // namespace psrt
