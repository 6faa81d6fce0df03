#include "worker/training/towers.h"

#include <algorithm>
#include <limits>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "kernels/elementwise.h"

namespace psrt {

absl::StatusOr<std::vector<kernels::DeviceSpec>> ChooseTowerDevices(
    absl::string_view device, int num_gpus, int visible_gpus) {
  if (device != "auto" && device != "cpu" && device != "gpu") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", device, " is not one of auto, cpu, gpu"));
  }
  if (num_gpus < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_gpus=", num_gpus, " must be at least 1"));
  }
  const bool gpu = device == "gpu" || (device == "auto" && visible_gpus > 0);
  if (!gpu) {
    if (num_gpus > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--num_gpus=", num_gpus, " asks for GPU towers, but training runs on "
          "the CPU (--device=", device, ", ", visible_gpus, " GPUs visible)"));
    }
    return std::vector<kernels::DeviceSpec>{kernels::DeviceSpec{}};
  }
  if (num_gpus > visible_gpus) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device=", device, " --num_gpus=", num_gpus, " asks for ", num_gpus,
        " GPUs, but this process sees ", visible_gpus,
        visible_gpus == 0 ? " (no GPU, no driver, a build without CUDA, or "
                            "CUDA_VISIBLE_DEVICES hides them)"
                          : " (CUDA_VISIBLE_DEVICES chooses which)"));
  }
  std::vector<kernels::DeviceSpec> devices(num_gpus);
  for (int i = 0; i < num_gpus; ++i) {
    devices[i].type = kernels::DeviceType::kGpu;
    devices[i].gpu = i;
  }
  return devices;
}

Towers::Towers(std::vector<std::unique_ptr<Model>> towers)
    : towers_(std::move(towers)), slices_(towers_.size()), tower_grads_(towers_.size()) {
  CHECK(!towers_.empty());
}

HostAllocator* Towers::input_allocator() const {
  return towers_.size() == 1 ? towers_[0]->input_allocator() : nullptr;
}

float Towers::ComputeGradients(const std::vector<Tensor>& params, const Tensor& images,
                               absl::Span<const int32_t> labels,
                               std::vector<Tensor>* grads, const StepHooks& hooks) {
  const int n = size();
  const int64_t batch = images.dim(0);
  const int64_t pixels = images.dim(1);
  CHECK_GE(batch, n) << "a batch of " << batch << " cannot feed " << n << " towers";
  if (n == 1) return towers_[0]->ComputeGradients(params, images, labels, grads, hooks);
  const int num_variables = static_cast<int>(params.size());
  if (hooks.before_read && num_variables > 0) hooks.before_read(0, num_variables);

  std::vector<int64_t> begin(n + 1, 0);
  for (int i = 0; i < n; ++i) begin[i + 1] = begin[i] + batch / n + (i < batch % n ? 1 : 0);
  std::vector<float> losses(n);
  auto run = [&](int i) {
    const int64_t rows = begin[i + 1] - begin[i];
    slices_[i].Resize({rows, pixels});
    std::copy_n(images.data() + begin[i] * pixels, rows * pixels, slices_[i].data());
    losses[i] = towers_[i]->ComputeGradients(params, slices_[i],
                                             labels.subspan(begin[i], rows), &tower_grads_[i]);
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < n; ++i) threads.emplace_back(run, i);
  run(0);
  for (auto& t : threads) t.join();

  // Each tower's gradient is the mean over its slice: weight by slice size.
  grads->resize(params.size());
  float loss = 0;
  for (int i = 0; i < n; ++i) {
    const float weight = static_cast<float>(begin[i + 1] - begin[i]) / batch;
    loss += weight * losses[i];
    for (size_t v = 0; v < params.size(); ++v) {
      Tensor& out = (*grads)[v];
      const Tensor& g = tower_grads_[i][v];
      if (i == 0 && out.shape() != g.shape()) {
        out = Tensor(g.shape(), g.allocator());
      }
      if (i == 0) std::fill_n(out.data(), out.num_elements(), 0.0f);
      kernels::Axpy(weight, g.flat(), out.flat());
    }
  }
  if (!status().ok()) return std::numeric_limits<float>::quiet_NaN();  // Nothing real.
  if (hooks.loss_ready) hooks.loss_ready(loss);
  if (hooks.gradients_ready && num_variables > 0) hooks.gradients_ready(0, num_variables);
  return loss;
}

absl::Status Towers::status() const {
  for (const auto& tower : towers_) RETURN_IF_ERROR(tower->status());
  return absl::OkStatus();
}

}  // namespace psrt
