#include "kernels/cudnn_conv.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/cuda_check.h"
#include "kernels/cudnn_library.h"
#include "kernels/ops_cuda.h"

namespace psrt {
namespace kernels {
namespace {

// The most scratch memory one algorithm may use.
constexpr size_t kMaxScratchBytes = size_t{1} << 30;

// The shape, for the log.
std::string ShapeName(const Conv2DShape& s) {
  return absl::StrCat(s.batch, "x", s.in_height, "x", s.in_width, "x", s.in_channels, " * ",
                      s.filter_height, "x", s.filter_width, "x", s.out_channels, " stride ",
                      s.stride_height, "x", s.stride_width,
                      s.padding == Padding::kSame ? " SAME" : " VALID");
}

// out = the transpose of the row-major [rows, cols] matrix a, through
// cuBLAS's geam (a row-major matrix is its column-major transpose).
void Transpose(const CudaContext& ctx, const float* a, int64_t rows, int64_t cols, float* out) {
  const float one = 1.0f, zero = 0.0f;
  PSRT_CUDA_RECORD(ctx, cublasSgeam(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows),
                                    static_cast<int>(cols), &one, a, static_cast<int>(cols), &zero,
                                    out, static_cast<int>(rows), out, static_cast<int>(rows)));
}

int64_t FloatsFor(size_t bytes) {
  return static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float));
}

cudnnMathType_t RequestedMath(GpuMath math) {
  return math == GpuMath::kTf32 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

// Whether an algorithm's math honours the device's mode: fp32 takes FMA
// kernels alone (CUDNN_DEFAULT_MATH allows TF32 on Ampere and later); tf32
// anything but a conversion to fp16.
bool MathAllowed(GpuMath math, cudnnMathType_t algorithm_math) {
  if (math == GpuMath::kFp32) return algorithm_math == CUDNN_FMA_MATH;
  return algorithm_math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// One direction's measured choice.
struct ConvAlgorithm {
  enum class State { kUnmeasured, kCudnn, kIm2col } state = State::kUnmeasured;
  int algo = 0;  // A cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t.
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t scratch_bytes = 0;
};

// cuDNN's fastest algorithm for one direction into *a: `find(count,
// &found, perf)` is that direction's cudnnFind*Algorithm, whose results
// come fastest first; the fastest that succeeded, fits kMaxScratchBytes and
// honours the math mode wins. False where none does (said in the log).
template <class Perf, int kCount, class Find>
bool FindFastest(const CudaContext& ctx, const CudnnLibrary& cudnn,
                 cudnnConvolutionDescriptor_t conv, GpuMath math, const char* direction,
                 const Conv2DShape& s, ConvAlgorithm* a, const Find& find) {
  // Measured alone: the work queued before would stretch the timings.
  PSRT_CUDA_RECORD(ctx, cudaStreamSynchronize(ctx.stream()));
  Perf perf[kCount];
  int found = 0;
  cudnnStatus_t st = cudnn.SetConvolutionMathType(conv, RequestedMath(math));
  if (st == CUDNN_STATUS_SUCCESS) st = find(kCount, &found, perf);
  for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < found; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= kMaxScratchBytes &&
        MathAllowed(math, perf[i].mathType)) {
      a->algo = static_cast<int>(perf[i].algo);
      a->math = perf[i].mathType;
      a->scratch_bytes = perf[i].memory;
      return true;
    }
  }
  LOG(WARNING) << "cuDNN has no " << direction << " algorithm for " << ShapeName(s)
               << (st == CUDNN_STATUS_SUCCESS ? std::string()
                                              : absl::StrCat(" (", cudnn.GetErrorString(st), ")"))
               << "; im2col runs it";
  return false;
}

// Milliseconds of the work `run` queues on ctx's stream, by CUDA events, on
// its second run (the first grows buffers and loads code); infinity on a
// fault (recorded in ctx).
float Milliseconds(const CudaContext& ctx, const std::function<void()>& run) {
  cudaEvent_t start = nullptr, stop = nullptr;
  float ms = std::numeric_limits<float>::infinity();
  if (PSRT_CUDA_RECORD(ctx, cudaEventCreate(&start)) &&
      PSRT_CUDA_RECORD(ctx, cudaEventCreate(&stop))) {
    run();
    PSRT_CUDA_RECORD(ctx, cudaEventRecord(start, ctx.stream()));
    run();
    PSRT_CUDA_RECORD(ctx, cudaEventRecord(stop, ctx.stream()));
    if (!PSRT_CUDA_RECORD(ctx, cudaEventSynchronize(stop)) ||
        !PSRT_CUDA_RECORD(ctx, cudaEventElapsedTime(&ms, start, stop))) {
      ms = std::numeric_limits<float>::infinity();
    }
  }
  if (stop != nullptr) cudaEventDestroy(stop);
  if (start != nullptr) cudaEventDestroy(start);
  return ms;
}

// Decides a direction's path on its first call: im2col where cuDNN has no
// algorithm (found false); cuDNN's in kCudnn mode; in kAuto the faster of
// the two, each whole path (transposes and padding copies included) timed
// on the call's own buffers (the chosen path then overwrites the outputs).
void Decide(const CudaContext& ctx, const Conv2DShape& s, GpuConv mode, const char* direction,
            bool found, ConvAlgorithm* a, const std::function<void()>& run_cudnn,
            const std::function<void()>& run_im2col) {
  if (!found) {
    a->state = ConvAlgorithm::State::kIm2col;
  } else if (mode == GpuConv::kCudnn) {
    a->state = ConvAlgorithm::State::kCudnn;
  } else {
    // A path whose run faulted (recorded in ctx, and sticky: the step fails)
    // is never chosen; a tie goes to im2col.
    float cudnn_ms = Milliseconds(ctx, run_cudnn);
    if (!ctx.status().ok()) cudnn_ms = std::numeric_limits<float>::infinity();
    const float im2col_ms = Milliseconds(ctx, run_im2col);
    a->state = cudnn_ms < im2col_ms ? ConvAlgorithm::State::kCudnn
                                    : ConvAlgorithm::State::kIm2col;
    VLOG(1) << direction << " " << ShapeName(s) << ": cuDNN algorithm " << a->algo << " (math "
            << a->math << ", " << a->scratch_bytes << " bytes of scratch) " << cudnn_ms
            << " ms, im2col " << im2col_ms << " ms";
  }
}

}  // namespace

// One shape's descriptors and algorithms. The input cuDNN sees is
// [batch, input_height, input_width, in_channels]: x itself, or (explicit
// padding) x copied at (pad_top, pad_left) into zeros.
struct CudaConvolutions::Plan {
  const CudnnLibrary* cudnn = nullptr;
  bool explicit_padding = false;
  int64_t input_height = 0, input_width = 0;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  ConvAlgorithm forward, backward_data, backward_filter;

  ~Plan() {
    if (conv != nullptr) cudnn->DestroyConvolutionDescriptor(conv);
    if (w != nullptr) cudnn->DestroyFilterDescriptor(w);
    if (y != nullptr) cudnn->DestroyTensorDescriptor(y);
    if (x != nullptr) cudnn->DestroyTensorDescriptor(x);
  }
};

absl::StatusOr<std::unique_ptr<CudaConvolutions>> CudaConvolutions::Create(
    const CudaContext& ctx, GpuConv mode, GpuMath math) {
  if (mode == GpuConv::kIm2col) {
    return std::unique_ptr<CudaConvolutions>(
        new CudaConvolutions(nullptr, nullptr, mode, math, "im2col (--gpu_conv=im2col)"));
  }
  std::string why;
  absl::StatusOr<const CudnnLibrary*> cudnn = LoadCudnn();
  cudnnHandle_t handle = nullptr;
  if (!cudnn.ok()) {
    why = std::string(cudnn.status().message());
  } else {
    const CudnnLibrary& lib = **cudnn;
    cudnnStatus_t st = lib.Create(&handle);
    if (st == CUDNN_STATUS_SUCCESS) st = lib.SetStream(handle, ctx.stream());
    if (st != CUDNN_STATUS_SUCCESS) {
      why = absl::StrCat("cudnnCreate on gpu:", ctx.device(), ": ", lib.GetErrorString(st));
      if (handle != nullptr) lib.Destroy(handle);
      handle = nullptr;
    }
  }
  if (handle == nullptr) {
    if (mode == GpuConv::kCudnn) {
      return absl::FailedPreconditionError(
          absl::StrCat("--gpu_conv=cudnn, but cuDNN cannot serve: ", why));
    }
    LOG(WARNING) << "gpu:" << ctx.device() << ": convolutions through im2col + cuBLAS (slower): "
                 << why;
    return std::unique_ptr<CudaConvolutions>(
        new CudaConvolutions(nullptr, nullptr, mode, math, absl::StrCat("im2col (cuDNN: ", why, ")")));
  }
  return std::unique_ptr<CudaConvolutions>(new CudaConvolutions(
      *cudnn, handle, mode, math,
      absl::StrCat(mode == GpuConv::kCudnn ? "cuDNN " : "the faster of cuDNN and im2col, cuDNN ",
                   CudnnVersionString((*cudnn)->version))));
}

CudaConvolutions::CudaConvolutions(const CudnnLibrary* cudnn, cudnnContext* handle,
                                   GpuConv mode, GpuMath math, std::string description)
    : cudnn_(cudnn),
      handle_(handle),
      mode_(mode),
      math_(math),
      description_(std::move(description)) {}

CudaConvolutions::~CudaConvolutions() {
  plans_.clear();
  if (handle_ != nullptr) cudnn_->Destroy(handle_);
}

bool CudaConvolutions::Check(const CudaContext& ctx, const char* what, int status) const {
  const auto st = static_cast<cudnnStatus_t>(status);
  if (st == CUDNN_STATUS_SUCCESS) return true;
  return ctx.RecordFailure(what, cudnn_->GetErrorString(st));
}

CudaConvolutions::ShapeKey CudaConvolutions::KeyOf(const Conv2DShape& s) {
  return {s.batch,        s.in_height,     s.in_width,    s.in_channels,
          s.filter_height, s.filter_width, s.out_channels, s.stride_height,
          s.stride_width, static_cast<int64_t>(s.padding)};
}

int CudaConvolutions::CudnnDirections(const Conv2DShape& shape) const {
  auto it = plans_.find(KeyOf(shape));
  if (it == plans_.end() || it->second == nullptr) return 0;
  int directions = 0;
  for (const ConvAlgorithm* a :
       {&it->second->forward, &it->second->backward_data, &it->second->backward_filter}) {
    directions += a->state == ConvAlgorithm::State::kCudnn;
  }
  return directions;
}

CudaConvolutions::Plan* CudaConvolutions::PlanFor(const Conv2DShape& s) {
  if (cudnn_ == nullptr || s.is_pointwise()) return nullptr;  // One GEMM serves 1x1.
  auto [it, made] = plans_.try_emplace(KeyOf(s));
  if (!made) return it->second.get();  // Null: im2col.

  const int64_t out_height = s.out_height(), out_width = s.out_width();
  const int64_t pad_top = s.pad_top(), pad_left = s.pad_left();
  auto plan = std::make_unique<Plan>();
  plan->cudnn = cudnn_;
  // cuDNN pads as much after as before: where that gives our output size,
  // its windows are ours. Otherwise (more padding after than before) the
  // input is copied into zeros just large enough for the windows.
  const bool symmetric =
      s.in_height + 2 * pad_top >= s.filter_height && s.in_width + 2 * pad_left >= s.filter_width &&
      (s.in_height + 2 * pad_top - s.filter_height) / s.stride_height + 1 == out_height &&
      (s.in_width + 2 * pad_left - s.filter_width) / s.stride_width + 1 == out_width;
  plan->explicit_padding = !symmetric;
  plan->input_height =
      symmetric ? s.in_height : (out_height - 1) * s.stride_height + s.filter_height;
  plan->input_width = symmetric ? s.in_width : (out_width - 1) * s.stride_width + s.filter_width;
  const int pad_h = symmetric ? static_cast<int>(pad_top) : 0;
  const int pad_w = symmetric ? static_cast<int>(pad_left) : 0;

  // cuDNN's 4-d descriptors take int sizes and strides.
  const int64_t largest =
      std::max({s.batch * plan->input_height * plan->input_width * s.in_channels, s.output_size(),
                s.filter_size()});
  if (largest > std::numeric_limits<int32_t>::max()) {
    LOG(WARNING) << "cuDNN's sizes are ints; im2col runs " << ShapeName(s);
    return nullptr;
  }
  const CudnnLibrary& lib = *cudnn_;
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  cudnnStatus_t st = lib.CreateTensorDescriptor(&plan->x);
  if (st == CUDNN_STATUS_SUCCESS) st = lib.CreateTensorDescriptor(&plan->y);
  if (st == CUDNN_STATUS_SUCCESS) st = lib.CreateFilterDescriptor(&plan->w);
  if (st == CUDNN_STATUS_SUCCESS) st = lib.CreateConvolutionDescriptor(&plan->conv);
  if (st == CUDNN_STATUS_SUCCESS) {
    st = lib.SetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, i(s.batch),
                                   i(s.in_channels), i(plan->input_height),
                                   i(plan->input_width));
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    st = lib.SetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, i(s.batch),
                                   i(s.out_channels), i(out_height), i(out_width));
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    // NHWC filters are KRSC: [out_channels, height, width, in_channels].
    st = lib.SetFilter4dDescriptor(plan->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC,
                                   i(s.out_channels), i(s.in_channels), i(s.filter_height),
                                   i(s.filter_width));
  }
  if (st == CUDNN_STATUS_SUCCESS) {
    st = lib.SetConvolution2dDescriptor(plan->conv, pad_h, pad_w, i(s.stride_height),
                                        i(s.stride_width), 1, 1, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT);
  }
  int n = 0, c = 0, h = 0, w = 0;
  if (st == CUDNN_STATUS_SUCCESS) {
    st = lib.GetConvolution2dForwardOutputDim(plan->conv, plan->x, plan->w, &n, &c, &h, &w);
  }
  if (st != CUDNN_STATUS_SUCCESS) {
    LOG(WARNING) << "cuDNN cannot describe " << ShapeName(s) << " (" << lib.GetErrorString(st)
                 << "); im2col runs it";
    return nullptr;
  }
  if (n != s.batch || c != s.out_channels || h != out_height || w != out_width) {
    LOG(WARNING) << ShapeName(s) << ": cuDNN's output " << n << "x" << h << "x" << w << "x" << c
                 << " is not the window's; im2col runs it";
    return nullptr;
  }
  it->second = std::move(plan);
  return it->second.get();
}

bool CudaConvolutions::CudnnForward(const CudaContext& ctx, const Conv2DShape& s, Plan* plan,
                                    const float* x, const float* filter, float* y) {
  ConvAlgorithm& a = plan->forward;
  if (a.state == ConvAlgorithm::State::kUnmeasured) {
    const bool found =
        FindFastest<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT>(
            ctx, *cudnn_, plan->conv, math_, "forward", s, &a,
            [&](int count, int* n, cudnnConvolutionFwdAlgoPerf_t* perf) {
              return cudnn_->FindConvolutionForwardAlgorithm(handle_, plan->x, plan->w,
                                                             plan->conv, plan->y, count, n, perf);
            });
    Decide(
        ctx, s, mode_, "forward", found, &a, [&] { RunForward(ctx, s, *plan, x, filter, y); },
        [&] { kernels::Conv2DForward(ctx, s, x, filter, y, &scratch_); });
  }
  return a.state == ConvAlgorithm::State::kCudnn;
}

bool CudaConvolutions::CudnnBackwardData(const CudaContext& ctx, const Conv2DShape& s,
                                         Plan* plan, const float* x, const float* filter,
                                         const float* dy, float* dx) {
  ConvAlgorithm& a = plan->backward_data;
  if (a.state == ConvAlgorithm::State::kUnmeasured) {
    const bool found =
        FindFastest<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT>(
            ctx, *cudnn_, plan->conv, math_, "backward data", s, &a,
            [&](int count, int* n, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
              return cudnn_->FindConvolutionBackwardDataAlgorithm(
                  handle_, plan->w, plan->y, plan->conv, plan->x, count, n, perf);
            });
    Decide(
        ctx, s, mode_, "backward data", found, &a,
        [&] { RunBackwardData(ctx, s, *plan, filter, dy, dx); },
        [&] { kernels::Conv2DBackward(ctx, s, x, filter, dy, dx, nullptr, &scratch_); });
  }
  return a.state == ConvAlgorithm::State::kCudnn;
}

bool CudaConvolutions::CudnnBackwardFilter(const CudaContext& ctx, const Conv2DShape& s,
                                           Plan* plan, const float* x, const float* filter,
                                           const float* dy, float* dfilter) {
  ConvAlgorithm& a = plan->backward_filter;
  if (a.state == ConvAlgorithm::State::kUnmeasured) {
    const bool found = FindFastest<cudnnConvolutionBwdFilterAlgoPerf_t,
                                   CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT>(
        ctx, *cudnn_, plan->conv, math_, "backward filter", s, &a,
        [&](int count, int* n, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
          return cudnn_->FindConvolutionBackwardFilterAlgorithm(
              handle_, plan->x, plan->y, plan->conv, plan->w, count, n, perf);
        });
    Decide(
        ctx, s, mode_, "backward filter", found, &a,
        [&] { RunBackwardFilter(ctx, s, *plan, x, dy, dfilter); },
        [&] { kernels::Conv2DBackward(ctx, s, x, filter, dy, nullptr, dfilter, &scratch_); });
  }
  return a.state == ConvAlgorithm::State::kCudnn;
}

void* CudaConvolutions::Scratch(const CudaContext& ctx, size_t bytes) {
  return bytes == 0 ? nullptr : scratch_.Get(ctx, FloatsFor(bytes));
}

const float* CudaConvolutions::CudnnInput(const CudaContext& ctx, const Conv2DShape& s,
                                          const Plan& plan, const float* x) {
  if (!plan.explicit_padding) return x;
  float* padded =
      padded_input_.Get(ctx, s.batch * plan.input_height * plan.input_width * s.in_channels);
  if (padded == nullptr) return nullptr;  // Recorded in ctx.
  CopyImageWindow(ctx, x, s.batch, s.in_height, s.in_width, s.in_channels, plan.input_height,
                  plan.input_width, s.pad_top(), s.pad_left(), padded);
  return padded;
}

void CudaConvolutions::RunForward(const CudaContext& ctx, const Conv2DShape& s, const Plan& plan,
                                  const float* x, const float* filter, float* y) {
  const ConvAlgorithm& a = plan.forward;
  float* krsc = filter_.Get(ctx, s.filter_size());
  const float* input = CudnnInput(ctx, s, plan, x);
  void* scratch = Scratch(ctx, a.scratch_bytes);
  if (krsc == nullptr || input == nullptr || (scratch == nullptr && a.scratch_bytes > 0)) {
    return;  // Recorded in ctx.
  }
  Transpose(ctx, filter, s.filter_height * s.filter_width * s.in_channels, s.out_channels, krsc);
  const float one = 1.0f, zero = 0.0f;
  if (Check(ctx, "cudnnSetConvolutionMathType",
            cudnn_->SetConvolutionMathType(plan.conv, a.math))) {
    Check(ctx, "cudnnConvolutionForward",
          cudnn_->ConvolutionForward(handle_, &one, plan.x, input, plan.w, krsc, plan.conv,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), scratch,
                                     a.scratch_bytes, &zero, plan.y, y));
  }
}

void CudaConvolutions::RunBackwardData(const CudaContext& ctx, const Conv2DShape& s,
                                       const Plan& plan, const float* filter, const float* dy,
                                       float* dx) {
  const ConvAlgorithm& a = plan.backward_data;
  float* krsc = filter_.Get(ctx, s.filter_size());
  float* out = dx;
  if (plan.explicit_padding) {
    out = padded_dinput_.Get(ctx, s.batch * plan.input_height * plan.input_width * s.in_channels);
  }
  void* scratch = Scratch(ctx, a.scratch_bytes);
  if (krsc == nullptr || out == nullptr || (scratch == nullptr && a.scratch_bytes > 0)) return;
  Transpose(ctx, filter, s.filter_height * s.filter_width * s.in_channels, s.out_channels, krsc);
  const float one = 1.0f, zero = 0.0f;
  if (!Check(ctx, "cudnnSetConvolutionMathType",
             cudnn_->SetConvolutionMathType(plan.conv, a.math)) ||
      !Check(ctx, "cudnnConvolutionBackwardData",
             cudnn_->ConvolutionBackwardData(
                 handle_, &one, plan.w, krsc, plan.y, dy, plan.conv,
                 static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo), scratch, a.scratch_bytes,
                 &zero, plan.x, out))) {
    return;
  }
  if (plan.explicit_padding) {  // The padding's gradient is dropped.
    CopyImageWindow(ctx, out, s.batch, plan.input_height, plan.input_width, s.in_channels,
                    s.in_height, s.in_width, -s.pad_top(), -s.pad_left(), dx);
  }
}

void CudaConvolutions::RunBackwardFilter(const CudaContext& ctx, const Conv2DShape& s,
                                         const Plan& plan, const float* x, const float* dy,
                                         float* dfilter) {
  const ConvAlgorithm& a = plan.backward_filter;
  // The KRSC buffer may still hold the filter for a queued backward data:
  // stream order runs that first.
  float* krsc = filter_.Get(ctx, s.filter_size());
  const float* input = CudnnInput(ctx, s, plan, x);
  void* scratch = Scratch(ctx, a.scratch_bytes);
  if (krsc == nullptr || input == nullptr || (scratch == nullptr && a.scratch_bytes > 0)) return;
  const float one = 1.0f, zero = 0.0f;
  if (!Check(ctx, "cudnnSetConvolutionMathType",
             cudnn_->SetConvolutionMathType(plan.conv, a.math)) ||
      !Check(ctx, "cudnnConvolutionBackwardFilter",
             cudnn_->ConvolutionBackwardFilter(
                 handle_, &one, plan.x, input, plan.y, dy, plan.conv,
                 static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo), scratch, a.scratch_bytes,
                 &zero, plan.w, krsc))) {
    return;
  }
  Transpose(ctx, krsc, s.out_channels, s.filter_height * s.filter_width * s.in_channels, dfilter);
}

void CudaConvolutions::Forward(const CudaContext& ctx, const Conv2DShape& s, const float* x,
                               const float* filter, float* y) {
  Plan* plan = PlanFor(s);
  if (plan != nullptr && CudnnForward(ctx, s, plan, x, filter, y)) {
    RunForward(ctx, s, *plan, x, filter, y);
  } else {
    kernels::Conv2DForward(ctx, s, x, filter, y, &scratch_);
  }
}

void CudaConvolutions::Backward(const CudaContext& ctx, const Conv2DShape& s, const float* x,
                                const float* filter, const float* dy, float* dx,
                                float* dfilter) {
  Plan* plan = PlanFor(s);
  const bool cudnn_dx =
      dx != nullptr && plan != nullptr && CudnnBackwardData(ctx, s, plan, x, filter, dy, dx);
  const bool cudnn_dfilter = dfilter != nullptr && plan != nullptr &&
                             CudnnBackwardFilter(ctx, s, plan, x, filter, dy, dfilter);
  if ((dx != nullptr && !cudnn_dx) || (dfilter != nullptr && !cudnn_dfilter)) {
    kernels::Conv2DBackward(ctx, s, x, filter, dy, cudnn_dx ? nullptr : dx,
                            cudnn_dfilter ? nullptr : dfilter, &scratch_);
  }
  if (cudnn_dx) RunBackwardData(ctx, s, *plan, filter, dy, dx);
  if (cudnn_dfilter) RunBackwardFilter(ctx, s, *plan, x, dy, dfilter);
}

void Conv2DForward(const CudaContext& ctx, const Conv2DShape& shape, const float* x,
                   const float* filter, const float* bias, float* y,
                   CudaConvolutions* convolutions) {
  convolutions->Forward(ctx, shape, x, filter, y);
  if (bias != nullptr) {
    const int64_t rows = shape.batch * shape.out_height() * shape.out_width();
    BiasAddForward(ctx, y, bias, rows, shape.out_channels, y);
  }
}

void Conv2DBackward(const CudaContext& ctx, const Conv2DShape& shape, const float* x,
                    const float* filter, const float* dy, float* dx, float* dfilter,
                    float* dbias, CudaConvolutions* convolutions) {
  if (dbias != nullptr) {
    const int64_t rows = shape.batch * shape.out_height() * shape.out_width();
    BiasAddBackward(ctx, dy, rows, shape.out_channels, dbias);
  }
  convolutions->Backward(ctx, shape, x, filter, dy, dx, dfilter);
}

}  // namespace kernels
}  // namespace psrt
