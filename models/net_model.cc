// NetModel: the Model that NetBuilder::Build returns (net_graph.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/device.h"
#include "models/initializers.h"
#include "models/net_graph.h"

namespace psrt {

namespace {

using kernels::DeviceArray;

// The model built by NetBuilder: runs its graph's layers forward in node
// order and backward in reverse, on its device.
//
// On a GPU each step copies the batch to the device on the compute stream,
// each layer's parameters on the upload stream (the layer's forward waits
// for them, the layers before it do not), and each layer's gradients to the
// host (the caller's tensors) on the download stream as soon as that
// layer's backward is queued, so the copies overlap the rest of the
// backward; gradients_ready names a layer once its copies have landed, in
// backward order, as on the CPU. On the CPU the layers read and write the
// caller's tensors in place.
class NetModel : public Model {
 public:
  NetModel(const ModelOptions& options, NetBuilder::Graph graph,
           std::unique_ptr<kernels::Device> device)
      : device_(std::move(device)),
        graph_(std::move(graph)),
        num_classes_(options.num_classes),
        step_result_({2}, device_->host_allocator()),
        staging_({0}, device_->host_allocator()) {
    const size_t n = graph_.nodes.size();
    outputs_.resize(n);
    grads_.resize(n);
    grad_ready_.resize(n);
    in_ptrs_.resize(n);
    din_ptrs_.resize(n);
    accumulate_.resize(n);
    for (size_t i = 1; i < n; ++i) {
      in_ptrs_[i].resize(graph_.nodes[i].inputs.size());
      din_ptrs_[i].resize(graph_.nodes[i].inputs.size());
      accumulate_[i].resize(graph_.nodes[i].inputs.size());
    }
    temps_.resize(n);
    const size_t vars = graph_.variables.size();
    param_ptrs_.resize(vars);
    grad_ptrs_.resize(vars);
    if (!device_->host_memory()) {
      device_params_.resize(vars);
      device_grads_.resize(vars);
    }
  }

  const std::vector<VariableDef>& variables() const override { return graph_.variables; }
  int64_t num_non_trainable() const override { return graph_.non_trainable; }
  std::string device_name() const override { return device_->name(); }
  HostAllocator* input_allocator() const override { return device_->host_allocator(); }
  kernels::DeviceMemoryStats device_memory() const override { return device_->memory_stats(); }
  absl::Status status() const override { return device_->status(); }

  void Initialize(uint64_t seed, std::vector<Tensor>* params) const override {
    std::mt19937_64 rng(seed);
    params->resize(graph_.variables.size());
    for (size_t v = 0; v < graph_.variables.size(); ++v) {
      Tensor& t = (*params)[v];
      t = Tensor(graph_.variables[v].shape, device_->host_allocator());
      const VariableInit& init = graph_.inits[v];
      std::uniform_real_distribution<double> uniform(-init.uniform_limit, init.uniform_limit);
      for (float& x : t.flat()) {
        x = init.stddev > 0 ? init::TruncatedNormal(rng, init.stddev / init::kTruncatedNormalStddev)
            : init.uniform_limit > 0 ? static_cast<float>(uniform(rng))
                                     : init.value;
      }
    }
  }

  float ComputeGradients(const std::vector<Tensor>& params, const Tensor& images,
                         absl::Span<const int32_t> labels, std::vector<Tensor>* grads,
                         const StepHooks& hooks) override {
    CheckInputs(params, images, labels);
    device_->Bind();
    const int64_t batch = images.dim(0);
    grads->resize(params.size());
    for (size_t v = 0; v < params.size(); ++v) {
      if ((*grads)[v].shape() != params[v].shape()) {
        (*grads)[v] = Tensor(params[v].shape(), device_->host_allocator());
      }
    }
    const StepContext step{device_.get(), /*training=*/true, step_++};
    PlaceStep(params, images, labels, grads);
    Forward(step, params, batch, hooks.before_read);
    const int last = static_cast<int>(graph_.nodes.size()) - 1;
    const float* logits = outputs_[last].data();
    device_->SoftmaxCrossEntropyForward(logits, labels_, batch, num_classes_,
                                        loss_.Reserve(device_.get(), 1));
    device_->CopyToHostAfterCompute(step_result_.data(), loss_.data(), sizeof(float));
    // On the CPU the loss is there already; on a GPU it arrives with the
    // gradients, at the end.
    if (device_->host_memory() && hooks.loss_ready) hooks.loss_ready(step_result_.data()[0]);

    std::fill(grad_ready_.begin(), grad_ready_.end(), false);
    // GPU: a mark per layer's gradient copies, in backward order, so that
    // each layer's gradients reach the hook as soon as they are on the host
    // while the GPU runs the rest of the backward.
    const bool gpu = !device_->host_memory();
    const int loss_mark = gpu ? device_->MarkHostCopies() : 0;
    copy_marks_.clear();
    announced_ = 0;
    loss_announced_ = false;
    faulted_ = false;
    device_->SoftmaxCrossEntropyBackward(logits, labels_, batch, num_classes_,
                                         grads_[last].Reserve(device_.get(), batch * num_classes_));
    grad_ready_[last] = true;
    for (int i = last; i >= 1; --i) {
      const NetBuilder::Graph::Node& node = graph_.nodes[i];
      CHECK(grad_ready_[i]) << node.what << " does not reach the logits";
      std::vector<char>& accumulate = accumulate_[i];
      std::fill(accumulate.begin(), accumulate.end(), 0);
      for (size_t j = 0; j < node.inputs.size(); ++j) {
        const int in = node.inputs[j];
        float* din = nullptr;
        if (in != NetBuilder::kInput) {
          const int64_t size = batch * graph_.nodes[in].dims.size();
          if (!grad_ready_[in]) {
            din = grads_[in].Reserve(device_.get(), size);
            grad_ready_[in] = true;
          } else {
            din = temps_[in].Reserve(device_.get(), size);
            accumulate[j] = true;
          }
        }
        din_ptrs_[i][j] = din;
      }
      SetInputs(i);
      node.layer->Backward(step, param_ptrs_, in_ptrs_[i], outputs_[i].data(), batch,
                           grads_[i].data(), din_ptrs_[i], grad_ptrs_);
      for (size_t j = 0; j < node.inputs.size(); ++j) {
        if (accumulate[j]) {
          const int in = node.inputs[j];
          device_->Accumulate(temps_[in].data(), grads_[in].data(),
                              batch * graph_.nodes[in].dims.size());
        }
      }
      if (node.var_end == node.var_begin) continue;
      if (gpu) {
        for (int v = node.var_begin; v < node.var_end; ++v) {
          device_->CopyToHostAfterCompute((*grads)[v].data(), grad_ptrs_[v],
                                          (*grads)[v].num_bytes());
        }
        copy_marks_.push_back({device_->MarkHostCopies(), i});
        // The layers whose copies have landed already go out now, while
        // this thread still queues the rest: queueing a large network's
        // backward can take about as long as the GPU runs it.
        AnnounceGradients(hooks, loss_mark, /*wait=*/false);
      } else if (hooks.gradients_ready) {
        hooks.gradients_ready(node.var_begin, node.var_end);
      }
    }
    if (gpu) AnnounceGradients(hooks, loss_mark, /*wait=*/true);
    device_->WaitForHostCopies().IgnoreError();  // A fault stays in status().
    return step_result_.data()[0];
  }

  Evaluation Evaluate(const std::vector<Tensor>& params, const Tensor& images,
                      absl::Span<const int32_t> labels) override {
    CheckInputs(params, images, labels);
    device_->Bind();
    const StepContext step{device_.get(), /*training=*/false, step_};
    PlaceStep(params, images, labels, /*grads=*/nullptr);
    const int64_t batch = images.dim(0);
    Forward(step, params, batch, /*before_read=*/nullptr);
    const float* logits = outputs_.back().data();
    int32_t* correct = correct_.Reserve(device_.get(), 1);
    device_->CountCorrect(logits, labels_, batch, num_classes_, correct);
    device_->SoftmaxCrossEntropyForward(logits, labels_, batch, num_classes_,
                                        loss_.Reserve(device_.get(), 1));
    // The count lands in the second slot of the page-locked step_result_.
    device_->CopyToHostAfterCompute(step_result_.data() + 1, correct, sizeof(int32_t));
    device_->CopyToHostAfterCompute(step_result_.data(), loss_.data(), sizeof(float));
    Evaluation evaluation;
    evaluation.logits.resize(batch * num_classes_);
    device_->CopyToHostAfterCompute(evaluation.logits.data(), logits,
                                    evaluation.logits.size() * sizeof(float));
    device_->WaitForHostCopies().IgnoreError();  // A fault stays in status().
    int32_t host_correct = 0;
    std::memcpy(&host_correct, step_result_.data() + 1, sizeof(int32_t));
    evaluation.correct = host_correct;
    evaluation.mean_loss = step_result_.data()[0];
    return evaluation;
  }

 private:
  // Points param_ptrs_, grad_ptrs_ (when grads is not null), images_ and
  // labels_ at the step's data on the device: the caller's own memory on
  // the CPU; on a GPU, device buffers that the batch is copied into here
  // (through page-locked staging unless the images are page-locked already)
  // and each layer's parameters in Forward.
  // GPU: hands the hooks, in backward order, the loss and then each layer
  // whose gradient copies have landed; with `wait`, every layer queued,
  // waiting for their copies. Past a fault nothing more is announced: its
  // gradients are not real.
  void AnnounceGradients(const StepHooks& hooks, int loss_mark, bool wait) {
    if (faulted_) return;
    if (!loss_announced_ && hooks.loss_ready) {
      if (!wait && !device_->HostCopiesLanded(loss_mark)) return;
      if (!device_->WaitForHostCopies(loss_mark).ok()) {
        faulted_ = true;
        return;
      }
      hooks.loss_ready(step_result_.data()[0]);
    }
    loss_announced_ = true;
    if (!hooks.gradients_ready) return;
    for (; announced_ < copy_marks_.size(); ++announced_) {
      const auto [mark, i] = copy_marks_[announced_];
      if (!wait && !device_->HostCopiesLanded(mark)) return;
      if (!device_->WaitForHostCopies(mark).ok()) {
        faulted_ = true;
        return;
      }
      hooks.gradients_ready(graph_.nodes[i].var_begin, graph_.nodes[i].var_end);
    }
  }

  void PlaceStep(const std::vector<Tensor>& params, const Tensor& images,
                 absl::Span<const int32_t> labels, std::vector<Tensor>* grads) {
    kernels::Device* dev = device_.get();
    if (dev->host_memory()) {
      for (size_t v = 0; v < params.size(); ++v) {
        param_ptrs_[v] = params[v].data();
        if (grads != nullptr) grad_ptrs_[v] = (*grads)[v].data();
      }
      images_ = images.data();
      labels_ = labels.data();
      return;
    }
    for (size_t v = 0; v < params.size(); ++v) {
      param_ptrs_[v] = device_params_[v].Reserve(dev, params[v].num_elements());
      grad_ptrs_[v] = device_grads_[v].Reserve(dev, params[v].num_elements());
    }
    // A copy from pageable memory would stage it through the driver's
    // buffers and hold this thread; the staging buffer is free again here,
    // since the previous step's work has finished.
    const float* host_images = images.data();
    const size_t label_bytes = labels.size() * sizeof(int32_t);
    const bool pinned = images.allocator() == dev->host_allocator();
    staging_.Resize({(pinned ? 0 : images.num_elements()) + static_cast<int64_t>(labels.size())});
    if (!pinned) {
      std::memcpy(staging_.data(), images.data(), images.num_bytes());
      host_images = staging_.data();
    }
    float* host_labels = staging_.data() + (pinned ? 0 : images.num_elements());
    std::memcpy(host_labels, labels.data(), label_bytes);
    float* x = device_images_.Reserve(dev, images.num_elements());
    dev->CopyToDevice(x, host_images, images.num_bytes());
    int32_t* y = device_labels_.Reserve(dev, labels.size());
    dev->CopyToDevice(y, host_labels, label_bytes);
    images_ = x;
    labels_ = y;
  }

  void SetInputs(int i) {
    const std::vector<int>& inputs = graph_.nodes[i].inputs;
    for (size_t j = 0; j < inputs.size(); ++j) {
      in_ptrs_[i][j] = inputs[j] == NetBuilder::kInput ? images_ : outputs_[inputs[j]].data();
    }
  }

  // Runs the layers in node order; before a layer with variables, waits
  // for them (`before_read`, may be empty) and, on a GPU, uploads them on
  // the upload stream, which the layer's compute then waits for: the next
  // layers' parameters travel while this one computes.
  void Forward(const StepContext& step, const std::vector<Tensor>& params, int64_t batch,
               const std::function<void(int, int)>& before_read) {
    const bool gpu = !device_->host_memory();
    if (gpu) device_->BeginUploads();
    for (size_t i = 1; i < graph_.nodes.size(); ++i) {
      const NetBuilder::Graph::Node& node = graph_.nodes[i];
      if (node.var_end > node.var_begin) {
        if (before_read) before_read(node.var_begin, node.var_end);
        if (gpu) {
          for (int v = node.var_begin; v < node.var_end; ++v) {
            device_->UploadToDevice(device_params_[v].data(), params[v].data(),
                                    params[v].num_bytes());
          }
          device_->ComputeWaitsForUploads();
        }
      }
      SetInputs(i);
      float* out = outputs_[i].Reserve(device_.get(), batch * node.dims.size());
      node.layer->Forward(step, param_ptrs_, in_ptrs_[i], batch, out);
    }
  }

  // The inputs must match the variables; a mismatch is a bug in the caller
  // (the trainer builds both from variables()).
  void CheckInputs(const std::vector<Tensor>& params, const Tensor& images,
                   absl::Span<const int32_t> labels) const {
    CHECK_EQ(params.size(), graph_.variables.size()) << "wrong number of parameters";
    for (size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].shape() == graph_.variables[i].shape)
          << graph_.variables[i].name << " has shape " << ShapeToString(params[i].shape())
          << ", want " << ShapeToString(graph_.variables[i].shape);
    }
    const int64_t size = graph_.nodes[0].dims.size();
    CHECK(images.rank() == 2 && images.dim(0) >= 1 && images.dim(1) == size)
        << "images have shape " << ShapeToString(images.shape()) << ", want [batch >= 1, " << size
        << "]";
    CHECK_EQ(static_cast<int64_t>(labels.size()), images.dim(0)) << "one label per image";
    for (size_t i = 0; i < labels.size(); ++i) {
      CHECK(labels[i] >= 0 && labels[i] < num_classes_)
          << "label " << labels[i] << " of example " << i << " is outside [0, " << num_classes_
          << ")";
    }
  }

  // Declared first, destroyed last: every array below is in its memory.
  const std::unique_ptr<kernels::Device> device_;
  const NetBuilder::Graph graph_;
  const int64_t num_classes_;
  uint64_t step_ = 0;
  // Per node, reused from step to step: its output, d(loss)/d(output),
  // whether that gradient has been written in this backward, and the
  // pointer lists handed to its layer.
  std::vector<DeviceArray<float>> outputs_;
  std::vector<DeviceArray<float>> grads_;
  std::vector<bool> grad_ready_;
  std::vector<std::vector<const float*>> in_ptrs_;
  std::vector<std::vector<float*>> din_ptrs_;
  // Per node and input, in a backward: whether that input's gradient is
  // added to one already there.
  std::vector<std::vector<char>> accumulate_;
  // Per node read by several layers: a later consumer's share of its
  // gradient, added into grads_ after that consumer's backward.
  std::vector<DeviceArray<float>> temps_;
  // The step's parameters, gradients and batch on the device (PlaceStep).
  std::vector<const float*> param_ptrs_;
  std::vector<float*> grad_ptrs_;
  const float* images_ = nullptr;
  const int32_t* labels_ = nullptr;
  // GPU only: the device copies behind those pointers.
  std::vector<DeviceArray<float>> device_params_;
  std::vector<DeviceArray<float>> device_grads_;
  DeviceArray<float> device_images_;
  DeviceArray<int32_t> device_labels_;
  // Page-locked host copies of a pageable batch (images, then labels).
  Tensor staging_;
  // ComputeGradients on a GPU: per layer with variables, in backward order,
  // the mark of its gradient copies and its node.
  std::vector<std::pair<int, int>> copy_marks_;
  size_t announced_ = 0;         // copy_marks_[0, announced_) went to the hooks.
  bool loss_announced_ = false;  // The loss went to loss_ready (or needs none).
  bool faulted_ = false;         // A wait for the copies failed: announce no more.
  // Device scalars, and the host memory (page-locked on a GPU) that the
  // step's loss is copied into.
  DeviceArray<float> loss_;
  DeviceArray<int32_t> correct_;
  Tensor step_result_;
};

}  // namespace

std::unique_ptr<Model> NewNetModel(const ModelOptions& options,
                                   NetBuilder::Graph graph,
                                   std::unique_ptr<kernels::Device> device) {
  return std::make_unique<NetModel>(options, std::move(graph), std::move(device));
}

}  // namespace psrt
