// SparseFeatures: one batch's categorical input to a sparse (CTR) model,
// and the embedding rows it reads and writes (design.md, "Sparse embedding
// tables"). The tables live on the parameter servers; a worker pulls only
// the rows of the batch's distinct ids and pushes one gradient row per id.
//
// Every table of a model is looked up with the same ids: each example's
// num_fields ids, one per field, keyed by their field (Criteo's reader
// makes them so: worker/input/criteo_reader.h), so that one table holds
// every field. Table t's rows and gradients are [unique.unique.size(),
// tables[t].dim], in `unique` order.
//
// Thread safety: a plain struct, used by one step at a time: the trainer
// fills the ids, a pull the rows (ps_client.h: one transport thread per
// shard, each writing the rows of its own ids), the model the gradients.
#ifndef PSRT_MODELS_SPARSE_FEATURES_H_
#define PSRT_MODELS_SPARSE_FEATURES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/tensor.h"
#include "kernels/embedding_bag.h"

namespace psrt {

// An embedding table a model reads: its name on the parameter servers, the
// length of its rows, and whether they start at zero (a linear model's
// per-id weights) rather than random.
struct TableDef {
  std::string name;
  int dim = 0;
  bool zero_rows = false;
};

struct SparseFeatures {
  int num_fields = 0;
  // [batch * num_fields], example-major: ids[b * num_fields + f].
  std::vector<uint64_t> ids;
  // The batch's distinct ids (what travels), and each id's position among
  // them: ids[i] == unique.unique[unique.index[i]].
  kernels::UniqueIds unique;
  // Per table, in the model's tables() order: the pulled rows of
  // unique.unique, and (written by ComputeGradients) their gradients.
  std::vector<Tensor> rows;
  std::vector<Tensor> grads;

  int64_t batch_size() const {
    return num_fields == 0 ? 0 : static_cast<int64_t>(ids.size()) / num_fields;
  }
};

}  // namespace psrt

#endif  // PSRT_MODELS_SPARSE_FEATURES_H_
