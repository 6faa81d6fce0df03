// Keras 3 weights files (model.save_weights("x.weights.h5")), read and
// written through the HDF5 C library.
//
// The format: each saveable (the model at the root, each layer at
// "layers/<snake_case class name>[_N]", a nested model's layers deeper, as in
// "layers/sequential/layers/conv2d") has a group "<path>/vars" whose "name"
// attribute (a scalar variable-length UTF-8 string, as h5py writes a Python
// str) is the layer's name, holding its variables as float32 datasets "0",
// "1", ... in order (C order, the variable's shape, () for a scalar). The
// groups above a vars group have no attributes.
//
// Thread safety: the HDF5 library here is not thread-safe; every call of
// this module holds one process-wide mutex around its HDF5 calls, so calls
// from several threads are safe but run one at a time. Nothing else in the
// process may call HDF5 concurrently. The module turns HDF5's own error
// printing off (errors come only as a Status).
#ifndef PSRT_MODELS_KERAS_WEIGHTS_FILE_H_
#define PSRT_MODELS_KERAS_WEIGHTS_FILE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor.h"

namespace psrt {

// One saveable of a Keras weights file: its group path ("" for the model,
// "layers/conv2d_1"; relative, no leading or trailing "/"), the layer's name
// (the "name" attribute of <path>/vars: written, but not read back, see
// ReadKerasWeights) and its variables in order (vars/0,
// vars/1, ...).
struct KerasWeightsEntry {
  std::string path;
  std::string name;
  std::vector<Tensor> vars;
};

// Writes `entries` in the given order, each as <path>/vars with its name
// attribute (even without vars). The file is built in memory and then
// written as WriteFileAtomically does (common/file_util.h: a temporary name
// beside `file`, fsynced, renamed over it, mode 0600): `file` holds the old
// contents or the new, never a part. Errors name the file and the path at
// fault (InvalidArgument for a path given twice or malformed).
absl::Status WriteKerasWeights(const std::string& file,
                               absl::Span<const KerasWeightsEntry> entries);

// Reads every group named "vars" in the file, at any depth, depth-first in
// the order HDF5 iterates links by name ("layers/..." before the root's
// "vars"), each with its variables vars/0 .. vars/<n-1>. Errors name the
// file and the group or dataset at fault: NotFound for a missing file,
// DataLoss for one that is not HDF5 or is damaged (truncated, or a dataset
// larger than the file holds), InvalidArgument for a vars group whose
// members are not the datasets 0..n-1, or with a dataset that is neither
// float32 nor an integer (a Normalization's count, read as a float).
// Entries' names are left empty: the name attribute only informs (Keras
// matches by path; older Keras 3 releases write none), and HDF5 1.10 reads
// a damaged file's variable-length strings out of bounds (fuzzed).
absl::StatusOr<std::vector<KerasWeightsEntry>> ReadKerasWeights(const std::string& file);

}  // namespace psrt

#endif  // PSRT_MODELS_KERAS_WEIGHTS_FILE_H_
