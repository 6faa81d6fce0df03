// psrt_export_checkpoint: merges the shards of one checkpoint into a single
// safetensors file of the model's variables (see ps/checkpoint_export.h).
//
//   psrt_export_checkpoint --checkpoint_dir=ckpt --out=model.safetensors
//       [--step=N] [--moving_average] [--num_shards=K]
//
// Exits 0 after writing --out, 1 when the checkpoint cannot be exported
// (the message names the file or variable), 2 for bad flags.
#include <cstdint>
#include <iostream>
#include <string>

#include "gflags/gflags.h"
#include "ps/checkpoint_export.h"

DEFINE_string(checkpoint_dir, "",
              "Directory holding the shard checkpoints "
              "(model.ckpt-<step>.ps-<k>-of-<K>.safetensors and the indexes "
              "checkpoint.ps-<k>-of-<K>).");
DEFINE_int64(step, -1,
             "Checkpoint step to export; -1: the newest step listed in every "
             "shard's index.");
DEFINE_string(out, "", "The safetensors file to write.");
DEFINE_bool(moving_average, false,
            "Export the variables' moving averages, under the plain variable "
            "names, instead of their values.");
DEFINE_int32(num_shards, 0,
             "Number of ps shards that wrote the checkpoint; 0: discovered "
             "from the index files in --checkpoint_dir (of several counts, the "
             "one of the newest step).");

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "merges a sharded psrt checkpoint into one safetensors file\n"
      "  psrt_export_checkpoint --checkpoint_dir=DIR --out=FILE [--step=N] "
      "[--moving_average] [--num_shards=K]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (argc > 1) {
    std::cerr << "psrt_export_checkpoint: unexpected argument " << argv[1] << "\n";
    return 2;
  }
  if (FLAGS_checkpoint_dir.empty() || FLAGS_out.empty()) {
    std::cerr << "psrt_export_checkpoint: --checkpoint_dir and --out are required\n";
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
  absl::StatusOr<psrt::MergedCheckpoint> merged =
      psrt::ExportCheckpoint(options, FLAGS_out);
  if (!merged.ok()) {
    std::cerr << "psrt_export_checkpoint: " << merged.status().message() << "\n";
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
