// The sparse (CTR) models: binary classifiers of a click from dense
// features and categorical ids, whose embedding rows live in tables on the
// parameter servers (sparse_features.h; design.md, "Sparse embedding
// tables"). Both run on the CPU.
//
// Input, per example: `images` holds the dense features [batch,
// num_dense_features] (the reader's log(1 + x) counts), SetSparseFeatures
// the num_sparse_fields ids and their pulled rows, labels are 0 or 1. The
// loss is the mean sigmoid cross-entropy of one logit per example;
// ComputeGradients writes the dense variables' gradients into `grads` and
// the rows' into the features' `grads` (per table [unique ids, dim], the
// gradient of the mean loss with respect to each distinct row: a row used
// by several fields or examples gets the sum). Evaluate gives each
// example's probability sigmoid(logit), and counts p >= 0.5 as a
// prediction of 1. A model without finer steps, it announces every
// variable to StepHooks at once (before_read at the start, loss_ready and
// gradients_ready at the end).
//
// Wide & Deep (Cheng et al. 2016), "wide_deep": tables "wide" (dim 1) and
// "deep" (dim embedding_dim), both looked up with the same ids.
//   wide = sum over fields of the field's wide row
//          + dense * wide/dense_weights [num_dense, 1] + wide/bias [1]
//   deep = MLP(concat(dense, the fields' deep rows)): hidden_units with
//          ReLU, then one linear unit; its input is num_dense + F * dim
//   logit = wide + deep
// Variables: wide/dense_weights, wide/bias, deep_mlp/layer<l>/{weights,
// biases}.
//
// DLRM (Naumov et al. 2019, as facebookresearch/dlrm builds it), "dlrm":
// table "embeddings" (dim embedding_dim).
//   x = bottom MLP(dense): bottom_mlp_units, then embedding_dim, all ReLU
//   z = the pairwise dots of [x, row of field 0, ..., row of field F-1]
//       (kernels/dot_interaction.h: the strictly lower triangle)
//   logit = top MLP(concat(x, z)): top_mlp_units with ReLU, then one
//           linear unit
// Variables: bottom_mlp/layer<l>/{weights, biases}, then top_mlp/....
//
// Layers are fully connected ("<scope>/layer<l>/weights" [in, out], biases
// [out]), weights truncated normal with stddev sqrt(2 / fan_in) before a
// ReLU and sqrt(1 / fan_in) otherwise, biases 0 (wide/dense_weights:
// sqrt(1 / num_dense)); the rows' initial values are the tables' own
// (ps/embedding_table.h). After the first step at a batch size,
// ComputeGradients allocates nothing, except that the rows' gradients are
// resized when the number of distinct ids changes (new storage only when
// it grows).
//
// Thread safety: as Model's (one model per thread); the ops run on
// intra_op_threads threads.
#ifndef PSRT_MODELS_CTR_MODELS_H_
#define PSRT_MODELS_CTR_MODELS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "models/model.h"

namespace psrt {

// InvalidArgument when options.device is a GPU, or naming the option when
// num_dense_features, num_sparse_fields, embedding_dim or a layer's units
// (hidden_units for Wide & Deep, bottom_mlp_units and top_mlp_units for
// DLRM) is not positive.
absl::StatusOr<std::unique_ptr<Model>> NewWideDeep(const ModelOptions& options);
absl::StatusOr<std::unique_ptr<Model>> NewDlrm(const ModelOptions& options);

}  // namespace psrt

#endif  // PSRT_MODELS_CTR_MODELS_H_
