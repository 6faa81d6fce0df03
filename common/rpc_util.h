// gRPC plumbing shared by the PS service and the PS client, the only two
// modules that see gRPC types: the one place that converts between
// absl::Status and grpc::Status, and the channel/server settings every psrt
// endpoint uses (no 4 MB message cap, one TCP connection per shard).
#ifndef PSRT_COMMON_RPC_UTIL_H_
#define PSRT_COMMON_RPC_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/channel.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/status.h"

namespace psrt {

class TransportSecurity;

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// A channel to any psrt task ("host:port": a ps, a worker's ring or status
// service) with psrt's settings, protected as `security`
// says (TLS, the auth token on every call).
std::shared_ptr<grpc::Channel> NewChannel(const std::string& address,
                                          const TransportSecurity& security);

// Applies psrt's settings to a server builder; larger requests are refused
// with RESOURCE_EXHAUSTED before they are buffered, and a connection gets at
// most 32 concurrent calls. With max_memory_bytes > 0, gRPC's buffers of all
// connections together are held to it (a ResourceQuota): a request that does
// not fit is refused with RESOURCE_EXHAUSTED, not delayed. A port another
// process listens on is not shared: BuildAndStart fails.
void ConfigurePsServer(grpc::ServerBuilder* builder, int64_t max_message_bytes,
                       int64_t max_memory_bytes = 0);

// The interface a task listens on: `bind_host` (--bind_host) when set, else
// the task's own host in the cluster spec, so that a task is reachable only
// where the spec says it is unless told otherwise ("0.0.0.0": everywhere).
std::string ListenHost(const std::string& bind_host, const std::string& spec_host);
// Why a server could not listen on `address` ("host:port"), for its error:
// "its host does not resolve here" when name resolution fails, else "port
// in use, or not an address of this machine?".
std::string WhyCannotListen(const std::string& address);

// "host:port", an IPv6 host in brackets.
std::string JoinHostPort(const std::string& host, int port);

// The request metadata that names the stripe (the shard within a ps
// process) a call is for (proto/psrt.proto's "Stripes").
inline constexpr char kStripeMetadata[] = "psrt-stripe";

// The gRPC address of the abstract Unix socket that a task listening on TCP
// `port` also serves on this host: "unix-abstract:psrt-PORT".
std::string LocalSocketAddress(int port);

// `host_port` itself, or LocalSocketAddress(port) when its host is a
// loopback address (127.0.0.0/8, localhost, ::1): the same task on this
// host, reached without TCP (a Unix socket carries about 1.25x the bytes of
// loopback TCP through gRPC, measured with pushpull_bench).
std::string PreferLocalSocket(const std::string& host_port);

// Small (non-tensor) messages as byte buffers, for the raw methods.
grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message);
// InvalidArgument naming the message type when the bytes do not parse.
absl::Status ParseFromByteBuffer(const grpc::ByteBuffer& buffer,
                                 google::protobuf::MessageLite* message);

// Makes glibc serve large blocks (gRPC's multi-megabyte read buffers) from
// its heap and keep freed memory instead of returning it to the kernel, so
// the next message reuses pages that are already mapped. Without this,
// every large block is a fresh mmap whose first touch costs ~10 us per 4 KiB
// page. Call once at the start of main().
void KeepLargeAllocationsMapped();

}  // namespace psrt

#endif  // PSRT_COMMON_RPC_UTIL_H_
