// TensorTransport: how a task moves tensors (pushes, pulls, ring segments):
// over gRPC, or over psrt's own data plane (dataplane/, docs/data-plane.md),
// gRPC keeping the control plane either way. psrt_ps and psrt_worker take it
// as --tensor_transport=auto|grpc|data_plane (common/task_flags.h; `socket`
// is accepted for data_plane).
#ifndef PSRT_COMMON_TENSOR_TRANSPORT_H_
#define PSRT_COMMON_TENSOR_TRANSPORT_H_

namespace psrt {

enum class TensorTransport {
  kAuto,       // The data plane where every peer serves one (not with TLS).
  kGrpc,       // gRPC only.
  kDataPlane,  // The data plane; a peer that serves none is an error.
};

}  // namespace psrt

#endif  // PSRT_COMMON_TENSOR_TRANSPORT_H_
