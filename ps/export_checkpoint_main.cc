// psrt_export_checkpoint: merges the shards of one checkpoint into a single
// safetensors file of the model's variables (see ps/checkpoint_export.h),
// and/or the weights file that Keras's model.load_weights reads for the
// Keras model file the job trained (models/keras_weights.h).
//
//   psrt_export_checkpoint --checkpoint_dir=ckpt --out=model.safetensors
//       [--step=N] [--moving_average] [--num_shards=K]
//   psrt_export_checkpoint --checkpoint_dir=ckpt --keras_weights=model.weights.h5
//       --model_file=model.json [--step=N] [--moving_average]
//
// Exits 0 after writing --out, 1 when the checkpoint cannot be exported
// (the message names the file or variable), 2 for bad flags.
#include <cstdint>
#include <iostream>
#include <map>
#include <string>

#include "common/file_system.h"
#include "common/status_macros.h"
#include "gflags/gflags.h"
#include "models/keras_weights.h"
#include "ps/checkpoint_export.h"

DEFINE_string(checkpoint_dir, "",
              "Directory holding the shard checkpoints "
              "(model.ckpt-<step>.ps-<k>-of-<K>.safetensors and the indexes "
              "checkpoint.ps-<k>-of-<K>).");
DEFINE_int64(step, -1,
             "Checkpoint step to export; -1: the newest step listed in every "
             "shard's index.");
DEFINE_string(out, "", "The safetensors file to write.");
DEFINE_string(keras_weights, "",
              "The Keras weights file to write (Keras 3's .weights.h5 layout) for "
              "--model_file, which Keras loads with "
              "model_from_json(open(MODEL).read()).load_weights(FILE).");
DEFINE_string(model_file, "",
              "The Keras model file (model.to_json()) the job trained with "
              "psrt_worker --model_file: the layers --keras_weights is written for.");
DEFINE_bool(moving_average, false,
            "Export the variables' moving averages, under the plain variable "
            "names, instead of their values.");
DEFINE_int32(num_shards, 0,
             "Number of ps shards that wrote the checkpoint; 0: discovered "
             "from the index files in --checkpoint_dir (of several counts, the "
             "one of the newest step).");

namespace {

// --keras_weights: the merged variables as the --model_file's Keras weights.
absl::Status WriteKerasWeights(const psrt::MergedCheckpoint& merged) {
  ASSIGN_OR_RETURN(const std::string json,
                   psrt::FileSystem::Default()->ReadFile(FLAGS_model_file));
  std::map<std::string, const psrt::Tensor*> values;
  for (const auto& [name, tensor] : merged.variables) values[name] = &tensor;
  return psrt::WriteKerasWeightsOfModel(
      json, FLAGS_model_file,
      [&](const std::string& name) -> const psrt::Tensor* {
        auto it = values.find(name);
        return it == values.end() ? nullptr : it->second;
      },
      FLAGS_keras_weights);
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "merges a sharded psrt checkpoint into one safetensors file, or writes it as a Keras "
      "model file's weights\n"
      "  psrt_export_checkpoint --checkpoint_dir=DIR --out=FILE [--step=N] "
      "[--moving_average] [--num_shards=K]\n"
      "  psrt_export_checkpoint --checkpoint_dir=DIR --keras_weights=OUT.weights.h5 "
      "--model_file=MODEL.json [--step=N] [--moving_average]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::cerr << "psrt_export_checkpoint: unexpected argument " << argv[1] << "\n";
    return 2;
  }
  if (FLAGS_checkpoint_dir.empty() || (FLAGS_out.empty() && FLAGS_keras_weights.empty())) {
    std::cerr << "psrt_export_checkpoint: --checkpoint_dir and --out or --keras_weights are "
                 "required\n";
    return 2;
  }
  if (FLAGS_keras_weights.empty() != FLAGS_model_file.empty()) {
    std::cerr << "psrt_export_checkpoint: --keras_weights and --model_file go together\n";
    return 2;
  }
  if (FLAGS_num_shards < 0) {
    std::cerr << "psrt_export_checkpoint: --num_shards must be >= 0, not "
              << FLAGS_num_shards << "\n";
    return 2;
  }

  psrt::CheckpointExportOptions options;
  options.checkpoint_dir = FLAGS_checkpoint_dir;
  options.step = FLAGS_step;
  options.num_shards = FLAGS_num_shards;
  options.moving_average = FLAGS_moving_average;
  absl::StatusOr<psrt::MergedCheckpoint> merged = psrt::MergeShardCheckpoints(options);
  if (!merged.ok()) {
    std::cerr << "psrt_export_checkpoint: " << merged.status().message() << "\n";
    return 1;
  }
  // The Keras weights first: they can be refused (another model's file, a
  // missing variable), and a refusal then leaves no --out written either.
  if (!FLAGS_keras_weights.empty()) {
    const absl::Status written = WriteKerasWeights(*merged);
    if (!written.ok()) {
      std::cerr << "psrt_export_checkpoint: " << written.message() << "\n";
      return 1;
    }
    std::cout << "wrote the Keras weights of " << FLAGS_model_file << " (step " << merged->step
              << (options.moving_average ? ", moving averages" : "") << ") to "
              << FLAGS_keras_weights << "\n";
    if (FLAGS_out.empty()) return 0;
  }
  if (const absl::Status written = psrt::WriteMergedCheckpoint(*merged, options, FLAGS_out);
      !written.ok()) {
    std::cerr << "psrt_export_checkpoint: " << written.message() << "\n";
    return 1;
  }
  int64_t parameters = 0;
  for (const auto& [name, tensor] : merged->variables) parameters += tensor.num_elements();
  int64_t rows = 0;
  for (const psrt::MergedTable& table : merged->tables) rows += table.ids.size();
  std::cout << "exported " << merged->variables.size() << " variables ("
            << parameters << " parameters"
            << (options.moving_average ? ", moving averages" : "") << ")";
  if (!merged->tables.empty()) {
    std::cout << " and " << merged->tables.size() << " embedding tables (" << rows << " rows)";
  }
  std::cout << " of step " << merged->step << " from " << merged->num_shards
            << " shards to " << FLAGS_out << "\n";
  return 0;
}
