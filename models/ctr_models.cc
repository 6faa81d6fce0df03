#include "models/ctr_models.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/cpu_context.h"
#include "kernels/dot_interaction.h"
#include "kernels/embedding_bag.h"
#include "kernels/ops.h"
#include "kernels/workspace.h"
#include "models/dense_mlp.h"

namespace psrt {
namespace {

using kernels::CpuContext;

// `units` with `last` appended: an MLP's hidden layers and its output.
std::vector<int> WithOutput(std::vector<int> units, int last) {
  units.push_back(last);
  return units;
}

// dst[r, 0:cols] = src[r, 0:cols] for `rows` rows, each array with its own
// row stride: a concat's part or a slice of one.
void CopyBlock(int64_t rows, int64_t cols, const float* src, int64_t src_stride, float* dst,
               int64_t dst_stride) {
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride, cols * sizeof(float));
  }
}

// Bag offsets (kernels/embedding_bag.h) of `bags` bags of `size` ids each.
void UniformBags(int64_t bags, int64_t size, std::vector<int64_t>* offsets) {
  offsets->resize(bags + 1);
  for (int64_t b = 0; b <= bags; ++b) (*offsets)[b] = b * size;
}

// The stable sigmoid and sigmoid cross-entropy of logit z against label y:
// max(z, 0) - z * y + log(1 + exp(-|z|)).
double Sigmoid(double z) {
  const double e = std::exp(-std::abs(z));
  return z >= 0 ? 1 / (1 + e) : e / (1 + e);
}
double SigmoidCrossEntropy(double z, int32_t y) {
  return std::max(z, 0.0) - z * y + std::log1p(std::exp(-std::abs(z)));
}

// CtrModel: what Wide & Deep and DLRM share: the variables, the checks of
// a batch and its sparse features, the loss and its gradient, the hooks,
// Evaluate. A subclass declares its variables (into vars_) and computes
// the logits and their backward.
//
// Thread safety: not thread-safe.
class CtrModel : public Model {
 public:
  const std::vector<VariableDef>& variables() const override { return vars_.defs(); }
  const std::vector<TableDef>& tables() const override { return tables_; }
  void SetSparseFeatures(SparseFeatures* features) override { features_ = features; }
  std::string device_name() const override {
    return absl::StrCat("cpu (", ctx_.num_threads(), " threads)");
  }
  // The scratch memory; system_allocations is not counted.
  kernels::DeviceMemoryStats device_memory() const override {
    const int64_t bytes = (workspace_.capacity() + mlp_workspace_capacity()) *
                          static_cast<int64_t>(sizeof(float));
    return kernels::DeviceMemoryStats{bytes, bytes, 0};
  }
  absl::Status status() const override { return absl::OkStatus(); }

  void Initialize(uint64_t seed, std::vector<Tensor>* params) const override {
    vars_.Initialize(seed, params);
  }

  float ComputeGradients(const std::vector<Tensor>& params, const Tensor& images,
                         absl::Span<const int32_t> labels, std::vector<Tensor>* grads,
                         const StepHooks& hooks) override {
    CheckInputs(params, images, labels);
    const int64_t batch = images.dim(0);
    grads->resize(params.size());
    for (size_t v = 0; v < params.size(); ++v) {
      if ((*grads)[v].shape() != params[v].shape()) (*grads)[v] = Tensor(params[v].shape());
    }
    if (features_->grads.size() != tables_.size()) features_->grads.resize(tables_.size());
    const int num_vars = vars_.size();
    if (hooks.before_read) hooks.before_read(0, num_vars);
    const float* logits = Forward(params, images.data(), batch);
    float* dlogits = workspace_.Get(kLogitGrads, batch);
    double sum = 0;
    for (int64_t b = 0; b < batch; ++b) {
      sum += SigmoidCrossEntropy(logits[b], labels[b]);
      dlogits[b] = static_cast<float>((Sigmoid(logits[b]) - labels[b]) / batch);
    }
    const float loss = static_cast<float>(sum / batch);
    if (hooks.loss_ready) hooks.loss_ready(loss);
    Backward(params, images.data(), batch, dlogits, grads);
    if (hooks.gradients_ready) hooks.gradients_ready(0, num_vars);
    return loss;
  }

  Evaluation Evaluate(const std::vector<Tensor>& params, const Tensor& images,
                      absl::Span<const int32_t> labels) override {
    CheckInputs(params, images, labels);
    const int64_t batch = images.dim(0);
    const float* logits = Forward(params, images.data(), batch);
    Evaluation eval;
    eval.probabilities.resize(batch);
    double sum = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const float p = static_cast<float>(Sigmoid(logits[b]));
      eval.probabilities[b] = p;
      eval.correct += (p >= 0.5f) == (labels[b] == 1);
      sum += SigmoidCrossEntropy(logits[b], labels[b]);
    }
    eval.mean_loss = static_cast<float>(sum / batch);
    return eval;
  }

 protected:
  // REQUIRES: options valid (CheckOptions).
  CtrModel(std::string name, const ModelOptions& options, std::vector<TableDef> tables)
      : ctx_(options.intra_op_threads),
        num_dense_(options.num_dense_features),
        num_fields_(options.num_sparse_fields),
        dim_(options.embedding_dim),
        name_(std::move(name)),
        tables_(std::move(tables)) {}

  // Workspace slots: the base's, then the subclass's from kFirstModelSlot.
  enum : int { kLogitGrads, kFirstModelSlot };

  // The logits [batch] of the batch whose dense features are `dense`
  // [batch, num_dense_] and sparse ones features_; valid until the next
  // Forward.
  virtual const float* Forward(const std::vector<Tensor>& params, const float* dense,
                               int64_t batch) = 0;
  // The backward of the last Forward (same params and dense) from dlogits
  // = dL/dlogits [batch], which it may overwrite: overwrites `grads` (sized
  // like params) and, through row_grads, the rows' gradients.
  virtual void Backward(const std::vector<Tensor>& params, const float* dense, int64_t batch,
                        float* dlogits, std::vector<Tensor>* grads) = 0;
  // Floats held by the subclass's MLPs' workspaces.
  virtual int64_t mlp_workspace_capacity() const = 0;

  // The batch's ids as positions among the distinct ids: [batch * fields].
  absl::Span<const int32_t> index() const { return features_->unique.index; }
  int64_t num_unique() const { return static_cast<int64_t>(features_->unique.unique.size()); }
  // Table t's pulled rows [num_unique(), dim].
  const float* rows(int t) const { return features_->rows[t].data(); }
  // Table t's row gradients, resized to [num_unique(), dim].
  float* row_grads(int t) {
    Tensor& g = features_->grads[t];
    const int64_t dim = tables_[t].dim;
    if (g.rank() != 2 || g.dim(0) != num_unique() || g.dim(1) != dim) g.Resize({num_unique(), dim});
    return g.data();
  }

  CpuContext ctx_;
  VariableList vars_;
  kernels::Workspace workspace_;
  const int64_t num_dense_;
  const int64_t num_fields_;
  const int64_t dim_;

 private:
  // A mismatch is a bug in the caller (the trainer builds params from
  // variables() and the features from tables()).
  void CheckInputs(const std::vector<Tensor>& params, const Tensor& images,
                   absl::Span<const int32_t> labels) const {
    CHECK(features_ != nullptr) << name_ << ": no sparse features: call SetSparseFeatures "
                                << "before ComputeGradients or Evaluate";
    CHECK_EQ(params.size(), vars_.defs().size()) << name_ << ": wrong number of parameters";
    for (size_t v = 0; v < params.size(); ++v) {
      CHECK(params[v].shape() == vars_.defs()[v].shape)
          << vars_.defs()[v].name << " has shape " << ShapeToString(params[v].shape())
          << ", want " << ShapeToString(vars_.defs()[v].shape);
    }
    CHECK(images.rank() == 2 && images.dim(0) >= 1 && images.dim(1) == num_dense_)
        << name_ << ": dense features have shape " << ShapeToString(images.shape())
        << ", want [batch >= 1, " << num_dense_ << "]";
    const int64_t batch = images.dim(0);
    CHECK_EQ(static_cast<int64_t>(labels.size()), batch) << name_ << ": one label per example";
    for (size_t i = 0; i < labels.size(); ++i) {
      CHECK(labels[i] == 0 || labels[i] == 1)
          << name_ << ": label " << labels[i] << " of example " << i << " is not 0 or 1";
    }
    const SparseFeatures& f = *features_;
    CHECK_EQ(f.num_fields, num_fields_) << name_ << ": sparse fields";
    CHECK_EQ(f.batch_size(), batch) << name_ << ": sparse features for another batch size";
    CHECK_EQ(f.unique.index.size(), f.ids.size()) << name_ << ": ids not deduplicated";
    for (int32_t u : f.unique.index) {
      CHECK(u >= 0 && u < num_unique()) << name_ << ": id position " << u << " outside [0, "
                                        << num_unique() << ")";
    }
    CHECK_EQ(f.rows.size(), tables_.size()) << name_ << ": rows of every table";
    for (size_t t = 0; t < tables_.size(); ++t) {
      const Tensor& rows = f.rows[t];
      CHECK(rows.rank() == 2 && rows.dim(0) == num_unique() && rows.dim(1) == tables_[t].dim)
          << name_ << ": table " << tables_[t].name << " rows have shape "
          << ShapeToString(rows.shape()) << ", want [" << num_unique() << ","
          << tables_[t].dim << "]";
    }
  }

  const std::string name_;
  const std::vector<TableDef> tables_;
  SparseFeatures* features_ = nullptr;
};

class WideDeep : public CtrModel {
 public:
  explicit WideDeep(const ModelOptions& options)
      : CtrModel("wide_deep", options, {{"wide", 1, /*zero_rows=*/true}, {"deep", options.embedding_dim}}),
        // Declared in this order: the wide part's variables come first.
        dense_weights_(vars_.Add("wide/dense_weights", {num_dense_, 1},
                                 std::sqrt(1.0 / num_dense_))),
        bias_(vars_.Add("wide/bias", {1}, 0)),
        deep_("deep_mlp", num_dense_ + num_fields_ * dim_, WithOutput(options.hidden_units, 1),
              /*relu_last=*/false, &vars_) {}

 private:
  enum Table { kWide, kDeep };
  enum Slot : int { kLogits = kFirstModelSlot, kEmbeddings, kDeepInput, kDeepInputGrads,
                    kEmbeddingGrads };

  const float* Forward(const std::vector<Tensor>& params, const float* dense,
                       int64_t batch) override {
    const int64_t embedded = num_fields_ * dim_;
    const int64_t deep_width = num_dense_ + embedded;
    // Wide: the sum of each example's wide rows (a bag per example), plus
    // its dense features' linear part.
    UniformBags(batch, num_fields_, &example_bags_);
    float* logits = workspace_.Get(kLogits, batch);
    kernels::EmbeddingBagForward(ctx_, rows(kWide), 1, index(), example_bags_, logits);
    kernels::Gemm(ctx_, {batch, 1, num_dense_}, 1.0f, dense, params[dense_weights_].data(),
                  1.0f, logits);
    // Deep: each field's row (a bag per field), after the dense features.
    UniformBags(batch * num_fields_, 1, &field_bags_);
    float* embeddings = workspace_.Get(kEmbeddings, batch * embedded);
    kernels::EmbeddingBagForward(ctx_, rows(kDeep), dim_, index(), field_bags_, embeddings);
    deep_input_ = workspace_.Get(kDeepInput, batch * deep_width);
    CopyBlock(batch, num_dense_, dense, num_dense_, deep_input_, deep_width);
    CopyBlock(batch, embedded, embeddings, embedded, deep_input_ + num_dense_, deep_width);
    const float* deep = deep_.Forward(ctx_, params, deep_input_, batch);
    const float bias = params[bias_].data()[0];
    for (int64_t b = 0; b < batch; ++b) logits[b] += bias + deep[b];
    return logits;
  }

  void Backward(const std::vector<Tensor>& params, const float* dense, int64_t batch,
                float* dlogits, std::vector<Tensor>* grads) override {
    const int64_t embedded = num_fields_ * dim_;
    const int64_t deep_width = num_dense_ + embedded;
    // Wide, first: the deep MLP's backward overwrites dlogits.
    kernels::EmbeddingBagBackward(ctx_, dlogits, 1, index(), example_bags_, num_unique(),
                                  row_grads(kWide));
    kernels::MatMulBackward(ctx_, {batch, 1, num_dense_}, dense, params[dense_weights_].data(),
                            dlogits, nullptr, (*grads)[dense_weights_].data());
    kernels::BiasAddBackward(ctx_, dlogits, batch, 1, (*grads)[bias_].data());
    float* input_grads = workspace_.Get(kDeepInputGrads, batch * deep_width);
    deep_.Backward(ctx_, params, deep_input_, batch, dlogits, input_grads, grads);
    float* embedding_grads = workspace_.Get(kEmbeddingGrads, batch * embedded);
    CopyBlock(batch, embedded, input_grads + num_dense_, deep_width, embedding_grads, embedded);
    kernels::EmbeddingBagBackward(ctx_, embedding_grads, dim_, index(), field_bags_,
                                  num_unique(), row_grads(kDeep));
  }

  int64_t mlp_workspace_capacity() const override { return deep_.workspace_capacity(); }

  const int dense_weights_;  // Variable indices.
  const int bias_;
  DenseMlp deep_;
  // The last Forward's bags and deep input.
  std::vector<int64_t> example_bags_;
  std::vector<int64_t> field_bags_;
  float* deep_input_ = nullptr;
};

class Dlrm : public CtrModel {
 public:
  explicit Dlrm(const ModelOptions& options)
      : CtrModel("dlrm", options, {{"embeddings", options.embedding_dim}}),
        vectors_(num_fields_ + 1),
        pairs_(kernels::DotInteractionPairs(vectors_)),
        bottom_("bottom_mlp", num_dense_,
                WithOutput(options.bottom_mlp_units, options.embedding_dim),
                /*relu_last=*/true, &vars_),
        top_("top_mlp", dim_ + pairs_, WithOutput(options.top_mlp_units, 1),
             /*relu_last=*/false, &vars_) {}

 private:
  enum Slot : int { kInteractionInput = kFirstModelSlot, kInteractions, kTopInput,
                    kTopInputGrads, kBottomGrads, kInteractionGrads, kInteractionInputGrads };

  const float* Forward(const std::vector<Tensor>& params, const float* dense,
                       int64_t batch) override {
    const int64_t stride = vectors_ * dim_;  // One example's interaction input.
    const float* bottom = bottom_.Forward(ctx_, params, dense, batch);
    // [bottom output, field 0's row, ..., field F-1's row] per example: a
    // bag per field, after an empty bag where the bottom output goes.
    offsets_.resize(batch * vectors_ + 1);
    int64_t* offset = offsets_.data();
    for (int64_t p = 0; p < batch * num_fields_; p += num_fields_) {
      *offset++ = p;
      for (int64_t f = 0; f < num_fields_; ++f) *offset++ = p + f;
    }
    *offset = batch * num_fields_;
    interaction_input_ = workspace_.Get(kInteractionInput, batch * stride);
    kernels::EmbeddingBagForward(ctx_, rows(0), dim_, index(), offsets_, interaction_input_);
    CopyBlock(batch, dim_, bottom, dim_, interaction_input_, stride);
    float* interactions = workspace_.Get(kInteractions, batch * pairs_);
    kernels::DotInteractionForward(ctx_, interaction_input_, batch, vectors_, dim_,
                                   interactions);
    const int64_t top_width = dim_ + pairs_;
    top_input_ = workspace_.Get(kTopInput, batch * top_width);
    CopyBlock(batch, dim_, bottom, dim_, top_input_, top_width);
    CopyBlock(batch, pairs_, interactions, pairs_, top_input_ + dim_, top_width);
    return top_.Forward(ctx_, params, top_input_, batch);
  }

  void Backward(const std::vector<Tensor>& params, const float* dense, int64_t batch,
                float* dlogits, std::vector<Tensor>* grads) override {
    const int64_t stride = vectors_ * dim_;
    const int64_t top_width = dim_ + pairs_;
    float* top_input_grads = workspace_.Get(kTopInputGrads, batch * top_width);
    top_.Backward(ctx_, params, top_input_, batch, dlogits, top_input_grads, grads);
    float* interaction_grads = workspace_.Get(kInteractionGrads, batch * pairs_);
    CopyBlock(batch, pairs_, top_input_grads + dim_, top_width, interaction_grads, pairs_);
    float* input_grads = workspace_.Get(kInteractionInputGrads, batch * stride);
    kernels::DotInteractionBackward(ctx_, interaction_input_, interaction_grads, batch,
                                    vectors_, dim_, input_grads);
    kernels::EmbeddingBagBackward(ctx_, input_grads, dim_, index(), offsets_, num_unique(),
                                  row_grads(0));
    // The bottom output reaches the loss twice: straight into the top MLP
    // and through the interactions.
    float* bottom_grads = workspace_.Get(kBottomGrads, batch * dim_);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t j = 0; j < dim_; ++j) {
        bottom_grads[b * dim_ + j] =
            top_input_grads[b * top_width + j] + input_grads[b * stride + j];
      }
    }
    bottom_.Backward(ctx_, params, dense, batch, bottom_grads, nullptr, grads);
  }

  int64_t mlp_workspace_capacity() const override {
    return bottom_.workspace_capacity() + top_.workspace_capacity();
  }

  const int64_t vectors_;  // Per example: the bottom output and a row per field.
  const int64_t pairs_;
  DenseMlp bottom_;
  DenseMlp top_;
  // The last Forward's bags and the inputs of its interaction and top MLP.
  std::vector<int64_t> offsets_;
  float* interaction_input_ = nullptr;
  float* top_input_ = nullptr;
};

// InvalidArgument for a GPU or a size that is not positive, naming the
// model and the option.
absl::Status CheckOptions(const char* model, const ModelOptions& options,
                          std::vector<std::pair<const char*, const std::vector<int>*>> units) {
  if (options.device.type != kernels::DeviceType::kCpu) {
    return absl::InvalidArgumentError(absl::StrCat(model, " runs on the CPU only for now"));
  }
  const std::pair<const char*, int> sizes[] = {
      {"num_dense_features", options.num_dense_features},
      {"num_sparse_fields", options.num_sparse_fields},
      {"embedding_dim", options.embedding_dim},
  };
  for (const auto& [option, value] : sizes) {
    if (value < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(model, ": ", option, " must be positive, got ", value));
    }
  }
  // The parameter servers' limit on a table's rows (ps/shard_tables.cc):
  // refused here before a batch's activations of that width are allocated.
  constexpr int kMaxEmbeddingDim = 1 << 16;
  if (options.embedding_dim > kMaxEmbeddingDim) {
    return absl::InvalidArgumentError(absl::StrCat(model, ": embedding_dim ", options.embedding_dim,
                                                   " is above ", kMaxEmbeddingDim,
                                                   ", the longest row a table holds"));
  }
  for (const auto& [option, list] : units) {
    for (int value : *list) {
      if (value < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat(model, ": ", option, " must be positive, got ", value));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> NewWideDeep(const ModelOptions& options) {
  RETURN_IF_ERROR(CheckOptions("wide_deep", options, {{"hidden_units", &options.hidden_units}}));
  return std::unique_ptr<Model>(new WideDeep(options));
}

absl::StatusOr<std::unique_ptr<Model>> NewDlrm(const ModelOptions& options) {
  RETURN_IF_ERROR(CheckOptions("dlrm", options,
                               {{"bottom_mlp_units", &options.bottom_mlp_units},
                                {"top_mlp_units", &options.top_mlp_units}}));
  return std::unique_ptr<Model>(new Dlrm(options));
}

}  // namespace psrt
