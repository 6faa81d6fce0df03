// psrt_worker's flags, and the one function that reads them (worker_flags.h);
// the training rule's flags are training_rule_flags.cc's.
#include "worker/worker_flags.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_system.h"
#include "common/status_macros.h"
#include "common/task_flags.h"
#include "common/training_config.h"
#include "common/wire_dtype.h"
#include "gflags/gflags.h"
#include "models/keras_model.h"
#include "models/keras_weights.h"
#include "worker/input/criteo_reader.h"
#include "worker/training_rule_flags.h"

DEFINE_string(cluster_spec, "",
              "ClusterSpec JSON file (TensorFlow's format, or TF_CONFIG's). "
              "Empty: read the TF_CONFIG environment variable.");
DEFINE_string(job_name, "", "\"worker\" or \"chief\". Empty: from TF_CONFIG.");
DEFINE_int32(task_index, 0, "This task's index within its job.");
DEFINE_string(data_dir, "/usr/share/datasets/fashion-mnist",
              "Directory with the IDX files (train-images-idx3-ubyte[.gz], ...).");
DEFINE_string(train_data, "",
              "TFRecord files of tf.train.Example (image_raw, label) to train "
              "on instead of --data_dir: a file, a comma-separated list, a "
              "directory or a glob.");
DEFINE_string(test_data, "", "TFRecord test set, like --train_data.");
DEFINE_string(data_format, "auto",
              "What --train_data/--test_data hold: \"mnist\" (image_raw + label, "
              "read into memory), \"images\" (build_image_data.py records: JPEG/PNG in "
              "image/encoded, decoded and cropped on --input_threads threads to "
              "--input_height x --input_width x --input_channels), or \"auto\" (images when "
              "the first record holds image/encoded), or \"criteo\" (Criteo click logs for "
              "--model=wide_deep or dlrm: label, 13 counts, 26 hex categories per line, tab-"
              "separated, plain or gzip; psrt_make_criteo writes such files).");
DEFINE_string(malformed_lines, "stop",
              "Criteo input: \"stop\" at a malformed line (the error names file and line) "
              "or \"skip\" it (counted).");
DEFINE_int32(embedding_dim, 16, "CTR models: the length of an embedding row.");
DEFINE_string(bottom_mlp, "64",
              "DLRM: the bottom MLP's hidden layer sizes over the dense features (a last "
              "layer of --embedding_dim is added).");
DEFINE_string(top_mlp, "64,32", "DLRM: the top MLP's hidden layer sizes (then one logit).");
DEFINE_int32(num_classes, 10, "Classes the model tells apart (labels in [0, num_classes)).");
DEFINE_int32(input_threads, 0, "Image records: decoder threads; 0: number of cores.");
DEFINE_int32(input_prefetch_batches, 3,
             "Image records: batches decoded ahead of the step (buffers in flight).");
DEFINE_string(input_cache, "memory",
              "Image records: \"memory\" holds this worker's encoded images in RAM; "
              "\"disk\" keeps only their offsets in plain TFRecord files and reads each "
              "image when it is decoded (for shards larger than RAM; gzip files are held "
              "in memory anyway).");
DEFINE_string(corrupt_images, "stop",
              "Image records: an image that does not decode \"stop\"s the worker with an "
              "error naming file and record, or is \"skip\"ped (replaced by the next good "
              "one, deterministically, and counted).");
DEFINE_int32(label_offset, 1,
             "Image records: class id = image/class/label - label_offset (1: "
             "build_image_data.py's labels 1..N become 0..N-1).");
DEFINE_string(pixel_range, "0-1",
              "Pixels of images read from files: \"0-1\" (byte / 255, psrt's models) or "
              "\"0-255\" (the bytes, as Keras's image_dataset_from_directory gives them: for "
              "Keras files that rescale their input themselves, such as EfficientNet's or "
              "a Rescaling(1 / 255) first).");
DEFINE_bool(synthetic_data, false,
            "Train and evaluate on random images of the model's input size (one batch, "
            "reused) instead of a data set: times a model alone.");
DEFINE_string(model, "mlp",
              "Model to train: mlp, lenet, inception_mini, inception_v3, resnet50, "
              "resnet101, vgg16 or alexnet.");
DEFINE_string(model_file, "",
              "A Keras model file (the JSON of model.to_json(), Keras 3 or 2; "
              "Sequential or Functional) to train instead of --model; its input "
              "shape and class count are the file's (see docs/models-and-kernels.md).");
DEFINE_int32(input_height, 28, "Image height the model is built for (inception_v3: 299).");
DEFINE_int32(input_width, 28, "Image width the model is built for (inception_v3: 299).");
DEFINE_int32(input_channels, 1, "Image channels the model is built for (inception_v3: 3).");
DEFINE_bool(describe_model, false,
            "Print the model's variables, one \"name shape\" line each, then "
            "\"params_with_moving_statistics=N\" (as Keras's count_params(): with "
            "batch norm's moving means and variances) and \"params=N\" (the "
            "trainable ones), and exit (needs no cluster).");
DEFINE_string(hidden_units, "512",
              "Comma-separated hidden layer sizes of the MLP (and of Wide & Deep's deep part).");
DEFINE_int32(batch_size, 100, "Training batch size per worker.");
DEFINE_bool(unix_socket, false,
            "Reach ps tasks on this host (a loopback address in the spec) "
            "over their gRPC Unix socket (psrt_ps --unix_socket); not with TLS. "
            "Pushes and pulls take a ps task's data-plane Unix socket from its "
            "host without it (psrt_ps --local_data_plane).");
DEFINE_string(wire_dtype, "fp32",
              "How gradients and parameters travel: fp32, bf16 (bfloat16: half "
              "the bytes, fp32's range) or fp16 (half the bytes, more precision, "
              "but gradients beyond 65504 become Inf and are refused). The ps "
              "adds, applies and checkpoints in fp32; the evaluator and the "
              "chief's final evaluation pull fp32.");
DEFINE_string(device, "auto",
              "Where the forward and backward run: auto (a GPU when one is "
              "visible, else the CPU), cpu, or gpu (CUDA; an error when none "
              "is visible). CUDA_VISIBLE_DEVICES chooses the GPUs.");
DEFINE_string(gpu_math, "fp32",
              "How a GPU's matrix products and convolutions round: fp32 (IEEE "
              "single precision, as on the CPU) or tf32 (the tensor cores' "
              "TF32 inputs with FP32 sums, PyTorch's default for "
              "convolutions: faster, about 3 decimal digits per input).");
DEFINE_string(gpu_conv, "auto",
              "How a GPU runs convolutions: auto (per layer shape, the faster "
              "of cuDNN and im2col + cuBLAS, measured in the first step; "
              "im2col alone, with a warning, where libcudnn.so.9 does not "
              "load), cudnn (cuDNN wherever it has an algorithm; an error "
              "without it) or im2col.");
DEFINE_int32(num_gpus, 1,
             "Towers per worker (in-graph replication), one per GPU: each "
             "batch is split over GPUs 0..N-1 and their gradients are "
             "averaged before one push. More than are visible is an error.");
DEFINE_int64(train_steps, 2000, "Stop when the global step reaches this.");
DEFINE_bool(sync_replicas, false,
            "Synchronous training (SyncReplicas): average the gradients of "
            "--replicas_to_aggregate workers per step. Otherwise asynchronous.");
DEFINE_int32(staleness, -1,
             "Asynchronous training with bounded staleness: a worker runs at "
             "most this many steps ahead of the slowest (0: lockstep); "
             "negative: unbounded.");
DEFINE_int32(replicas_to_aggregate, 0,
             "Sync mode: gradients averaged per step; the other workers are "
             "backups. 0: all workers.");
DEFINE_double(weight_decay, 0, "L2 regularization of the weights (not biases).");
DEFINE_double(clip_norm, 0, "Clip gradients by global norm; 0: off.");
DEFINE_bool(overlap_comm, true,
            "Overlap each step's pull with the forward pass and its push with the "
            "backward pass, shard by shard (most with a contiguous or prioritized "
            "--placement); "
            "not with --clip_norm.");
DEFINE_int64(save_checkpoint_steps, 0,
             "Chief: checkpoint every this many steps (needs psrt_ps --checkpoint_dir).");
DEFINE_double(save_checkpoint_secs, 600,
              "Chief: checkpoint every this many seconds; 0: not by time.");
DEFINE_int32(keep_checkpoints, 5, "Checkpoints kept by each parameter server.");
DEFINE_int32(max_failed_saves, 3,
             "Chief: stop with an error once this many checkpoints in a row could not be "
             "written (a full or broken disk); 0: train on regardless.");
DEFINE_int64(eval_every_steps, 0, "Chief: evaluate on the test set every this many steps.");
DEFINE_bool(eval_moving_average, false, "Evaluate with the moving averages.");
DEFINE_string(logdir, "", "Chief: write TensorBoard event files here.");
DEFINE_string(progress, "auto",
              "Chief progress display: bar (one redrawn line), log, or auto "
              "(bar when stderr is a terminal).");
DEFINE_string(placement, "prioritized",
              "Variable placement on parameter servers: prioritized (neighbouring layers "
              "together, which --overlap_comm needs, with the first layers' shards "
              "smallest: less of each step's communication shows), contiguous (runs "
              "of equal bytes), round_robin or greedy (CTR models' default). A job may "
              "resume with another placement than its checkpoint's.");
DEFINE_int64(partition_threshold_bytes, 1 << 20,
             "Variables larger than this are split across parameter servers (CTR models: "
             "16384 unless given, and --placement greedy).");
DEFINE_bool(shuffle, true, "Shuffle this worker's shard of the data each epoch.");
DEFINE_uint64(seed, 1, "Seed of the initial values and the data order.");
DEFINE_int32(log_every_steps, 100, "Log a progress line every this many local steps.");
DEFINE_int32(intra_op_threads, 0, "Threads for the kernels; 0: number of cores.");
DEFINE_double(startup_timeout_secs, 300,
              "How long to wait for the parameter servers and the chief.");
DEFINE_double(ps_wait_secs, 180,
              "After a fault, how long the parameter servers are waited for (a "
              "ps that went away and is not restarted); then the worker fails, "
              "naming the ps, so that a restart policy or the cluster manager "
              "can act.");
DEFINE_double(ps_retry_secs, 60,
              "How long an unreachable parameter server is retried (with "
              "backoff) before the worker gives up; a supervised one that "
              "restarts within this is recovered from.");
DEFINE_double(pull_timeout_secs, 300,
              "How long a pull may wait for the next version (sync mode waits "
              "for the slowest worker); then the worker fails.");
DEFINE_string(init_from_keras_weights, "",
              "Chief: start from this Keras weights file (model.save_weights("
              "\"x.weights.h5\") of the --model_file's model) instead of random "
              "values; a file whose layers or shapes differ is refused, naming them. "
              "A checkpoint the ps tasks restore wins over it.");
DEFINE_string(final_params_out, "",
              "Chief: write the final parameters to this safetensors file.");
DEFINE_int32(metrics_port, 0,
             "Serve Prometheus metrics on http://--bind_host:PORT/metrics; "
             "0: off.");
DEFINE_string(mode, "auto",
              "ps: train against the cluster spec's parameter servers; allreduce: "
              "the workers average their gradients among themselves with a ring "
              "allreduce, as Horovod does (synchronous, no ps tasks); auto: allreduce "
              "when the cluster spec has no ps job, ps otherwise.");
DEFINE_string(checkpoint_dir, "",
              "Allreduce mode: the chief saves checkpoints here (the ps format, one "
              "shard) and every worker restores from here (a directory every worker "
              "reads); with --dense_allreduce, the dense part's, in its folder dense/. "
              "In ps mode the ps tasks take --checkpoint_dir instead.");
DEFINE_bool(dense_allreduce, false,
            "Ps mode, with --sync_replicas --sparse_async (Persia's split): the dense "
            "variables are every worker's own, averaged by a ring allreduce of the "
            "workers at every step, and only the embedding tables are on the ps tasks, "
            "their rows taken on arrival.");
DEFINE_double(fusion_mb, 4,
              "Allreduce mode: gradients are averaged in groups of consecutive "
              "variables of at most this many MB (tensor fusion), each as soon as the "
              "backward pass has finished it (with --overlap_comm), last layers first.");
DEFINE_string(timeline, "",
              "Write a Chrome trace (chrome://tracing, ui.perfetto.dev) of each step's "
              "compute, push and pull (and of each ps shard's encoding, push and pull, "
              "a lane a shard), and in allreduce mode of the fusion, "
              "reduce-scatter, all-gather and apply, to this file (the chief; replica r "
              "writes FILE with \"-r\" before its extension).");
DEFINE_double(allreduce_timeout_secs, 120,
              "Allreduce mode: a worker that sends nothing for this long and then does "
              "not answer either (dead, hung, unreachable), or that cannot be reached "
              "for this long, fails the others, named.");
DEFINE_double(allreduce_busy_timeout_secs, 1800,
              "Allreduce mode: how long a worker that still answers may send nothing "
              "(the chief evaluating or saving between steps) before the others fail.");


namespace psrt {
namespace {

bool IsCtrModel(const std::string& model) { return model == "wide_deep" || model == "dlrm"; }

// --partition_threshold_bytes's default for the CTR models.
constexpr int64_t kCtrPartitionThresholdBytes = 16 << 10;

absl::StatusOr<std::vector<int>> ParseHiddenUnits(const std::string& text,
                                                  const std::string& flag) {
  std::vector<int> units;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n <= 0) {
      return absl::InvalidArgumentError(
          "--" + flag + ": \"" + std::string(part) + "\" is not a positive integer");
    }
    units.push_back(n);
  }
  return units;
}

// --model_file: the file's text, shape and classes into `config`; a flag
// given as well that disagrees with the file is an error naming both.
absl::Status ReadModelFile(WorkerConfig* config) {
  if (!gflags::GetCommandLineFlagInfoOrDie("model").is_default) {
    return absl::InvalidArgumentError("give --model or --model_file, not both");
  }
  ModelOptions& options = config->model_options;
  ASSIGN_OR_RETURN(options.model_json, FileSystem::Default()->ReadFile(FLAGS_model_file));
  options.model_file = FLAGS_model_file;
  ASSIGN_OR_RETURN(const KerasModelShape shape,
                   ReadKerasModelShape(options.model_json, FLAGS_model_file));
  const std::pair<const char*, int> given[] = {{"input_height", shape.input_height},
                                                {"input_width", shape.input_width},
                                                {"input_channels", shape.input_channels},
                                                {"num_classes", shape.num_classes}};
  for (const auto& [flag, value] : given) {
    gflags::CommandLineFlagInfo info = gflags::GetCommandLineFlagInfoOrDie(flag);
    if (!info.is_default && info.current_value != std::to_string(value)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", info.current_value,
                                                     ", but the model file ", FLAGS_model_file,
                                                     " has ", value));
    }
  }
  config->model = "keras";
  options.input_height = shape.input_height;
  options.input_width = shape.input_width;
  options.input_channels = shape.input_channels;
  options.num_classes = shape.num_classes;
  return absl::OkStatus();
}

absl::Status ReadModelFlags(WorkerConfig* config) {
  config->model = FLAGS_model;
  config->describe_model = FLAGS_describe_model;
  ModelOptions& options = config->model_options;
  ASSIGN_OR_RETURN(options.hidden_units, ParseHiddenUnits(FLAGS_hidden_units, "hidden_units"));
  ASSIGN_OR_RETURN(options.bottom_mlp_units, ParseHiddenUnits(FLAGS_bottom_mlp, "bottom_mlp"));
  ASSIGN_OR_RETURN(options.top_mlp_units, ParseHiddenUnits(FLAGS_top_mlp, "top_mlp"));
  options.embedding_dim = FLAGS_embedding_dim;
  // The CTR models read Criteo's fields.
  options.num_dense_features = kCriteoDenseFields;
  options.num_sparse_fields = kCriteoCategoricalFields;
  options.input_height = FLAGS_input_height;
  options.input_width = FLAGS_input_width;
  options.input_channels = FLAGS_input_channels;
  options.num_classes = FLAGS_num_classes;
  if (!FLAGS_model_file.empty()) RETURN_IF_ERROR(ReadModelFile(config));
  options.intra_op_threads = FLAGS_intra_op_threads;
  config->device = FLAGS_device;
  config->num_gpus = FLAGS_num_gpus;
  ASSIGN_OR_RETURN(config->gpu_math, kernels::ParseGpuMath(FLAGS_gpu_math));
  ASSIGN_OR_RETURN(config->gpu_conv, kernels::ParseGpuConv(FLAGS_gpu_conv));
  if (FLAGS_batch_size <= 0) {
    return absl::InvalidArgumentError("--batch_size must be positive");
  }
  if (FLAGS_num_gpus > FLAGS_batch_size) {
    return absl::InvalidArgumentError(absl::StrCat("--num_gpus=", FLAGS_num_gpus,
                                                   " towers cannot share a batch of ",
                                                   FLAGS_batch_size, " (--batch_size)"));
  }
  return absl::OkStatus();
}

absl::Status ReadInputFlags(WorkerConfig* config) {
  InputOptions& input = config->input;
  ASSIGN_OR_RETURN(input.format, ParseInputFormat(FLAGS_data_format));
  input.data_dir = FLAGS_data_dir;
  input.train_data = FLAGS_train_data;
  input.test_data = FLAGS_test_data;
  input.synthetic = FLAGS_synthetic_data;
  // The model's (a --model_file's, or the flags').
  input.height = config->model_options.input_height;
  input.width = config->model_options.input_width;
  input.channels = config->model_options.input_channels;
  input.num_classes = config->model_options.num_classes;
  input.model = config->model == "keras" ? FLAGS_model_file : config->model;
  input.batch_size = FLAGS_batch_size;
  input.shuffle = FLAGS_shuffle;
  input.seed = FLAGS_seed;
  input.decoder_threads = FLAGS_input_threads;
  input.prefetch_batches = FLAGS_input_prefetch_batches;
  input.label_offset = FLAGS_label_offset;
  if (FLAGS_pixel_range != "0-1" && FLAGS_pixel_range != "0-255") {
    return absl::InvalidArgumentError("--pixel_range: \"" + FLAGS_pixel_range +
                                      "\" is not 0-1 or 0-255");
  }
  input.pixel_max = FLAGS_pixel_range == "0-1" ? 1 : 255;
  if (FLAGS_malformed_lines != "stop" && FLAGS_malformed_lines != "skip") {
    return absl::InvalidArgumentError("--malformed_lines: \"" + FLAGS_malformed_lines +
                                      "\" is not stop or skip");
  }
  input.skip_malformed = FLAGS_malformed_lines == "skip";
  const bool ctr_model = IsCtrModel(config->model);
  if (ctr_model != (input.format == InputOptions::Format::kCriteo)) {
    return absl::InvalidArgumentError(
        ctr_model ? "--model=" + config->model + " reads Criteo logs: give --data_format=criteo"
                  : "--data_format=criteo feeds the CTR models: give --model=wide_deep or dlrm");
  }
  if (FLAGS_corrupt_images != "stop" && FLAGS_corrupt_images != "skip") {
    return absl::InvalidArgumentError("--corrupt_images: \"" + FLAGS_corrupt_images +
                                      "\" is not stop or skip");
  }
  input.skip_corrupt = FLAGS_corrupt_images == "skip";
  if (FLAGS_input_cache != "memory" && FLAGS_input_cache != "disk") {
    return absl::InvalidArgumentError("--input_cache: \"" + FLAGS_input_cache +
                                      "\" is not memory or disk");
  }
  input.records_in_memory = FLAGS_input_cache == "memory";
  return absl::OkStatus();
}

absl::Status ReadStoreFlags(WorkerConfig* config) {
  const ClusterSpec& spec = config->cluster.spec;
  ASSIGN_OR_RETURN(config->placement.strategy, ParsePlacementStrategy(FLAGS_placement));
  config->placement.partition_threshold_bytes = FLAGS_partition_threshold_bytes;
  // A CTR model's rows spread over the shards by hash; its dense layers are
  // cut finely and placed greedily by bytes too (its steps do not overlap
  // communication layer by layer, which contiguous placement serves), so
  // that no shard carries more than its share of the bytes (a DLRM's top
  // layer, 87% of its dense part, made one of 2 ps tasks move 1.4x the mean).
  if (IsCtrModel(config->model)) {
    if (gflags::GetCommandLineFlagInfoOrDie("partition_threshold_bytes").is_default) {
      config->placement.partition_threshold_bytes = kCtrPartitionThresholdBytes;
    }
    if (gflags::GetCommandLineFlagInfoOrDie("placement").is_default) {
      config->placement.strategy = PlacementStrategy::kGreedyByBytes;
    }
  }
  PsClient::Options& client = config->ps_client;
  for (int k = 0; k < spec.num_ps(); ++k) client.ps_addresses.push_back(spec.address("ps", k));
  ASSIGN_OR_RETURN(client.ps_stripes, PsStripesFromFlags());
  // Not given: the ps tasks' own, asked at start (worker_task.cc).
  if (gflags::GetCommandLineFlagInfoOrDie("ps_stripes").is_default) client.ps_stripes = 0;
  ASSIGN_OR_RETURN(client.ps_replicas, PsReplicasFromFlags());
  if (client.ps_replicas > 0) {
    if (config->allreduce || config->dense_allreduce) {
      return absl::InvalidArgumentError(
          "--ps_replicas keeps backup copies of the ps tasks' shards: it goes with ps mode, "
          "not with allreduce or --dense_allreduce");
    }
    if (IsCtrModel(config->model)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ps_replicas: embedding tables are not replicated yet; run --model=",
          config->model, " without it"));
    }
    if (spec.num_ps() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ps_replicas=1 keeps each shard's backup on another ps task, and the cluster spec "
          "names ", spec.num_ps(), ": give it 2 or more"));
    }
  }
  ASSIGN_OR_RETURN(client.wire_dtype, ParseWireDtype(FLAGS_wire_dtype));
  // The evaluator judges the model as the shards hold it.
  if (config->evaluator) client.wire_dtype = proto::DT_FLOAT;
  client.replica = config->replica;
  client.security = config->security;
  client.unix_socket = FLAGS_unix_socket;
  client.pull_timeout = absl::Seconds(FLAGS_pull_timeout_secs);
  client.retry_timeout = absl::Seconds(FLAGS_ps_retry_secs);
  ASSIGN_OR_RETURN(const TensorTransport transport, TensorTransportFromFlags());
  if (transport == TensorTransport::kDataPlane && config->security->tls()) {
    return absl::InvalidArgumentError(
        "--tensor_transport=data_plane: the data plane has no TLS, and TLS is on: use "
        "--tensor_transport=grpc or auto (tensors then travel encrypted)");
  }
  client.tensor_transport = config->allreduce || config->security->tls() ? TensorTransport::kGrpc
                                                                          : transport;

  Collective::Options& ring = config->ring;
  ring.rank = config->replica;
  for (int r = 0; r < spec.num_replicas(); ++r) ring.addresses.push_back(spec.ReplicaAddress(r));
  ring.security = config->security;
  ring.timeout = absl::Seconds(FLAGS_allreduce_timeout_secs);
  ring.busy_timeout = absl::Seconds(FLAGS_allreduce_busy_timeout_secs);
  ring.startup_timeout = absl::Seconds(FLAGS_startup_timeout_secs);
  ring.unix_socket = FLAGS_unix_socket;
  // The ring's segments take the data plane as pushes and pulls do (every
  // worker must choose alike: one over gRPC only is refused, naming it).
  ring.data_plane = transport == TensorTransport::kDataPlane ||
                    (transport == TensorTransport::kAuto && !config->security->tls());
  // An elastic job's rings (worker/ring/elastic_ring.h) move their
  // segments over gRPC.
  if (config->allreduce && config->elastic) {
    if (transport == TensorTransport::kDataPlane) {
      return absl::InvalidArgumentError(
          "--tensor_transport=data_plane: the rings of an elastic allreduce job "
          "(--max_workers) move their segments over gRPC; use auto or grpc");
    }
    ring.data_plane = false;
  }
  ASSIGN_OR_RETURN(ring.data_port, DataPortFromFlags());
  ring.local_data_plane = LocalDataPlaneFromFlags();
  config->checkpoint_dir = FLAGS_checkpoint_dir;
  if (config->uses_ring() && FLAGS_fusion_mb <= 0) {  // The ring's flag alone.
    return absl::InvalidArgumentError("--fusion_mb must be positive");
  }
  config->fusion_bytes = static_cast<int64_t>(FLAGS_fusion_mb * 1e6);
  return absl::OkStatus();
}

absl::Status ReadTrainerFlags(WorkerConfig* config) {
  TrainerOptions& options = config->trainer;
  options.replica = config->replica;
  options.num_replicas = config->num_replicas;
  options.batch_size = FLAGS_batch_size;
  options.train_steps = FLAGS_train_steps;
  options.log_every_steps = std::max(1, FLAGS_log_every_steps);
  options.shuffle = FLAGS_shuffle;
  options.seed = FLAGS_seed;
  options.startup_timeout = absl::Seconds(FLAGS_startup_timeout_secs);
  if (FLAGS_ps_wait_secs <= 0) return absl::InvalidArgumentError("--ps_wait_secs must be positive");
  options.ps_wait = absl::Seconds(FLAGS_ps_wait_secs);
  options.final_params_path = FLAGS_final_params_out;
  if (!FLAGS_init_from_keras_weights.empty()) {
    if (FLAGS_model_file.empty()) {
      return absl::InvalidArgumentError(
          "--init_from_keras_weights needs --model_file: the model the weights are of");
    }
    options.initial_values = [json = config->model_options.model_json,
                              source = FLAGS_model_file,
                              weights = FLAGS_init_from_keras_weights] {
      return ReadKerasWeightsOfModel(json, source, weights);
    };
  }
  if (FLAGS_sync_replicas && FLAGS_staleness >= 0) {
    return absl::InvalidArgumentError(
        "--staleness bounds asynchronous training; drop it or --sync_replicas");
  }
  options.staleness = FLAGS_staleness;
  options.weight_decay = FLAGS_weight_decay;
  options.clip_norm = FLAGS_clip_norm;
  options.overlap_comm = FLAGS_overlap_comm;
  options.max_failed_saves = FLAGS_max_failed_saves;
  options.save_checkpoint_steps = FLAGS_save_checkpoint_steps;
  options.save_checkpoint_secs = FLAGS_save_checkpoint_secs;
  options.keep_checkpoints = std::max(1, FLAGS_keep_checkpoints);
  options.eval_every_steps = FLAGS_eval_every_steps;
  options.eval_moving_average = FLAGS_eval_moving_average;
  options.logdir = FLAGS_logdir;
  if (FLAGS_progress == "auto") {
    options.progress_bar = isatty(STDERR_FILENO);
  } else if (FLAGS_progress == "bar" || FLAGS_progress == "log") {
    options.progress_bar = FLAGS_progress == "bar";
  } else {
    return absl::InvalidArgumentError("--progress: \"" + FLAGS_progress +
                                      "\" is not auto, bar or log");
  }

  ASSIGN_OR_RETURN(options.config,
                   TrainingConfigFromFlags(config->num_replicas, &config->decay_epochs,
                                           config->allreduce));
  // Examples consumed per global step: every aggregated replica's batch in
  // sync mode, one batch per update in async mode.
  config->examples_per_step =
      static_cast<double>(FLAGS_batch_size) *
      (FLAGS_sync_replicas || config->allreduce ? options.config.replicas_to_aggregate() : 1);
  if (config->allreduce) {
    // Synchronous by nature: every step averages every worker's gradient.
    if (FLAGS_staleness >= 0 || (FLAGS_replicas_to_aggregate > 0 &&
                                 FLAGS_replicas_to_aggregate != config->num_replicas)) {
      return absl::InvalidArgumentError(
          "allreduce mode averages every worker's gradient at every step: drop "
          "--staleness and --replicas_to_aggregate (backup workers need ps mode)");
    }
    if (FLAGS_wire_dtype != "fp32") {
      return absl::InvalidArgumentError("--wire_dtype: allreduce mode moves float32 only");
    }
    options.config.set_mode(proto::SYNC);
    options.config.set_replicas_to_aggregate(config->num_replicas);
  }
  if (config->dense_allreduce &&
      (!options.config.sparse_async() || FLAGS_staleness >= 0 ||
       options.config.replicas_to_aggregate() != config->num_replicas)) {
    return absl::InvalidArgumentError(
        "--dense_allreduce goes with --sync_replicas --sparse_async, every worker's gradient "
        "averaged at every step by the ring: drop --staleness and --replicas_to_aggregate");
  }
  return absl::OkStatus();
}

// The chief writes FILE; replica r > 0 FILE with "-r" before its extension
// (trace.json: trace-1.json), so one flag serves every task.
std::string ReplicaTimelinePath(const std::string& path, int replica, bool evaluator) {
  if (path.empty() || replica == 0) return path;
  const size_t slash = path.rfind('/');
  size_t dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) {
    dot = path.size();
  }
  std::string out = path;
  out.insert(dot, absl::StrCat("-", evaluator ? "evaluator" : std::to_string(replica)));
  return out;
}

}  // namespace

absl::StatusOr<WorkerConfig> WorkerConfigFromFlags() {
  WorkerConfig config;
  if (FLAGS_describe_model) {  // Needs no cluster: the model's flags alone.
    RETURN_IF_ERROR(ReadModelFlags(&config));
    return config;
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const TransportSecurity> security,
                   TransportSecurityFromFlags());
  ASSIGN_OR_RETURN(config.cluster, ClusterConfigFromFlags(FLAGS_cluster_spec, FLAGS_job_name,
                                                          FLAGS_task_index, security));
  const ClusterSpec& spec = config.cluster.spec;
  const TaskId& task = config.cluster.task;
  config.evaluator = task.job == "evaluator";
  if (task.job != "worker" && task.job != "chief" && !config.evaluator) {
    return absl::InvalidArgumentError(
        "psrt_worker runs worker, chief and evaluator tasks, but this task is " +
        task.ToString() + " (use psrt_ps for ps tasks)");
  }
  config.replica = config.evaluator ? -1 : spec.ReplicaIndex(task);
  config.num_replicas = spec.num_replicas();
  if (FLAGS_mode != "auto" && FLAGS_mode != "ps" && FLAGS_mode != "allreduce") {
    return absl::InvalidArgumentError("--mode: \"" + FLAGS_mode +
                                      "\" is not auto, ps or allreduce");
  }
  config.allreduce = FLAGS_mode == "allreduce" || (FLAGS_mode == "auto" && spec.num_ps() == 0);
  if (config.allreduce && spec.num_ps() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mode=allreduce, but the cluster spec has ", spec.num_ps(),
        " ps tasks, which allreduce mode would leave idle: remove the \"ps\" job"));
  }
  if (!config.allreduce && spec.num_ps() == 0) {
    return absl::InvalidArgumentError(
        "--mode=ps, but the cluster spec has no \"ps\" job (the parameter servers)");
  }
  if (config.allreduce && config.evaluator) {
    return absl::InvalidArgumentError(
        "allreduce mode has no evaluator task: the chief evaluates (--eval_every_steps)");
  }
  config.dense_allreduce = FLAGS_dense_allreduce;
  if (config.dense_allreduce && (config.allreduce || config.evaluator)) {
    return absl::InvalidArgumentError(
        "--dense_allreduce splits a model between the workers' ring and the ps tasks' tables: "
        "ps mode, and no evaluator task (the chief evaluates)");
  }
  ASSIGN_OR_RETURN(const ElasticWorkers elastic,
                   ElasticWorkersFromFlags(spec.num_replicas(), config.replica,
                                           config.dense_allreduce));
  if (elastic.max_workers > 0) config.num_replicas = elastic.max_workers;
  config.elastic = elastic.max_workers > 0;
  config.elastic_lease = elastic.lease;
  if (!config.uses_ring() && !FLAGS_checkpoint_dir.empty()) {
    return absl::InvalidArgumentError(
        "--checkpoint_dir is the ps tasks' flag in ps mode (psrt_ps --checkpoint_dir); "
        "psrt_worker takes it in allreduce mode and with --dense_allreduce only");
  }
  // The chief presents the chief's token, when there is one (roles).
  if (config.replica == 0) security = std::make_shared<const TransportSecurity>(security->ForChief());
  config.security = std::move(security);
  if (const char* count = std::getenv("PSRT_RESTART_COUNT")) {
    absl::SimpleAtoi(count, &config.restarts);
  }

  RETURN_IF_ERROR(ReadModelFlags(&config));
  RETURN_IF_ERROR(ReadInputFlags(&config));
  RETURN_IF_ERROR(ReadStoreFlags(&config));
  RETURN_IF_ERROR(ReadTrainerFlags(&config));
  config.bind_host = BindHostFromFlags();
  config.metrics_port = FLAGS_metrics_port;
  config.timeline_path = ReplicaTimelinePath(FLAGS_timeline, config.replica, config.evaluator);
  return config;
}

}  // namespace psrt
