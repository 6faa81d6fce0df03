// PsService: the gRPC face of a ParameterShard (proto/psrt.proto's
// ParameterServer service), on gRPC's callback API.
//
// Each handler validates, calls the shard and finishes with the converted
// status. Init, Pull and Push are "raw" methods: the shard reads tensor bytes
// straight from the received slices and pulls send the shard's values buffer
// itself, without a protobuf copy (common/tensor_frame.h). A pull that must
// wait for a version holds no thread while it waits.
//
// Thread safety: gRPC calls the handlers concurrently; the shard is
// thread-safe.
#ifndef PSRT_PS_PS_SERVICE_H_
#define PSRT_PS_PS_SERVICE_H_

#include "proto/psrt.grpc.pb.h"
#include "ps/parameter_shard.h"

namespace psrt {

using PsServiceBase = proto::ParameterServer::WithRawCallbackMethod_Init<
    proto::ParameterServer::WithRawCallbackMethod_Pull<
        proto::ParameterServer::WithRawCallbackMethod_Push<
            proto::ParameterServer::WithCallbackMethod_GetStatus<
                proto::ParameterServer::WithCallbackMethod_Shutdown<
                    proto::ParameterServer::WithCallbackMethod_Save<
                        proto::ParameterServer::WithCallbackMethod_Restore<
                            proto::ParameterServer::Service>>>>>>>;

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
  grpc::ServerUnaryReactor* Save(grpc::CallbackServerContext* context,
                                 const proto::SaveRequest* request,
                                 proto::SaveResponse* response) override;
  grpc::ServerUnaryReactor* Restore(grpc::CallbackServerContext* context,
                                    const proto::RestoreRequest* request,
                                    proto::RestoreResponse* response) override;

 private:
  ParameterShard* const shard_;
};

}  // namespace psrt

#endif  // PSRT_PS_PS_SERVICE_H_
