// Model: a trainable network as the worker sees it.
//
// A model declares its variables (name + shape, in a fixed order that every
// worker agrees on), fills initial values from a seed, and computes the mean
// loss and the gradients of a batch. Parameters and gradients are passed in
// as plain Tensors, one per variable, in variables() order; the model keeps
// only scratch buffers (activations), which it reuses from step to step.
// Batch norms' moving statistics are variables that ComputeGradients
// updates itself: their "gradients" are their new values (common/tensor.h's
// IsMovingStatistic).
//
// Thread safety: not thread-safe (the scratch buffers); use one Model per
// thread.
#ifndef PSRT_MODELS_MODEL_H_
#define PSRT_MODELS_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/tensor.h"
#include "kernels/device.h"
#include "models/sparse_features.h"

namespace psrt {

struct ModelOptions {
  // Input images are [batch, input_height * input_width * input_channels],
  // NHWC (channels fastest; the MLP just sees a vector).
  int input_height = 28;
  int input_width = 28;
  int input_channels = 1;
  int num_classes = 10;
  std::vector<int> hidden_units = {512};  // MLP hidden layer sizes.
  int intra_op_threads = 0;               // 0: number of cores.
  // Where the forward and backward run. On a GPU the model's parameters,
  // activations and gradients live in device memory; Initialize and
  // ComputeGradients still take and give host tensors (page-locked ones,
  // so that the copies are asynchronous).
  kernels::DeviceSpec device;
  // Model "keras": the Keras model file's text (keras_model.h), and its
  // path, which errors name.
  std::string model_json;
  std::string model_file;
  // Sparse (CTR) models ("wide_deep", "dlrm"): the dense features
  // ([batch, num_dense_features] in place of the images), the categorical
  // fields (one id each), the embedding rows' length, and the MLPs: DLRM's
  // bottom MLP (its last layer is embedding_dim wide, added) and top MLP,
  // Wide & Deep's deep MLP (hidden_units).
  int num_dense_features = 13;
  int num_sparse_fields = 26;
  int embedding_dim = 16;
  std::vector<int> bottom_mlp_units = {64};
  std::vector<int> top_mlp_units = {64, 32};
};

// Lets a caller overlap a training step's communication with its compute
// (worker/training/step_pipeline.h): ComputeGradients calls `before_read(b, e)` before
// the forward pass first reads variables [b, e), `loss_ready(loss)` once the
// loss is known, and `gradients_ready(b, e)` once the gradients of [b, e)
// are final in the caller's tensors. Every
// variable is announced once to each (a model without finer steps announces
// them all at once); the calls come from the calling thread, in the order the
// model reaches them: layer order forward, reverse layer order backward.
// Either may be empty.
struct StepHooks {
  std::function<void(int begin, int end)> before_read;
  // Called once, before the first gradients_ready: the batch's mean loss.
  std::function<void(float loss)> loss_ready;
  std::function<void(int begin, int end)> gradients_ready;
};

class Model {
 public:
  virtual ~Model() = default;

  virtual const std::vector<VariableDef>& variables() const = 0;
  // The embedding tables a sparse (CTR) model reads, kept on the parameter
  // servers (models/sparse_features.h); none for a dense model.
  virtual const std::vector<TableDef>& tables() const;
  // The categorical input and pulled rows the next ComputeGradients or
  // Evaluate reads, and where ComputeGradients writes the rows' gradients.
  // REQUIRES (a model with tables): set before each such call, `features`
  // valid through it, its rows pulled for its ids. Ignored by dense models.
  virtual void SetSparseFeatures(SparseFeatures* features) { (void)features; }

  // The floats of non-trainable state it keeps itself, as constants, that
  // Keras's count_params() counts beside the variables: a Normalization's
  // mean, variance and count.
  virtual int64_t num_non_trainable() const { return 0; }

  // The device the model runs on, for logs: "cpu (2 threads)", "gpu:0 (...)".
  virtual std::string device_name() const = 0;
  // Its device allocator's counters (device.h), for tests and reports.
  virtual kernels::DeviceMemoryStats device_memory() const = 0;
  // Where a batch's images are best kept: page-locked memory on a GPU (its
  // upload is then a DMA with no staging copy), null (the heap) otherwise.
  virtual HostAllocator* input_allocator() const { return nullptr; }
  // The first fault of its device (kernels/device_fault.h: a failed CUDA
  // call, launch or copy), sticky; OK on the CPU. Once it is not OK, the
  // results of ComputeGradients and Evaluate are meaningless (the step
  // hooks are not called past the fault, so nothing meaningless is
  // announced): the caller checks it after each call and fails the step.
  virtual absl::Status status() const = 0;

  // Resizes `params` to one tensor per variable and fills initial values,
  // deterministically from `seed`.
  virtual void Initialize(uint64_t seed, std::vector<Tensor>* params) const = 0;

  // Forward and backward pass on one batch, in training mode (batch norm
  // uses and updates batch statistics; dropout drops). `images` is
  // [B, H*W*C] (NHWC) with pixels in [0, 1]; labels are class ids. Overwrites
  // `grads` (resized to match params) with d(mean loss)/d(param); returns the
  // mean loss.
  // With `hooks`, the parameters of a variable need to hold their values
  // only once before_read has returned for it, and its gradient is final
  // once gradients_ready has named it.
  float ComputeGradients(const std::vector<Tensor>& params, const Tensor& images,
                         absl::Span<const int32_t> labels, std::vector<Tensor>* grads) {
    return ComputeGradients(params, images, labels, grads, StepHooks());
  }
  virtual float ComputeGradients(const std::vector<Tensor>& params,
                                 const Tensor& images,
                                 absl::Span<const int32_t> labels,
                                 std::vector<Tensor>* grads,
                                 const StepHooks& hooks) = 0;

  // In inference mode (batch norm uses its moving statistics, dropout keeps
  // everything; nothing the next training step sees changes): how many
  // examples of the batch have the label as their arg-max prediction, and
  // the batch's mean loss.
  struct Evaluation {
    int64_t correct = 0;
    float mean_loss = 0;
    // Binary classifiers (the CTR models): each example's predicted
    // probability of label 1, for AUC; empty for other models.
    std::vector<float> probabilities;
    // Image classifiers (NetBuilder's models): the logits, [batch, classes]
    // row-major (the softmax's input); empty for other models.
    std::vector<float> logits;
  };
  virtual Evaluation Evaluate(const std::vector<Tensor>& params, const Tensor& images,
                              absl::Span<const int32_t> labels) = 0;
};

// A model's parameters as Keras counts them: the trainable variables'
// elements, and count_params()'s, which adds the moving statistics
// (variables) and num_non_trainable().
struct ParameterCount {
  int64_t trainable = 0;
  int64_t all = 0;
};
ParameterCount CountParameters(const Model& model);

// The registry: {"mlp", "lenet", "inception_mini", "inception_v3", "resnet50",
// "resnet101", "vgg16", "alexnet", "wide_deep", "dlrm"} and "keras". An
// unknown name is InvalidArgument listing the known ones.
absl::StatusOr<std::unique_ptr<Model>> NewModel(const std::string& name,
                                                const ModelOptions& options);

}  // namespace psrt

#endif  // PSRT_MODELS_MODEL_H_
