#include "worker/store/ps_client.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/blocking_counter.h"
#include "common/backoff.h"
#include "common/byte_source.h"
#include "common/cluster_spec.h"
#include "common/random_id.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "common/tensor_frame.h"
#include "common/transport_security.h"
#include "common/wire_dtype.h"
#include "dataplane/frame_connection.h"
#include "worker/store/dataplane_shards.h"
#include "worker/store/shard_fanout.h"
#include "glog/logging.h"

namespace psrt {
namespace {

constexpr char kInit[] = "/psrt.proto.ParameterServer/Init";
constexpr char kPull[] = "/psrt.proto.ParameterServer/Pull";
constexpr char kPush[] = "/psrt.proto.ParameterServer/Push";
constexpr char kGetStatus[] = "/psrt.proto.ParameterServer/GetStatus";
constexpr char kShutdown[] = "/psrt.proto.ParameterServer/Shutdown";
constexpr char kSave[] = "/psrt.proto.ParameterServer/Save";
constexpr char kRestore[] = "/psrt.proto.ParameterServer/Restore";

// Pulled bytes are copied into the parameters in pieces of this size, on
// all cores: one core alone cannot saturate memory bandwidth here.
constexpr int64_t kCopyGrainBytes = 256 << 10;

proto::VariableMeta MetaOf(const VariableSlice& slice,
                           proto::DataType dtype = proto::DT_FLOAT) {
  proto::VariableMeta meta;
  meta.set_name(slice.name);
  meta.set_dtype(dtype);
  for (int64_t d : slice.shape) meta.add_shape(d);
  return meta;
}

}  // namespace

PsClient::PsClient(Options options, Placement placement,
                   std::vector<VariableDef> variables)
    : options_(std::move(options)),
      copier_(options_.copy_threads, /*spin=*/false),
      placement_(std::move(placement)),
      variables_(std::move(variables)),
      fanout_(std::make_unique<ShardFanout>([this](int k) { return ShardName(k); },
                                            options_.retry_timeout)) {
  CHECK_GE(options_.ps_stripes, 1);
  CHECK_EQ(placement_.num_shards,
           static_cast<int>(options_.ps_addresses.size()) * options_.ps_stripes);
  const TransportSecurity plaintext;
  const TransportSecurity& security = options_.security ? *options_.security : plaintext;
  const bool unix_socket = options_.unix_socket && !security.tls();
  LOG_IF(WARNING, options_.unix_socket && security.tls())
      << "unix_socket: TLS channels stay on TCP (certificates name the host)";
  for (int k = 0; k < num_shards(); ++k) {
    const std::string& address = options_.ps_addresses[k / options_.ps_stripes];
    const std::string target = unix_socket ? PreferLocalSocket(address) : address;
    if (target != address) LOG(INFO) << ShardName(k) << " over " << target;
    fanout_->AddShard(NewChannel(target, security), k % options_.ps_stripes);
  }
  if (options_.data_plane != Options::DataPlane::kOff) {
    CHECK(!security.tls()) << "the data plane has no TLS";
    DataPlaneShards::Options data_plane;
    data_plane.num_shards = num_shards();
    data_plane.address_of = [this](int k) { return DataPlaneAddress(k); };
    data_plane.stripe_of = [this](int k) { return k % options_.ps_stripes; };
    data_plane.credential = security.DataPlaneCredential();
    data_plane.retry_timeout = options_.retry_timeout;
    data_plane.shard_name = [this](int k) { return ShardName(k); };
    data_plane_ = std::make_unique<DataPlaneShards>(std::move(data_plane));
    pulled_wire_.resize(num_shards());
  }
  CHECK(IsWireDtype(options_.wire_dtype)) << options_.wire_dtype;
  push_headers_.resize(num_shards());
  wire_buffers_.resize(num_shards());
  for (int k = 0; k < num_shards(); ++k) {
    push_headers_[k].set_replica(options_.replica);
    for (int s : placement_.shard_slices[k]) {
      *push_headers_[k].add_variables() = MetaOf(placement_.slices[s], options_.wire_dtype);
    }
  }
  versions_.assign(num_shards(), 0);
  incarnations_.assign(num_shards(), 0);
  worker_incarnation_ = NewIncarnation();
}

absl::Status PsClient::CheckIncarnations(const std::vector<int64_t>& answered) {
  absl::Status status;
  for (int k = 0; k < num_shards(); ++k) {
    if (incarnations_[k] != 0 && incarnations_[k] != answered[k] && status.ok()) {
      status = absl::AbortedError(absl::StrCat(
          ShardName(k), " restarted or was rolled back (new incarnation ", answered[k],
          "); pull again"));
    }
    incarnations_[k] = answered[k];
  }
  return status;
}

void PsClient::ForgetIncarnations() {
  std::fill(incarnations_.begin(), incarnations_.end(), 0);
}

PsClient::~PsClient() = default;

std::string PsClient::ShardName(int shard) const {
  const int task = shard / options_.ps_stripes;
  return absl::StrCat("ps/", task,
                      options_.ps_stripes > 1
                          ? absl::StrCat(" stripe ", shard % options_.ps_stripes)
                          : "",
                      " (", options_.ps_addresses[task], ")");
}

absl::StatusOr<std::string> PsClient::DataPlaneAddress(int k) {
  grpc::ByteBuffer response;
  const grpc::Status status =
      fanout_->CallOne(k, kGetStatus, absl::Seconds(5),
                       SerializeToByteBuffer(proto::StatusRequest()), &response);
  proto::StatusResponse reply;
  absl::Status parsed = FromGrpcStatus(status);
  if (parsed.ok()) parsed = ParseFromByteBuffer(response, &reply);
  if (!parsed.ok()) {
    return absl::Status(parsed.code(), absl::StrCat("asking for its data plane: ",
                                                    parsed.message()));
  }
  if (reply.data_port() == 0) {  // A ps restarted with another flag: retried, then failed.
    return absl::UnavailableError(
        "it serves no data plane now (psrt_ps --tensor_transport=grpc, or TLS)");
  }
  const std::string& address = options_.ps_addresses[k / options_.ps_stripes];
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(SplitHostPort(address, &host, &port));
  if (options_.unix_socket && PreferLocalSocket(address) != address) {
    return dataplane::LocalDataPlaneAddress(port);
  }
  return JoinHostPort(host, reply.data_port());
}

absl::Status PsClient::CheckPullReply(int k, const proto::PullHeader& header,
                                      uint64_t data_bytes, proto::DataType dtype) const {
  const std::vector<int>& slices = placement_.shard_slices[k];
  int64_t expected = 0;
  for (int s : slices) expected += placement_.slices[s].num_bytes;
  expected = expected / sizeof(float) * WireBytesPerElement(dtype);
  bool dtype_ok = true;
  for (const proto::VariableMeta& meta : header.variables()) {
    dtype_ok = dtype_ok && meta.dtype() == dtype;
  }
  if (header.variables_size() != static_cast<int>(slices.size()) ||
      static_cast<int64_t>(data_bytes) != expected || !dtype_ok) {
    return absl::InternalError(absl::StrCat(
        "pull reply carries ", header.variables_size(), " tensors and ", data_bytes,
        " bytes, want ", slices.size(), " tensors and ", expected, " bytes of ",
        proto::DataType_Name(dtype), dtype_ok ? "" : " (the reply has another dtype)"));
  }
  return absl::OkStatus();
}

std::vector<absl::Span<const char>> PsClient::PushPieces(int k,
                                                         const std::vector<Tensor>& grads) {
  push_headers_[k].set_version(versions_[k]);
  push_headers_[k].set_worker_incarnation(worker_incarnation_);
  push_headers_[k].set_step(push_step_);
  push_headers_[k].set_incarnation(incarnations_[k]);
  std::vector<absl::Span<const char>> pieces;
  std::vector<uint16_t>& wire = wire_buffers_[k];
  size_t encoded = 0;
  for (int s : placement_.shard_slices[k]) {
    const VariableSlice& slice = placement_.slices[s];
    const float* base = grads[slice.variable].data() + slice.byte_offset / sizeof(float);
    const int64_t n = slice.num_bytes / sizeof(float);
    if (options_.wire_dtype == proto::DT_FLOAT) {
      pieces.emplace_back(reinterpret_cast<const char*>(base), slice.num_bytes);
      continue;
    }
    if (wire.size() < encoded + n) wire.resize(encoded + n);  // The first push only.
    copier_.ParallelFor(n, kCopyGrainBytes / sizeof(float), [&](int64_t begin, int64_t end) {
      EncodeWire(options_.wire_dtype, {base + begin, size_t(end - begin)},
                 {wire.data() + encoded + begin, size_t(end - begin)});
    });
    encoded += n;
  }
  if (encoded > 0) {
    pieces.emplace_back(reinterpret_cast<const char*>(wire.data()), encoded * sizeof(uint16_t));
  }
  return pieces;
}

absl::Status PsClient::WaitForServers(absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  Backoff backoff(absl::Milliseconds(100), absl::Seconds(2));
  std::vector<bool> up(num_shards(), false);
  bool served_data_plane = true;  // By every ps task that answered.
  absl::Time next_log = absl::Now() + absl::Seconds(2);
  while (true) {
    std::vector<std::string> waiting;
    for (int k = 0; k < num_shards(); ++k) {
      if (up[k]) continue;
      const grpc::ByteBuffer request = SerializeToByteBuffer(proto::StatusRequest());
      grpc::ByteBuffer response;
      grpc::Status status = fanout_->CallOne(k, kGetStatus, absl::Seconds(2), request, &response);
      proto::StatusResponse reply;
      if (status.ok()) status = ToGrpcStatus(ParseFromByteBuffer(response, &reply));
      if (status.ok()) {
        const int stripes = std::max(1, reply.stripes());
        if (reply.restoring()) {
          waiting.push_back(absl::StrCat(ShardName(k), ": restoring its checkpoint"));
          continue;
        }
        // An operator's client (no variables) deals in whole processes.
        if (stripes != options_.ps_stripes && !variables_.empty()) {
          return absl::FailedPreconditionError(absl::StrCat(
              ShardName(k), " serves ", stripes, " stripes, but this task was "
              "started with --ps_stripes=", options_.ps_stripes,
              ": give every task of the job the same --ps_stripes"));
        }
        if (reply.data_port() == 0) served_data_plane = false;
        if (options_.data_plane == Options::DataPlane::kRequired && reply.data_port() == 0 &&
            !variables_.empty()) {
          return absl::FailedPreconditionError(absl::StrCat(
              ShardName(k), " serves no data plane, and this task was started with "
              "--tensor_transport=socket: give every task of the job the same "
              "--tensor_transport"));
        }
        up[k] = true;
      } else if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
        // A missing or wrong auth token does not get better by waiting.
        return absl::UnauthenticatedError(
            absl::StrCat(ShardName(k), ": ", status.error_message()));
      } else {
        waiting.push_back(absl::StrCat(ShardName(k), ": ", status.error_message()));
      }
    }
    if (waiting.empty()) {
      if (data_plane_ != nullptr && !served_data_plane) {
        LOG(INFO) << "a ps task serves no data plane: pushes and pulls over gRPC";
        data_plane_.reset();
      }
      if (data_plane_ != nullptr && !variables_.empty()) {
        LOG(INFO) << "pushes and pulls over the data plane (--tensor_transport)";
      }
      return absl::OkStatus();
    }
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("parameter servers not reachable after ", 
                       absl::FormatDuration(timeout), ": ",
                       absl::StrJoin(waiting, "; ")));
    }
    if (absl::Now() >= next_log) {
      LOG(INFO) << "waiting for " << absl::StrJoin(waiting, "; ");
      next_log = absl::Now() + absl::Seconds(5);
    }
    absl::SleepFor(backoff.Next());
  }
}

absl::Status PsClient::Init(const proto::TrainingConfig& config,
                            const std::vector<Tensor>& params,
                            int64_t recovery_epoch) {
  CHECK_EQ(params.size(), variables_.size());
  absl::BlockingCounter released(num_shards());
  std::vector<grpc::ByteBuffer> requests;
  for (int k = 0; k < num_shards(); ++k) {
    proto::InitHeader header;
    *header.mutable_config() = config;
    header.set_recovery_epoch(recovery_epoch);
    std::vector<absl::Span<const char>> chunks;
    for (int s : placement_.shard_slices[k]) {
      const VariableSlice& slice = placement_.slices[s];
      *header.add_variables() = MetaOf(slice);
      const char* base = reinterpret_cast<const char*>(params[slice.variable].data());
      chunks.emplace_back(base + slice.byte_offset, slice.num_bytes);
    }
    requests.push_back(EncodeTensorFrame(header, chunks, [&] { released.DecrementCount(); }));
  }
  absl::Status status =
      fanout_->CallAll(kInit, options_.rpc_timeout, RetryOn::kUnavailable, requests);
  requests.clear();
  released.Wait();  // gRPC no longer reads `params`.
  return status;
}

absl::StatusOr<std::vector<proto::StatusResponse>> PsClient::GetStatus() {
  std::vector<grpc::ByteBuffer> requests(num_shards(),
                                         SerializeToByteBuffer(proto::StatusRequest()));
  std::vector<proto::StatusResponse> statuses(num_shards());
  RETURN_IF_ERROR(fanout_->CallAll(kGetStatus, options_.rpc_timeout, RetryOn::kUnavailable,
                                   requests, [&](int k, const grpc::ByteBuffer& response) {
                                     return ParseFromByteBuffer(response, &statuses[k]);
                                   }));
  return statuses;
}

absl::StatusOr<proto::TrainingConfig> PsClient::WaitForModelReady(
    absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  absl::Time next_log = absl::Now() + absl::Seconds(2);
  while (true) {
    ASSIGN_OR_RETURN(std::vector<proto::StatusResponse> statuses, GetStatus());
    std::vector<std::string> waiting;
    for (int k = 0; k < num_shards(); ++k) {
      if (statuses[k].training_done()) {
        return absl::CancelledError(
            absl::StrCat(ShardName(k), ": the chief has ended training"));
      }
      if (!statuses[k].ready()) waiting.push_back(ShardName(k));
    }
    if (waiting.empty()) {
      for (int k = 0; k < num_shards(); ++k) {
        const auto& held = statuses[k].variables();
        const auto& mine = push_headers_[k].variables();
        bool same = held.size() == mine.size();
        for (int i = 0; same && i < held.size(); ++i) {
          same = held[i].name() == mine[i].name() &&
                 std::equal(held[i].shape().begin(), held[i].shape().end(),
                            mine[i].shape().begin(), mine[i].shape().end());
        }
        if (!same) {
          return absl::FailedPreconditionError(absl::StrCat(
              ShardName(k), " holds a model other than this worker's (check that "
              "every worker has the same --model, layer sizes, "
              "--placement and --partition_threshold_bytes)"));
        }
      }
      return statuses[0].config();
    }
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the chief did not initialize the model within ",
          absl::FormatDuration(timeout), ": waiting for ",
          absl::StrJoin(waiting, ", ")));
    }
    if (absl::Now() >= next_log) {
      LOG(INFO) << "waiting for the chief to initialize "
                << absl::StrJoin(waiting, ", ");
      next_log = absl::Now() + absl::Seconds(5);
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

absl::StatusOr<PsClient::PullResult> PsClient::Pull(
    int64_t min_version, std::vector<Tensor>* params, bool moving_average,
    int64_t min_clock, Precision precision, const ShardHooks* hooks) {
  CHECK_EQ(params->size(), variables_.size());
  const proto::DataType dtype =
      precision == Precision::kWire ? options_.wire_dtype : proto::DT_FLOAT;
  proto::PullRequest request;
  if (dtype != proto::DT_FLOAT) request.set_wire_dtype(dtype);
  request.set_min_version(min_version);
  request.set_replica(options_.replica);
  request.set_moving_average(moving_average);
  request.set_min_clock(min_clock);
  request.set_timeout_ms(absl::ToInt64Milliseconds(options_.pull_timeout));
  std::vector<proto::PullHeader> headers(num_shards());
  const absl::Time start = absl::Now();
  std::atomic<int64_t> bytes{0};
  if (data_plane_ != nullptr) {
    std::vector<DataPlaneShards::Request> requests(num_shards());
    for (int k = 0; k < num_shards(); ++k) {
      request.set_incarnation(incarnations_[k]);
      requests[k].meta = request.SerializeAsString();
    }
    RETURN_IF_ERROR(data_plane_->CallAll(
        dataplane::FrameMethod::kPull, options_.pull_timeout + absl::Seconds(10),
        /*retry_deadline=*/false, requests,
        [&](int k, dataplane::FrameConnection* connection, const dataplane::FrameHeader& reply,
            const std::string& meta) -> absl::Status {
          if (!headers[k].ParseFromString(meta)) {
            return absl::InternalError("pull reply: the metadata is not a PullHeader");
          }
          bytes += dataplane::kFrameHeaderBytes + meta.size() + reply.data_size;
          RETURN_IF_ERROR(CheckPullReply(k, headers[k], reply.data_size, dtype));
          const absl::Time deadline = absl::Now() + options_.rpc_timeout;
          const std::vector<int>& slices = placement_.shard_slices[k];
          if (dtype == proto::DT_FLOAT) {
            // Straight from the socket into the parameters.
            for (int s : slices) {
              const VariableSlice& slice = placement_.slices[s];
              char* dst = reinterpret_cast<char*>((*params)[slice.variable].data()) +
                          slice.byte_offset;
              RETURN_IF_ERROR(connection->ReceiveData({dst, size_t(slice.num_bytes)}, deadline));
            }
          } else {
            std::vector<char>& wire = pulled_wire_[k];
            if (wire.size() < reply.data_size) wire.resize(reply.data_size);  // Once.
            RETURN_IF_ERROR(connection->ReceiveData({wire.data(), size_t(reply.data_size)},
                                                    deadline));
            const SpanByteSource encoded({wire.data(), size_t(reply.data_size)});
            const WireAsFloatSource values(encoded, dtype);
            size_t offset = 0;
            for (int s : slices) {
              const VariableSlice& slice = placement_.slices[s];
              char* dst = reinterpret_cast<char*>((*params)[slice.variable].data()) +
                          slice.byte_offset;
              values.ReadAt(offset, {dst, size_t(slice.num_bytes)});
              offset += slice.num_bytes;
            }
          }
          if (hooks != nullptr && hooks->arrived) hooks->arrived(k);
          return absl::OkStatus();
        }));
  } else {
    std::vector<grpc::ByteBuffer> requests;
    for (int k = 0; k < num_shards(); ++k) {
      request.set_incarnation(incarnations_[k]);
      requests.push_back(SerializeToByteBuffer(request));
    }
    RETURN_IF_ERROR(fanout_->CallAll(
        kPull, options_.pull_timeout + absl::Seconds(10), RetryOn::kUnavailable, requests,
        [&](int k, const grpc::ByteBuffer& response) -> absl::Status {
          bytes += response.Length();
          TensorFrameReader reader;
          RETURN_IF_ERROR(reader.Open(response, &headers[k]));
          RETURN_IF_ERROR(CheckPullReply(k, headers[k], reader.size(), dtype));
          // The values as float32, whatever the wire carried.
          std::optional<WireAsFloatSource> decoded;
          const ByteSource& values = dtype != proto::DT_FLOAT
                                         ? decoded.emplace(reader, dtype)
                                         : static_cast<const ByteSource&>(reader);
          size_t offset = 0;
          for (int s : placement_.shard_slices[k]) {
            const VariableSlice& slice = placement_.slices[s];
            char* dst = reinterpret_cast<char*>((*params)[slice.variable].data()) +
                        slice.byte_offset;
            copier_.ParallelFor(slice.num_bytes, kCopyGrainBytes,
                                [&](int64_t begin, int64_t end) {
                                  values.ReadAt(offset + begin,
                                                {dst + begin, size_t(end - begin)});
                                });
            offset += slice.num_bytes;
          }
          if (hooks != nullptr && hooks->arrived) hooks->arrived(k);
          return absl::OkStatus();
        }));
  }
  if (options_.metrics != nullptr) {
    options_.metrics->RecordPull(bytes);
    options_.metrics->RecordPullWait(absl::Now() - start);
  }
  std::vector<int64_t> incarnations;
  for (const proto::PullHeader& header : headers) incarnations.push_back(header.incarnation());
  RETURN_IF_ERROR(CheckIncarnations(incarnations));
  PullResult result;
  result.version = headers[0].version();
  for (int k = 0; k < num_shards(); ++k) {
    versions_[k] = headers[k].version();
    result.version = std::min(result.version, headers[k].version());
    result.training_done |= headers[k].training_done();
    result.waited =
        std::max(result.waited, absl::Microseconds(headers[k].waited_us()));
  }
  return result;
}

absl::StatusOr<PsClient::PushResult> PsClient::Push(
    const std::vector<Tensor>& grads, const ShardHooks* hooks) {
  CHECK_EQ(grads.size(), variables_.size());
  const absl::Time start = absl::Now();
  int64_t bytes = 0;
  ++push_step_;  // Retries below resend the same (worker, step).
  std::vector<proto::PushResponse> responses(num_shards());
  const std::vector<int>* order = hooks != nullptr ? &hooks->order : nullptr;
  absl::Status status;
  if (data_plane_ != nullptr) {
    // The gradients are sent straight from `grads`; CallAll returns once
    // every shard has answered, so nothing reads them later.
    std::vector<DataPlaneShards::Request> data_requests(num_shards());
    auto prepare = [&](int k) -> absl::Status {
      if (hooks != nullptr && hooks->wait_until_ready) RETURN_IF_ERROR(hooks->wait_until_ready(k));
      data_requests[k].data = PushPieces(k, grads);
      data_requests[k].meta = push_headers_[k].SerializeAsString();
      bytes += dataplane::kFrameHeaderBytes + data_requests[k].meta.size();
      for (const absl::Span<const char>& piece : data_requests[k].data) bytes += piece.size();
      return absl::OkStatus();
    };
    status = data_plane_->CallAll(
        dataplane::FrameMethod::kPush, options_.rpc_timeout, /*retry_deadline=*/true,
        data_requests,
        [&](int k, dataplane::FrameConnection*, const dataplane::FrameHeader& reply,
            const std::string& meta) -> absl::Status {
          if (reply.data_size != 0 || !responses[k].ParseFromString(meta)) {
            return absl::InternalError("push reply: not a PushResponse");
          }
          return absl::OkStatus();
        },
        order, prepare);
  } else {
    absl::BlockingCounter released(num_shards());
    std::vector<grpc::ByteBuffer> requests(num_shards());
    int encoded_shards = 0;  // Frames whose release `released` counts.
    // Encodes shard k's request, from its gradients as they are now.
    auto prepare = [&](int k) -> absl::Status {
      if (hooks != nullptr && hooks->wait_until_ready) RETURN_IF_ERROR(hooks->wait_until_ready(k));
      requests[k] = EncodeTensorFrame(push_headers_[k], PushPieces(k, grads),
                                      [&] { released.DecrementCount(); });
      ++encoded_shards;
      bytes += requests[k].Length();
      return absl::OkStatus();
    };
    status = fanout_->CallAll(
        kPush, options_.rpc_timeout, RetryOn::kUnavailableOrDeadline, requests,
        [&](int k, const grpc::ByteBuffer& response) {
          return ParseFromByteBuffer(response, &responses[k]);
        },
        /*independent=*/false, order, prepare);
    // Even a failed or timed-out call may still be reading `grads` in gRPC's
    // write path: return only once gRPC has dropped every reference.
    requests.clear();
    for (int k = encoded_shards; k < num_shards(); ++k) released.DecrementCount();  // Never made.
    released.Wait();
  }
  PushResult result;
  for (const proto::PushResponse& r : responses) {
    result.accepted &= r.accepted();
    result.training_done |= r.training_done();
  }
  if (options_.metrics != nullptr) {
    options_.metrics->RecordPush(OutcomeOf(status.ok(), result.accepted, result.training_done),
                                 bytes, absl::Now() - start);
  }
  RETURN_IF_ERROR(status);  // Before the replies: a failed call has none.
  std::vector<int64_t> incarnations;
  for (const proto::PushResponse& r : responses) incarnations.push_back(r.incarnation());
  RETURN_IF_ERROR(CheckIncarnations(incarnations));
  return result;
}

absl::Status PsClient::Shutdown() {
  proto::ShutdownRequest request;
  request.set_replica(options_.replica);
  const grpc::ByteBuffer bytes = SerializeToByteBuffer(request);
  // One call per ps task, whose service tells every stripe it serves (a
  // call to a later stripe could find the process gone already). Every task
  // must hear it, whatever another one answers (a ps that misses the chief's
  // goodbye waits for training to end), and at once: the tasks in parallel,
  // so that unreachable ones cost one timeout, not one each.
  std::vector<int> first_stripes;
  for (int k = 0; k < num_shards(); k += options_.ps_stripes) first_stripes.push_back(k);
  std::vector<absl::Status> statuses(first_stripes.size());
  std::vector<std::thread> calls;
  for (size_t i = 0; i < first_stripes.size(); ++i) {
    calls.emplace_back([&, i] {
      grpc::ByteBuffer response;
      statuses[i] = FromGrpcStatus(
          fanout_->CallOne(first_stripes[i], kShutdown, absl::Seconds(10), bytes, &response));
    });
  }
  for (std::thread& call : calls) call.join();
  std::vector<std::string> errors;
  absl::StatusCode code = absl::StatusCode::kOk;
  for (size_t i = 0; i < first_stripes.size(); ++i) {
    if (statuses[i].ok()) continue;
    if (code == absl::StatusCode::kOk) code = statuses[i].code();
    errors.push_back(absl::StrCat(ShardName(first_stripes[i]), ": ", statuses[i].message()));
  }
  return errors.empty() ? absl::OkStatus() : absl::Status(code, absl::StrJoin(errors, "; "));
}

absl::Status PsClient::Save(int64_t step, int64_t version, int keep, int64_t keep_step) {
  proto::SaveRequest request;
  request.set_step(step);
  request.set_version(version);
  request.set_keep(keep);
  if (keep_step >= 0) request.set_keep_step(keep_step);
  std::vector<grpc::ByteBuffer> requests(num_shards(), SerializeToByteBuffer(request));
  // Writing a large shard to disk takes a while.
  return fanout_->CallAll(kSave, options_.rpc_timeout + absl::Minutes(5), RetryOn::kUnavailable,
                          requests);
}

absl::Status PsClient::Restore(int64_t step, int64_t recovery_epoch) {
  proto::RestoreRequest request;
  request.set_step(step);
  request.set_recovery_epoch(recovery_epoch);
  std::vector<grpc::ByteBuffer> requests(num_shards(), SerializeToByteBuffer(request));
  return fanout_->CallAll(kRestore, options_.rpc_timeout + absl::Minutes(5),
                          RetryOn::kUnavailable, requests);
}

}  // namespace psrt
