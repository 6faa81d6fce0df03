#include "worker/store/slice_codec.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"

namespace psrt {
namespace {

// Bytes are converted and copied in pieces of this size, on all cores: one
// core alone cannot saturate memory bandwidth here.
constexpr int64_t kGrainBytes = 256 << 10;

char* SliceData(std::vector<Tensor>* tensors, const VariableSlice& slice) {
  return reinterpret_cast<char*>((*tensors)[slice.variable].data()) + slice.byte_offset;
}

}  // namespace

SliceCodec::SliceCodec(const Placement& placement, const kernels::CpuContext& copier)
    : placement_(placement),
      copier_(copier),
      encoded_(placement.num_shards),
      received_(placement.num_shards) {}

std::vector<proto::VariableMeta> SliceCodec::Metas(int k, proto::DataType dtype) const {
  std::vector<proto::VariableMeta> metas;
  for (int s : placement_.shard_slices[k]) {
    const VariableSlice& slice = placement_.slices[s];
    proto::VariableMeta& meta = metas.emplace_back();
    meta.set_name(slice.name);
    meta.set_dtype(dtype);
    for (int64_t d : slice.shape) meta.add_shape(d);
  }
  return metas;
}

std::vector<absl::Span<const char>> SliceCodec::Encode(int k, const std::vector<Tensor>& tensors,
                                                       proto::DataType dtype) {
  CHECK(IsWireDtype(dtype)) << dtype;
  std::vector<absl::Span<const char>> pieces;
  std::vector<uint16_t>& wire = encoded_[k];
  size_t encoded = 0;
  for (int s : placement_.shard_slices[k]) {
    const VariableSlice& slice = placement_.slices[s];
    const float* base = tensors[slice.variable].data() + slice.byte_offset / sizeof(float);
    const int64_t n = slice.num_bytes / sizeof(float);
    if (dtype == proto::DT_FLOAT) {
      pieces.emplace_back(reinterpret_cast<const char*>(base), slice.num_bytes);
      continue;
    }
    if (wire.size() < encoded + n) wire.resize(encoded + n);  // The first call only.
    copier_.ParallelFor(n, kGrainBytes / sizeof(float), [&](int64_t begin, int64_t end) {
      EncodeWire(dtype, {base + begin, size_t(end - begin)},
                 {wire.data() + encoded + begin, size_t(end - begin)});
    });
    encoded += n;
  }
  if (encoded > 0) {
    pieces.emplace_back(reinterpret_cast<const char*>(wire.data()), encoded * sizeof(uint16_t));
  }
  return pieces;
}

absl::Status SliceCodec::Check(
    int k, proto::DataType dtype,
    const google::protobuf::RepeatedPtrField<proto::VariableMeta>& variables,
    uint64_t data_bytes) const {
  const std::vector<int>& slices = placement_.shard_slices[k];
  int64_t expected = 0;
  for (int s : slices) expected += placement_.slices[s].num_bytes;
  expected = expected / sizeof(float) * WireBytesPerElement(dtype);
  bool dtype_ok = true;
  for (const proto::VariableMeta& meta : variables) dtype_ok = dtype_ok && meta.dtype() == dtype;
  if (variables.size() != static_cast<int>(slices.size()) ||
      static_cast<int64_t>(data_bytes) != expected || !dtype_ok) {
    return absl::InternalError(absl::StrCat(
        "pull reply carries ", variables.size(), " tensors and ", data_bytes, " bytes, want ",
        slices.size(), " tensors and ", expected, " bytes of ", proto::DataType_Name(dtype),
        dtype_ok ? "" : " (the reply has another dtype)"));
  }
  return absl::OkStatus();
}

absl::Status SliceCodec::Decode(
    int k, proto::DataType dtype,
    const google::protobuf::RepeatedPtrField<proto::VariableMeta>& variables, uint64_t data_bytes,
    ShardReply& reply, std::vector<Tensor>* tensors) {
  RETURN_IF_ERROR(Check(k, dtype, variables, data_bytes));
  const std::vector<int>& slices = placement_.shard_slices[k];
  const ByteSource* wire = reply.in_memory();
  std::optional<SpanByteSource> received;
  if (wire == nullptr) {  // The reply is read in order.
    if (dtype == proto::DT_FLOAT) {  // Straight into the tensors.
      for (int s : slices) {
        const VariableSlice& slice = placement_.slices[s];
        RETURN_IF_ERROR(reply.ReadData({SliceData(tensors, slice), size_t(slice.num_bytes)}));
      }
      return absl::OkStatus();
    }
    std::vector<char>& buffer = received_[k];
    if (buffer.size() < data_bytes) buffer.resize(data_bytes);  // Once.
    RETURN_IF_ERROR(reply.ReadData({buffer.data(), size_t(data_bytes)}));
    wire = &received.emplace(absl::MakeConstSpan(buffer.data(), data_bytes));
  }
  // The values as float32, whatever the wire carried.
  std::optional<WireAsFloatSource> decoded;
  const ByteSource& values = dtype == proto::DT_FLOAT ? *wire : decoded.emplace(*wire, dtype);
  size_t offset = 0;
  for (int s : slices) {
    const VariableSlice& slice = placement_.slices[s];
    char* dst = SliceData(tensors, slice);
    copier_.ParallelFor(slice.num_bytes, kGrainBytes, [&](int64_t begin, int64_t end) {
      values.ReadAt(offset + begin, {dst + begin, size_t(end - begin)});
    });
    offset += slice.num_bytes;
  }
  return absl::OkStatus();
}

}  // namespace psrt
