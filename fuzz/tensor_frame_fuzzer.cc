// Fuzzes the tensor frame decoder (common/tensor_frame.h) that psrt_ps runs
// on every raw Init and Push request, with the input as the request bytes,
// cut into gRPC slices of a fuzzed size. A frame that opens must hand out
// exactly its trailing tensor_data bytes, and re-encode to the same header
// and data.
//
// Input: byte slice size (0: one slice), byte header type (Push, Init or
// Pull header), the request bytes (the rest).
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/tensor_frame.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/sliced_buffer.h"
#include "glog/logging.h"
#include "proto/psrt.pb.h"

namespace {

std::unique_ptr<google::protobuf::MessageLite> NewHeader(uint8_t type) {
  switch (type % 3) {
    case 0: return std::make_unique<psrt::proto::PushHeader>();
    case 1: return std::make_unique<psrt::proto::InitHeader>();
    default: return std::make_unique<psrt::proto::PullHeader>();
  }
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  CHECK(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  psrt::fuzz::InputReader in(data, size);
  const size_t piece = in.Byte() % 32;
  const uint8_t type = in.Byte();
  const absl::string_view request = in.Rest();

  std::unique_ptr<google::protobuf::MessageLite> header = NewHeader(type);
  psrt::TensorFrameReader reader;
  if (!reader.Open(psrt::fuzz::SlicedByteBuffer(request, piece), header.get()).ok()) {
    return 0;
  }
  // The data is the request's tail; read it whole and in odd pieces.
  CHECK_LE(reader.size(), request.size());
  const absl::string_view expected = request.substr(request.size() - reader.size());
  std::string got(reader.size(), '\0');
  reader.ReadAt(0, {got.data(), got.size()});
  CHECK(got == expected);
  for (size_t at = 0; at < got.size(); at += 7) {
    std::string part(std::min<size_t>(5, got.size() - at), '\0');
    reader.ReadAt(at, {part.data(), part.size()});
    CHECK(part == expected.substr(at, part.size()));
  }

  // Re-encoding gives a frame that opens to the same header and data.
  const grpc::ByteBuffer encoded =
      psrt::EncodeTensorFrame(*header, {{got.data(), got.size()}});
  std::unique_ptr<google::protobuf::MessageLite> header2 = NewHeader(type);
  psrt::TensorFrameReader reader2;
  CHECK(reader2.Open(psrt::fuzz::SlicedByteBuffer(Flatten(encoded), piece),
                     header2.get()).ok());
  CHECK_EQ(header2->SerializeAsString(), header->SerializeAsString());
  std::string got2(reader2.size(), '\0');
  reader2.ReadAt(0, {got2.data(), got2.size()});
  CHECK(got2 == got);
  return 0;
}
