// psrt_worker: one training replica (a "worker" or "chief" task).
//
//   psrt_worker --cluster_spec=cluster.json --job_name=worker --task_index=0 \
//       --sync_replicas --train_steps=2000
//
// Flags are read here only; they fill TrainerOptions and PsClient::Options.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/cluster_spec.h"
#include "common/placement.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "models/model.h"
#include "worker/idx_dataset.h"
#include "worker/ps_client.h"
#include "worker/trainer.h"

DEFINE_string(cluster_spec, "",
              "ClusterSpec JSON file (TensorFlow's format, or TF_CONFIG's). "
              "Empty: read the TF_CONFIG environment variable.");
DEFINE_string(job_name, "", "\"worker\" or \"chief\". Empty: from TF_CONFIG.");
DEFINE_int32(task_index, 0, "This task's index within its job.");
DEFINE_string(data_dir, "/usr/share/datasets/fashion-mnist",
              "Directory with the IDX files (train-images-idx3-ubyte[.gz], ...).");
DEFINE_string(model, "mlp",
              "Model to train: mlp, lenet, inception_mini or inception_v3.");
DEFINE_int32(input_height, 28, "Image height the model is built for (inception_v3: 299).");
DEFINE_int32(input_width, 28, "Image width the model is built for (inception_v3: 299).");
DEFINE_int32(input_channels, 1, "Image channels the model is built for (inception_v3: 3).");
DEFINE_bool(describe_model, false,
            "Print the model's variables, one \"name shape\" line each, then "
            "\"params=N\", and exit (needs no cluster).");
DEFINE_string(hidden_units, "512", "Comma-separated hidden layer sizes of the MLP.");
DEFINE_int32(batch_size, 100, "Training batch size per worker.");
DEFINE_int64(train_steps, 2000, "Stop when the global step reaches this.");
DEFINE_bool(sync_replicas, false,
            "Synchronous training (SyncReplicas): average the gradients of "
            "--replicas_to_aggregate workers per step. Otherwise asynchronous.");
DEFINE_int32(replicas_to_aggregate, 0,
             "Sync mode: gradients averaged per step; the other workers are "
             "backups. 0: all workers.");
DEFINE_string(optimizer, "sgd", "sgd or momentum (applied on the parameter servers).");
DEFINE_double(learning_rate, 0.1, "Learning rate.");
DEFINE_double(momentum, 0.9, "Momentum, for --optimizer=momentum.");
DEFINE_string(placement, "round_robin",
              "Variable placement on parameter servers: round_robin or greedy.");
DEFINE_int64(partition_threshold_bytes, 1 << 20,
             "Variables larger than this are split across parameter servers.");
DEFINE_bool(shuffle, true, "Shuffle this worker's shard of the data each epoch.");
DEFINE_uint64(seed, 1, "Seed of the initial values and the data order.");
DEFINE_int32(log_every_steps, 100, "Log a progress line every this many local steps.");
DEFINE_int32(intra_op_threads, 0, "Threads for the kernels; 0: number of cores.");
DEFINE_double(startup_timeout_secs, 300,
              "How long to wait for the parameter servers and the chief.");
DEFINE_double(pull_timeout_secs, 300,
              "How long a pull may wait for the next version (sync mode waits "
              "for the slowest worker); then the worker fails.");
DEFINE_string(final_params_out, "",
              "Chief: write the final parameters to this safetensors file.");

namespace {

absl::StatusOr<std::vector<int>> ParseHiddenUnits(const std::string& text) {
  std::vector<int> units;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n <= 0) {
      return absl::InvalidArgumentError(
          "--hidden_units: \"" + std::string(part) + "\" is not a positive integer");
    }
    units.push_back(n);
  }
  return units;
}

absl::StatusOr<psrt::ModelOptions> ModelOptionsFromFlags() {
  psrt::ModelOptions options;
  ASSIGN_OR_RETURN(options.hidden_units, ParseHiddenUnits(FLAGS_hidden_units));
  options.input_height = FLAGS_input_height;
  options.input_width = FLAGS_input_width;
  options.input_channels = FLAGS_input_channels;
  options.intra_op_threads = FLAGS_intra_op_threads;
  return options;
}

// --describe_model: the model's variables and parameter count, on stdout.
absl::Status DescribeModel() {
  ASSIGN_OR_RETURN(psrt::ModelOptions options, ModelOptionsFromFlags());
  ASSIGN_OR_RETURN(std::unique_ptr<psrt::Model> model,
                   psrt::NewModel(FLAGS_model, options));
  int64_t params = 0;
  for (const psrt::VariableDef& v : model->variables()) {
    std::printf("%s %s\n", v.name.c_str(), psrt::ShapeToString(v.shape).c_str());
    params += psrt::NumElements(v.shape);
  }
  std::printf("params=%lld\n", static_cast<long long>(params));
  return absl::OkStatus();
}

absl::Status Run() {
  const char* tf_config = std::getenv("TF_CONFIG");
  ASSIGN_OR_RETURN(psrt::ClusterConfig cluster,
                   psrt::ResolveClusterConfig(FLAGS_cluster_spec,
                                              tf_config ? tf_config : "",
                                              FLAGS_job_name, FLAGS_task_index));
  if (cluster.task.job != "worker" && cluster.task.job != "chief") {
    return absl::InvalidArgumentError(
        "psrt_worker runs worker and chief tasks, but this task is " +
        cluster.task.ToString() + " (use psrt_ps for ps tasks)");
  }
  const psrt::ClusterSpec& spec = cluster.spec;
  const int replica = spec.ReplicaIndex(cluster.task);
  const int num_replicas = spec.num_replicas();

  ASSIGN_OR_RETURN(psrt::ModelOptions model_options, ModelOptionsFromFlags());
  ASSIGN_OR_RETURN(std::unique_ptr<psrt::Model> model,
                   psrt::NewModel(FLAGS_model, model_options));

  psrt::PlacementOptions placement_options;
  ASSIGN_OR_RETURN(placement_options.strategy,
                   psrt::ParsePlacementStrategy(FLAGS_placement));
  placement_options.partition_threshold_bytes = FLAGS_partition_threshold_bytes;
  ASSIGN_OR_RETURN(psrt::Placement placement,
                   psrt::ComputePlacement(model->variables(), spec.num_ps(),
                                          placement_options));

  psrt::TrainerOptions options;
  options.replica = replica;
  options.num_replicas = num_replicas;
  options.batch_size = FLAGS_batch_size;
  options.train_steps = FLAGS_train_steps;
  options.log_every_steps = std::max(1, FLAGS_log_every_steps);
  options.shuffle = FLAGS_shuffle;
  options.seed = FLAGS_seed;
  options.startup_timeout = absl::Seconds(FLAGS_startup_timeout_secs);
  options.final_params_path = FLAGS_final_params_out;
  psrt::proto::TrainingConfig& config = options.config;
  config.set_mode(FLAGS_sync_replicas ? psrt::proto::SYNC : psrt::proto::ASYNC);
  config.set_num_replicas(num_replicas);
  config.set_replicas_to_aggregate(
      FLAGS_replicas_to_aggregate > 0 ? FLAGS_replicas_to_aggregate : num_replicas);
  if (FLAGS_optimizer == "sgd") {
    config.set_optimizer(psrt::proto::SGD);
  } else if (FLAGS_optimizer == "momentum") {
    config.set_optimizer(psrt::proto::MOMENTUM);
  } else {
    return absl::InvalidArgumentError("--optimizer: unknown optimizer \"" +
                                      FLAGS_optimizer + "\" (known: sgd, momentum)");
  }
  config.set_learning_rate(FLAGS_learning_rate);
  config.set_momentum(FLAGS_momentum);
  if (FLAGS_batch_size <= 0) {
    return absl::InvalidArgumentError("--batch_size must be positive");
  }
  if (config.replicas_to_aggregate() > num_replicas) {
    return absl::InvalidArgumentError(
        "--replicas_to_aggregate=" + std::to_string(FLAGS_replicas_to_aggregate) +
        " exceeds the " + std::to_string(num_replicas) + " workers of the cluster");
  }

  ASSIGN_OR_RETURN(psrt::Dataset train, psrt::LoadMnistSplit(FLAGS_data_dir, "train"));
  psrt::Dataset test;
  if (replica == 0) {
    ASSIGN_OR_RETURN(test, psrt::LoadMnistSplit(FLAGS_data_dir, "t10k"));
  }

  psrt::PsClient::Options client_options;
  for (int k = 0; k < spec.num_ps(); ++k) {
    client_options.ps_addresses.push_back(spec.address("ps", k));
  }
  client_options.replica = replica;
  client_options.pull_timeout = absl::Seconds(FLAGS_pull_timeout_secs);
  psrt::PsClient client(client_options, std::move(placement), model->variables());

  LOG(INFO) << cluster.task.ToString() << " is replica " << replica << " of "
            << num_replicas << " (" << (FLAGS_sync_replicas ? "sync" : "async")
            << "), " << spec.num_ps() << " parameter servers, "
            << train.size() << " training examples";
  psrt::Trainer trainer(options, model.get(), &client, &train,
                        replica == 0 ? &test : nullptr);
  return trainer.Run().status();
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage("psrt worker task");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  psrt::KeepLargeAllocationsMapped();
  absl::Status status = FLAGS_describe_model ? DescribeModel() : Run();
  if (!status.ok()) {
    LOG(ERROR) << status.message();
    return 1;
  }
  return 0;
}
