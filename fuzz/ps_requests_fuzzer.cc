// Fuzzes a parameter-server shard with sequences of requests, decoded from
// raw request bytes exactly as ps/ps_service.cc does: Init and Push through
// the tensor frame decoder (common/tensor_frame.h) into ParameterShard, Pull
// through ParseFromByteBuffer, and Save, Restore, Shutdown and GetStatus
// with fuzzed fields, checkpoints going to a scratch directory. Every pull
// reply must hold as many values as its header's variables.
//
// Input: up to kMaxRequests requests, each a byte `op` (op % 8 picks the
// method, op / 8 the gRPC slice size, 0: one slice), then a U16 length and
// the request bytes.
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "common/rpc_util.h"
#include "common/tensor.h"
#include "common/tensor_frame.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/sliced_buffer.h"
#include "glog/logging.h"
#include "proto/psrt.pb.h"
#include "ps/parameter_shard.h"

namespace {

constexpr int kMaxRequests = 32;

void CheckReply(absl::StatusOr<psrt::ParameterShard::PullReply> reply) {
  if (!reply.ok()) return;
  int64_t elements = 0;
  for (const auto& meta : reply->header.variables()) {
    elements += psrt::NumElements({meta.shape().begin(), meta.shape().end()});
  }
  CHECK_EQ(reply->snapshot->values.num_elements(), elements);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  psrt::fuzz::ClearScratchDir();
  psrt::ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = psrt::fuzz::ScratchDir();
  psrt::ParameterShard shard(options);

  psrt::fuzz::InputReader in(data, size);
  for (int i = 0; i < kMaxRequests && !in.empty(); ++i) {
    const uint8_t op = in.Byte();
    const absl::string_view bytes = in.Bytes(in.U16());
    const grpc::ByteBuffer request = psrt::fuzz::SlicedByteBuffer(bytes, op / 8);
    switch (op % 8) {
      case 0: {  // PsService::Init
        psrt::proto::InitHeader header;
        psrt::TensorFrameReader reader;
        if (reader.Open(request, &header).ok()) shard.Init(header, &reader).IgnoreError();
        break;
      }
      case 1: {  // PsService::Push
        psrt::proto::PushHeader header;
        psrt::TensorFrameReader reader;
        if (reader.Open(request, &header).ok()) shard.Push(header, &reader).IgnoreError();
        break;
      }
      case 2: {  // PsService::Pull, with a deadline that has passed.
        psrt::proto::PullRequest pull;
        if (!psrt::ParseFromByteBuffer(request, &pull).ok()) break;
        auto options = shard.PullOptionsFor(pull, absl::Now());
        if (options.ok()) shard.Pull(*options, CheckReply);
        break;
      }
      case 3: {  // PsService::Save
        psrt::proto::SaveRequest save;
        if (!psrt::ParseFromByteBuffer(request, &save).ok()) break;
        shard.Save(save.step(), save.version(), save.keep(), save.has_keep_step() ? save.keep_step() : -1).IgnoreError();
        break;
      }
      case 4: {  // PsService::Restore
        psrt::proto::RestoreRequest restore;
        if (!psrt::ParseFromByteBuffer(request, &restore).ok()) break;
        shard.Restore(restore.step(), restore.recovery_epoch()).IgnoreError();
        break;
      }
      case 5: {  // PsService::Shutdown
        psrt::proto::ShutdownRequest shutdown;
        if (!psrt::ParseFromByteBuffer(request, &shutdown).ok()) break;
        shard.Shutdown(shutdown.replica());
        break;
      }
      case 6:  // PsService::GetStatus
        shard.GetStatus();
        break;
      default:  // psrt_ps at start.
        shard.RestoreLatest().IgnoreError();
        break;
    }
  }
  return 0;
}
