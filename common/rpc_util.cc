#include "common/rpc_util.h"

#include <malloc.h>
#include <netdb.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/transport_security.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace psrt {
namespace {

// Transport settings of both ends, for multi-megabyte messages: big HTTP/2
// frames and TCP reads, and a fixed 64 MB stream window instead of BDP
// probing (which stalls large transfers while the window grows).
struct IntSetting {
  const char* name;
  int value;
};
constexpr IntSetting kTransportSettings[] = {
    {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 4 << 20},
    {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1 << 20},
    {GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 4 << 20},
    {GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20},
    {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20},
    {GRPC_ARG_HTTP2_BDP_PROBE, 0},
};

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

std::shared_ptr<grpc::Channel> NewChannel(const std::string& address,
                                          const TransportSecurity& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Each shard gets its own TCP connection, so shards transfer in parallel.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect quickly to a PS that is still starting.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  for (const IntSetting& s : kTransportSettings) args.SetInt(s.name, s.value);
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      address, security.ChannelCredentials(), args, security.ClientInterceptors());
}

void ConfigurePsServer(grpc::ServerBuilder* builder, int64_t max_message_bytes,
                       int64_t max_memory_bytes) {
  const int max = static_cast<int>(std::min<int64_t>(max_message_bytes, INT32_MAX));
  builder->SetMaxReceiveMessageSize(max);
  builder->SetMaxSendMessageSize(-1);
  for (const IntSetting& s : kTransportSettings) {
    builder->AddChannelArgument(s.name, s.value);
  }
  // A connection (a worker's, to one stripe) has a pull, a push and a status
  // call in flight at most: a client opening more streams is refused them.
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 32);
  // Find peers that vanished without closing (a dead machine): ping an idle
  // connection every 2 minutes and drop it when 20 s pass without an answer.
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 120 * 1000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000);
  // Fail, rather than share the port, when another process listens there
  // (gRPC sets SO_REUSEPORT by default: a second ps of the same task would
  // start and take half of its connections).
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  if (max_memory_bytes > 0) {
    grpc::ResourceQuota quota("psrt_server");
    quota.Resize(static_cast<size_t>(max_memory_bytes));
    builder->SetResourceQuota(quota);  // The builder keeps a reference.
  }
}

std::string WhyCannotListen(const std::string& address) {
  std::string host;
  int port = 0;
  if (SplitHostPort(address, &host, &port).ok()) {
    addrinfo hints{};
    hints.ai_flags = AI_PASSIVE;
    addrinfo* found = nullptr;
    const int error = getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (found != nullptr) freeaddrinfo(found);
    if (error != 0) {
      return absl::StrCat("its host \"", host, "\" does not resolve here: ", gai_strerror(error));
    }
  }
  return "port in use, or not an address of this machine?";
}

std::string ListenHost(const std::string& bind_host, const std::string& spec_host) {
  return bind_host.empty() ? spec_host : bind_host;
}

std::string JoinHostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                             : absl::StrCat(host, ":", port);
}

std::string LocalSocketAddress(int port) {
  return "unix-abstract:psrt-" + std::to_string(port);
}

std::string PreferLocalSocket(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return host_port;
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (!absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port <= 0) {
    return host_port;
  }
  const bool loopback = host == "localhost" || host == "::1" ||
                        absl::StartsWith(host, "127.");
  return loopback ? LocalSocketAddress(port) : host_port;
}

grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& buffer,
                                 google::protobuf::MessageLite* message) {
  grpc::Slice flat;
  if (!buffer.DumpToSingleSlice(&flat).ok() ||
      !message->ParseFromArray(flat.begin(), flat.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("malformed ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

void KeepLargeAllocationsMapped() {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace psrt
