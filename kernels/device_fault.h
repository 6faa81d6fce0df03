// Device faults: a CUDA call, kernel launch or copy that failed (an illegal
// address, an ECC error, a GPU that fell off the bus, out of memory in a
// workspace) is an absl::Status marked as a device fault, not the end of
// the process: the op's device records it (Device::status, sticky), the
// step fails with it, and psrt_worker exits with kDeviceFaultExitCode, which
// the launcher's ExitCode restart policy retries (a fresh process gets a
// fresh CUDA context).
#ifndef PSRT_KERNELS_DEVICE_FAULT_H_
#define PSRT_KERNELS_DEVICE_FAULT_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace psrt {
namespace kernels {

// 128-255 is what launch.sh --restart_policy=ExitCode (and Kubeflow's)
// retries.
constexpr int kDeviceFaultExitCode = 200;

inline constexpr absl::string_view kDeviceFaultPayload = "psrt.dev/device_fault";

// Internal, with `message` (which names the device and the failed call),
// marked as a device fault.
inline absl::Status DeviceFault(absl::string_view message) {
  absl::Status status = absl::InternalError(message);
  status.SetPayload(kDeviceFaultPayload, absl::Cord("1"));
  return status;
}

inline bool IsDeviceFault(const absl::Status& status) {
  return status.GetPayload(kDeviceFaultPayload).has_value();
}

}  // namespace kernels
}  // namespace psrt

#endif  // PSRT_KERNELS_DEVICE_FAULT_H_
