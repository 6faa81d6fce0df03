#include "common/rpc_util.h"

#include <malloc.h>

#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace psrt {
namespace {

void ApplyTransportTuning(grpc::ChannelArguments* args) {
  args->SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 4 << 20);
  args->SetInt(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1 << 20);
  args->SetInt(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 4 << 20);
  args->SetInt(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20);
  args->SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  args->SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

std::shared_ptr<grpc::Channel> NewPsChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Each shard gets its own TCP connection, so shards transfer in parallel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect quickly to a PS that is still starting.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  ApplyTransportTuning(&args);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   args);
}

void ConfigurePsServer(grpc::ServerBuilder* builder) {
  builder->SetMaxReceiveMessageSize(-1);
  builder->SetMaxSendMessageSize(-1);
  grpc::ChannelArguments args;
  ApplyTransportTuning(&args);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 4 << 20);
  builder->AddChannelArgument(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1 << 20);
  builder->AddChannelArgument(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 4 << 20);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
}

void KeepLargeAllocationsMapped() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace psrt
