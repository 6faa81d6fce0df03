// SliceCodec: each ps shard's slices of the model's variables (the
// placement, common/placement.h) to and from the wire, as float32 or as
// bfloat16 / float16 (common/wire_dtype.h; the shards keep float32). The one
// place where a push's tensors become request pieces and a pull's reply data
// becomes the parameters, whatever the transport: conversions run in
// parallel on the copier's threads; float32 goes from the tensors' memory
// and straight into it, with no copy of its own.
//
// Thread safety: calls for different shards may run at once; each shard's
// buffers (reused from call to call: no allocation in steady state) serve
// one Encode and one Decode at a time.
#ifndef PSRT_WORKER_STORE_SLICE_CODEC_H_
#define PSRT_WORKER_STORE_SLICE_CODEC_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/placement.h"
#include "common/tensor.h"
#include "kernels/cpu_context.h"
#include "proto/psrt.pb.h"
#include "worker/store/shard_transport.h"

namespace psrt {

class SliceCodec {
 public:
  // REQUIRES: `placement` and `copier` outlive the codec.
  SliceCodec(const Placement& placement, const kernels::CpuContext& copier);

  // The VariableMeta of each of shard k's slices, as `dtype`, in message order.
  std::vector<proto::VariableMeta> Metas(int k, proto::DataType dtype) const;

  // Shard k's slices of `tensors` as the data pieces of a request: the
  // tensors' own memory (DT_FLOAT) or their encoding in a buffer of the
  // codec's, valid until shard k's next Encode.
  // REQUIRES: IsWireDtype(dtype); tensors hold the placement's variables.
  std::vector<absl::Span<const char>> Encode(int k, const std::vector<Tensor>& tensors,
                                             proto::DataType dtype);

  // Reads shard k's values, the first `data_bytes` of a pull reply's data
  // (`variables`: its header's; embedding rows may follow), into `tensors`
  // as float32. Internal, naming what was expected, when the reply does not
  // carry shard k's slices as `dtype`.
  absl::Status Decode(int k, proto::DataType dtype,
                      const google::protobuf::RepeatedPtrField<proto::VariableMeta>& variables,
                      uint64_t data_bytes, ShardReply& reply, std::vector<Tensor>* tensors);

 private:
  // Internal when `variables` and `data_bytes` are not shard k's slices in `dtype`.
  absl::Status Check(int k, proto::DataType dtype,
                     const google::protobuf::RepeatedPtrField<proto::VariableMeta>& variables,
                     uint64_t data_bytes) const;

  const Placement& placement_;
  const kernels::CpuContext& copier_;
  std::vector<std::vector<uint16_t>> encoded_;  // Per shard: Encode's buffer.
  std::vector<std::vector<char>> received_;     // Per shard: Decode's, for in-order replies.
};

}  // namespace psrt

#endif  // PSRT_WORKER_STORE_SLICE_CODEC_H_
