// PsService: the gRPC face of a ParameterShard (proto/psrt.proto's
// ParameterServer service), on gRPC's callback API.
//
// Each handler validates, calls the shard and finishes with the converted
// status. Init, Pull and Push are "raw" methods: their tensor bytes are read
// off the wire straight into a pooled buffer and written from the shard's
// snapshot without a protobuf copy (common/tensor_frame.h). A pull that must
// wait for a version holds no thread while it waits.
//
// Thread safety: gRPC calls the handlers concurrently; the shard and the
// buffer pool are thread-safe.
#ifndef PSRT_PS_PS_SERVICE_H_
#define PSRT_PS_PS_SERVICE_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/tensor.h"
#include "proto/psrt.grpc.pb.h"
#include "ps/parameter_shard.h"

namespace psrt {

using PsServiceBase = proto::ParameterServer::WithRawCallbackMethod_Init<
    proto::ParameterServer::WithRawCallbackMethod_Pull<
        proto::ParameterServer::WithRawCallbackMethod_Push<
            proto::ParameterServer::WithCallbackMethod_GetStatus<
                proto::ParameterServer::WithCallbackMethod_Shutdown<
                    proto::ParameterServer::Service>>>>>;

class PsService final : public PsServiceBase {
 public:
  // REQUIRES: `shard` outlives the service.
  explicit PsService(ParameterShard* shard) : shard_(shard) {}

  grpc::ServerUnaryReactor* Init(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const proto::StatusRequest* request,
                                      proto::StatusResponse* response) override;
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* context,
                                     const proto::ShutdownRequest* request,
                                     proto::ShutdownResponse* response) override;

 private:
  // Receive buffers for tensor data, reused across requests.
  std::unique_ptr<Tensor> AcquireBuffer();
  void ReleaseBuffer(std::unique_ptr<Tensor> buffer);

  ParameterShard* const shard_;
  absl::Mutex pool_mu_;
  std::vector<std::unique_ptr<Tensor>> free_buffers_ ABSL_GUARDED_BY(pool_mu_);
};

}  // namespace psrt

#endif  // PSRT_PS_PS_SERVICE_H_
