#include "worker/store/ps_client.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/backoff.h"
#include "common/cluster_spec.h"
#include "common/random_id.h"
#include "common/rpc_util.h"
#include "common/status_macros.h"
#include "common/timeline.h"
#include "common/transport_security.h"
#include "common/wire_dtype.h"
#include "dataplane/frame_connection.h"
#include "glog/logging.h"
#include "worker/store/dataplane_shard_transport.h"
#include "worker/store/grpc_shard_transport.h"
#include "worker/store/shard_calls.h"
#include "worker/store/slice_codec.h"

namespace psrt {
namespace {

// The timeline lane of shard k's pushes or pulls.
std::string ShardLane(absl::string_view what, int k) {
  return absl::StrCat(what, " shard ", k);
}

}  // namespace

PsClient::PsClient(Options options, Placement placement,
                   std::vector<VariableDef> variables)
    : options_(std::move(options)),
      copier_(options_.copy_threads, /*spin=*/false),
      placement_(std::move(placement)),
      variables_(std::move(variables)),
      grpc_(std::make_unique<GrpcShardTransport>()) {
  CHECK_GE(options_.ps_stripes, 1);
  CHECK_EQ(placement_.num_shards,
           static_cast<int>(options_.ps_addresses.size()) * options_.ps_stripes);
  CHECK(IsWireDtype(options_.wire_dtype)) << options_.wire_dtype;
  const TransportSecurity plaintext;
  const TransportSecurity& security = options_.security ? *options_.security : plaintext;
  const bool unix_socket = options_.unix_socket && !security.tls();
  LOG_IF(WARNING, options_.unix_socket && security.tls())
      << "unix_socket: TLS channels stay on TCP (certificates name the host)";
  CHECK(options_.ps_replicas == 0 || options_.ps_replicas == 1) << options_.ps_replicas;
  const int endpoints = num_shards() * (1 + options_.ps_replicas);
  for (int e = 0; e < endpoints; ++e) {
    const std::string& address = options_.ps_addresses[TaskOf(e)];
    const std::string target = unix_socket ? PreferLocalSocket(address) : address;
    if (target != address) LOG(INFO) << EndpointName(e) << " over " << target;
    grpc_->AddShard(NewChannel(target, security), StripeOf(e));
  }
  if (options_.tensor_transport != TensorTransport::kGrpc) {
    CHECK(!security.tls()) << "the data plane has no TLS";
    DataPlaneShardTransport::Options data_plane;
    data_plane.num_shards = endpoints;
    data_plane.addresses_of = [this](int e) { return DataPlaneAddresses(e); };
    data_plane.stripe_of = [this](int e) { return StripeOf(e); };
    data_plane.credential = security.DataPlaneCredential();
    data_plane.transfer_timeout = options_.rpc_timeout;
    data_plane.shard_name = [this](int e) { return EndpointName(e); };
    data_plane_ = std::make_unique<DataPlaneShardTransport>(std::move(data_plane));
  }
  calls_ = std::make_unique<ShardCalls>(num_shards(), [this](int k) { return ShardName(k); },
                                        options_.retry_timeout, 1 + options_.ps_replicas);
  pushed_to_.assign(num_shards(), -1);
  codec_ = std::make_unique<SliceCodec>(placement_, copier_);
  push_headers_.resize(num_shards());
  for (int k = 0; k < num_shards(); ++k) {
    push_headers_[k].set_replica(options_.replica);
    for (proto::VariableMeta& meta : codec_->Metas(k, options_.wire_dtype)) {
      *push_headers_[k].add_variables() = std::move(meta);
    }
  }
  versions_.assign(num_shards(), 0);
  incarnations_.assign(num_shards(), 0);
  worker_incarnation_ = NewIncarnation();
  shard_ids_.resize(num_shards());
  for (ShardIds& shard : shard_ids_) shard.grads.resize(options_.tables.size());
}

ShardTransport& PsClient::tensors() {
  return data_plane_ != nullptr ? static_cast<ShardTransport&>(*data_plane_) : *grpc_;
}

absl::Status PsClient::CallControl(PsMethod method, absl::Duration timeout,
                                   const google::protobuf::MessageLite& request,
                                   const ShardTransport::OnReply& on_reply) {
  std::vector<ShardRequest> requests(num_shards());
  for (ShardRequest& r : requests) r.meta = &request;
  return calls_->CallAll(*grpc_, method, timeout, requests, on_reply, {});
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

int PsClient::TaskOf(int e) const {
  const int n = num_shards();
  const int tasks = static_cast<int>(options_.ps_addresses.size());
  return e < n ? e / options_.ps_stripes : ((e - n) / options_.ps_stripes + 1) % tasks;
}

int PsClient::StripeOf(int e) const {
  const int n = num_shards();
  return e < n ? e % options_.ps_stripes : options_.ps_stripes + (e - n) % options_.ps_stripes;
}

std::string PsClient::EndpointName(int e) const {
  const int task = TaskOf(e);
  const int stripe = StripeOf(e);
  return absl::StrCat("ps/", task,
                      options_.ps_stripes > 1 || options_.ps_replicas > 0
                          ? absl::StrCat(" stripe ", stripe)
                          : "",
                      " (", options_.ps_addresses[task], ")",
                      e >= num_shards() ? absl::StrCat(", the backup of shard ", e - num_shards())
                                        : "");
}

std::string PsClient::ShardName(int shard) const {
  return EndpointName(calls_ != nullptr ? calls_->endpoint(shard) : shard);
}

absl::StatusOr<std::vector<std::string>> PsClient::DataPlaneAddresses(int e) {
  proto::StatusResponse reply;
  const proto::StatusRequest request;
  const absl::Status status = calls_->CallOne(
      *grpc_, e, PsMethod::kGetStatus, absl::Seconds(5), {&request, {}},
      [&reply](int, ShardReply& answer) { return answer.ParseMeta(&reply); });
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("asking for its data plane: ", status.message()));
  }
  if (reply.data_port() == 0) {  // A ps restarted with another flag: retried, then failed.
    return absl::UnavailableError(
        "it serves no data plane now (psrt_ps --tensor_transport=grpc, or TLS)");
  }
  std::string host;
  int port = 0;
  RETURN_IF_ERROR(SplitHostPort(options_.ps_addresses[TaskOf(e)], &host, &port));
  std::vector<std::string> addresses;
  // Its Unix socket first: there only from the ps's host (network namespace).
  if (!reply.data_plane_local_address().empty()) {
    addresses.push_back(reply.data_plane_local_address());
  }
  addresses.push_back(JoinHostPort(host, reply.data_port()));
  return addresses;
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
      const proto::StatusRequest request;
      proto::StatusResponse reply;
      const absl::Status status = calls_->CallOne(
          *grpc_, calls_->endpoint(k), PsMethod::kGetStatus, absl::Seconds(2), {&request, {}},
          [&reply](int, ShardReply& answer) { return answer.ParseMeta(&reply); });
      if (status.ok()) {
        const int stripes = std::max(1, reply.stripes());
        if (reply.ps_replicas() != options_.ps_replicas && !variables_.empty()) {
          return absl::FailedPreconditionError(absl::StrCat(
              ShardName(k), " runs with --ps_replicas=", reply.ps_replicas(),
              ", but this task was started with --ps_replicas=", options_.ps_replicas,
              ": give the ps tasks and every worker the same --ps_replicas"));
        }
        if (reply.restoring()) {
          waiting.push_back(absl::StrCat(ShardName(k), ": restoring its checkpoint"));
          continue;
        }
        // An operator's client (no variables) deals in whole processes.
        if (stripes != options_.ps_stripes && !variables_.empty()) {
          return absl::FailedPreconditionError(absl::StrCat(
              ShardName(k), " serves ", stripes, " stripes, but this task was "
              "started with --ps_stripes=", options_.ps_stripes,
              ": give the workers the ps tasks' --ps_stripes, or none (they then ask)"));
        }
        if (reply.data_port() == 0) served_data_plane = false;
        if (options_.tensor_transport == TensorTransport::kDataPlane && reply.data_port() == 0 &&
            !variables_.empty()) {
          return absl::FailedPreconditionError(absl::StrCat(
              ShardName(k), " serves no data plane, and this task was started with "
              "--tensor_transport=data_plane: give every task of the job the same "
              "--tensor_transport"));
        }
        up[k] = true;
      } else if (absl::IsUnauthenticated(status)) {
        // A missing or wrong auth token does not get better by waiting.
        return absl::UnauthenticatedError(absl::StrCat(ShardName(k), ": ", status.message()));
      } else {
        waiting.push_back(absl::StrCat(ShardName(k), ": ", status.message()));
        calls_->SwitchCopy(k);  // A replicated shard: its other copy next time.
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
  std::vector<proto::InitHeader> headers(num_shards());
  std::vector<ShardRequest> requests(num_shards());
  for (int k = 0; k < num_shards(); ++k) {
    *headers[k].mutable_config() = config;
    *headers[k].mutable_layout() = options_.layout;
    headers[k].set_recovery_epoch(recovery_epoch);
    for (const proto::TableMeta& table : options_.tables) *headers[k].add_tables() = table;
    for (proto::VariableMeta& meta : codec_->Metas(k, proto::DT_FLOAT)) {
      *headers[k].add_variables() = std::move(meta);
    }
    requests[k] = {&headers[k], codec_->Encode(k, params, proto::DT_FLOAT)};
  }
  // A shard may first cut its restored checkpoint anew (another placement):
  // as long as a Restore.
  return calls_->CallAll(*grpc_, PsMethod::kInit, options_.rpc_timeout + absl::Minutes(5),
                         requests, nullptr, {});
}

absl::StatusOr<std::vector<proto::StatusResponse>> PsClient::GetStatus() {
  std::vector<proto::StatusResponse> statuses(num_shards());
  RETURN_IF_ERROR(CallControl(PsMethod::kGetStatus, options_.rpc_timeout, proto::StatusRequest(),
                              [&statuses](int k, ShardReply& reply) {
                                return reply.ParseMeta(&statuses[k]);
                              }));
  // A backup copy answered: the primary's word, where the other copy gives
  // it (a backup whose primary is gone answers for the shard until a push
  // or pull makes it take over).
  for (int k = 0; k < num_shards(); ++k) {
    if (!statuses[k].backup()) continue;
    calls_->SwitchCopy(k);
    proto::StatusResponse other;
    const absl::Status asked = calls_->CallOne(
        *grpc_, calls_->endpoint(k), PsMethod::kGetStatus, absl::Seconds(5),
        {&proto::StatusRequest::default_instance(), {}},
        [&other](int, ShardReply& reply) { return reply.ParseMeta(&other); });
    if (asked.ok() && !other.backup()) {
      statuses[k] = std::move(other);
    } else {
      calls_->SwitchCopy(k);
    }
  }
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
        const auto& tables = statuses[k].tables();
        same = same && tables.size() == static_cast<int>(options_.tables.size());
        for (int t = 0; same && t < tables.size(); ++t) {
          same = tables[t].name() == options_.tables[t].name() &&
                 tables[t].dim() == options_.tables[t].dim();
        }
        if (!same) {
          return absl::FailedPreconditionError(absl::StrCat(
              ShardName(k), " holds a model other than this worker's (check that "
              "every worker has the same --model, layer sizes, --embedding_dim, "
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
  std::vector<proto::PullRequest> pulls(num_shards());
  std::vector<ShardRequest> requests(num_shards());
  for (int k = 0; k < num_shards(); ++k) {
    if (dtype != proto::DT_FLOAT) pulls[k].set_wire_dtype(dtype);
    pulls[k].set_min_version(min_version);
    pulls[k].set_replica(options_.replica);
    pulls[k].set_moving_average(moving_average);
    pulls[k].set_min_clock(min_clock);
    pulls[k].set_timeout_ms(absl::ToInt64Milliseconds(options_.pull_timeout));
    pulls[k].set_incarnation(incarnations_[k]);
  }
  // The rows are the batch's, at the values' version; moving averages are
  // an evaluation's, whose test batches look up their own rows.
  return CallPull(pulls, params, dtype, hooks, moving_average ? nullptr : sparse_,
                  /*record_versions=*/!moving_average);
}

absl::StatusOr<PsClient::PullResult> PsClient::CallPull(std::vector<proto::PullRequest>& pulls,
                                                        std::vector<Tensor>* params,
                                                        proto::DataType dtype,
                                                        const ShardHooks* hooks,
                                                        SparseFeatures* features,
                                                        bool record_versions) {
  if (features != nullptr) {
    SplitIds(*features);
    const int64_t unique = static_cast<int64_t>(features->unique.unique.size());
    features->rows.resize(options_.tables.size());
    for (size_t t = 0; t < options_.tables.size(); ++t) {
      features->rows[t].Resize({unique, options_.tables[t].dim()});
    }
  }
  std::vector<ShardRequest> requests(num_shards());
  for (int k = 0; k < num_shards(); ++k) {
    if (features != nullptr) AddSparseIds(k, &pulls[k]);
    requests[k].meta = &pulls[k];
  }
  std::vector<proto::PullHeader> headers(num_shards());
  const absl::Time start = absl::Now();
  std::atomic<int64_t> bytes{0};
  ShardCalls::CallOptions call;
  if (options_.ps_replicas > 0) {
    call.before_retry = [this](int k) { return PushAgainIfMoved(k); };
  }
  // The ps answers a waiting pull by pull_timeout; the margin covers the transfer.
  RETURN_IF_ERROR(calls_->CallAll(
      tensors(), PsMethod::kPull, options_.pull_timeout + absl::Seconds(10), requests,
      [&](int k, ShardReply& reply) -> absl::Status {
        RETURN_IF_ERROR(reply.ParseMeta(&headers[k]));
        bytes += reply.wire_bytes();
        uint64_t row_bytes = 0;
        for (const proto::SparseSegment& segment : headers[k].sparse()) {
          auto table = std::find_if(
              options_.tables.begin(), options_.tables.end(),
              [&](const proto::TableMeta& t) { return t.name() == segment.table(); });
          if (table == options_.tables.end() || segment.num_ids() < 0) {
            return absl::InternalError(absl::StrCat("pull reply carries ", segment.num_ids(),
                                                    " rows of table \"", segment.table(),
                                                    "\", which this worker does not read"));
          }
          row_bytes += static_cast<uint64_t>(segment.num_ids()) * table->dim() * sizeof(float);
        }
        if (row_bytes > reply.data_size()) {
          return absl::InternalError(absl::StrCat("pull reply of ", reply.data_size(),
                                                  " bytes, fewer than its rows' ", row_bytes));
        }
        const uint64_t dense_bytes = reply.data_size() - row_bytes;
        if (params != nullptr) {
          RETURN_IF_ERROR(
              codec_->Decode(k, dtype, headers[k].variables(), dense_bytes, reply, params));
        } else if (dense_bytes != 0) {
          return absl::InternalError(
              absl::StrCat("a rows-only pull reply carries ", dense_bytes, " bytes of values"));
        }
        if (features != nullptr) {
          RETURN_IF_ERROR(ReadRows(k, headers[k], dense_bytes, reply, features));
        }
        if (hooks != nullptr && hooks->arrived) hooks->arrived(k);
        if (options_.timeline != nullptr) {
          options_.timeline->Record("pull", ShardLane("pull", k), start, absl::Now(),
                                    headers[k].version());
        }
        return absl::OkStatus();
      },
      call));
  if (record_versions) std::fill(pushed_to_.begin(), pushed_to_.end(), -1);
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
    if (record_versions) versions_[k] = headers[k].version();
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
  ++push_step_;  // Retries resend the same (worker, step).
  if (sparse_ != nullptr) SplitIds(*sparse_);
  std::vector<ShardRequest> requests(num_shards());
  ShardCalls::CallOptions call;
  call.retry_on = RetryOn::kUnavailableOrDeadline;
  call.order = hooks != nullptr ? &hooks->order : nullptr;
  // Shard k's request, from its gradients as they are now (backward may
  // still be computing the others'). CallAll returns once no attempt reads
  // them any more.
  std::vector<absl::Time> sent(num_shards());  // For the timeline.
  call.prepare = [&](int k) -> absl::Status {
    if (hooks != nullptr && hooks->wait_until_ready) RETURN_IF_ERROR(hooks->wait_until_ready(k));
    const absl::Time ready = absl::Now();
    proto::PushHeader& header = push_headers_[k];
    header.set_version(versions_[k]);
    header.set_worker_incarnation(worker_incarnation_);
    header.set_step(push_step_);
    header.set_incarnation(incarnations_[k]);
    requests[k] = {&header, codec_->Encode(k, grads, options_.wire_dtype)};
    header.clear_sparse();
    if (sparse_ != nullptr) AddSparseGradients(k, *sparse_, &header, &requests[k].data);
    bytes += tensors().WireBytes(requests[k]);
    sent[k] = absl::Now();
    if (options_.timeline != nullptr) {
      options_.timeline->Record("encode", ShardLane("push", k), ready, sent[k], push_step_);
    }
    return absl::OkStatus();
  };
  std::vector<proto::PushResponse> responses(num_shards());
  const absl::Status status = calls_->CallAll(
      tensors(), PsMethod::kPush, options_.rpc_timeout, requests,
      [&](int k, ShardReply& reply) -> absl::Status {
        if (options_.timeline != nullptr) {
          options_.timeline->Record("push", ShardLane("push", k), sent[k], absl::Now(),
                                    push_step_);
        }
        RETURN_IF_ERROR(reply.ParseMeta(&responses[k]));
        if (reply.data_size() != 0) {
          return absl::InternalError("push reply: a PushResponse carries no data");
        }
        return absl::OkStatus();
      },
      call);
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
  if (options_.ps_replicas > 0) {
    last_grads_ = &grads;
    for (int k = 0; k < num_shards(); ++k) pushed_to_[k] = calls_->endpoint(k);
  }
  return result;
}

absl::Status PsClient::PushAgainIfMoved(int k) {
  const int now = calls_->endpoint(k);
  if (pushed_to_[k] < 0 || pushed_to_[k] == now || last_grads_ == nullptr) {
    return absl::OkStatus();
  }
  // The copy that took the push is gone, and the one serving now may not
  // hold the version it made: the same push again (the same worker and
  // step, so a copy that holds it already does not take it twice).
  LOG(WARNING) << ShardName(k) << " serves shard " << k << " now: sending it the step's push again";
  const ShardRequest request = {&push_headers_[k],
                                codec_->Encode(k, *last_grads_, options_.wire_dtype)};
  proto::PushResponse response;
  RETURN_IF_ERROR(calls_->CallOne(
      tensors(), now, PsMethod::kPush, options_.rpc_timeout, request,
      [&response](int, ShardReply& reply) { return reply.ParseMeta(&response); }));
  pushed_to_[k] = now;
  return absl::OkStatus();
}

absl::Status PsClient::Shutdown() {
  proto::ShutdownRequest request;
  request.set_replica(options_.replica);
  if (options_.replica >= 0) return ShutdownEveryTask(request, nullptr);
  // An operator: every shard held at its next version, then all ended at
  // the furthest of those (proto ShutdownRequest).
  request.set_prepare(true);
  std::vector<int64_t> bounds;
  const absl::Status prepared = ShutdownEveryTask(request, &bounds);
  // The tasks held (bound > 0; the others ended at once and may be gone)
  // end at the furthest bound; one that did not answer keeps training, and
  // the error names it.
  std::vector<int> held;
  int64_t end_version = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] > 0) held.push_back(static_cast<int>(i));
    end_version = std::max(end_version, bounds[i]);
  }
  if (held.empty()) return prepared;
  request.set_prepare(false);
  request.set_end_version(end_version);
  const absl::Status ended = ShutdownEveryTask(request, nullptr, held);
  return prepared.ok() ? ended : prepared;
}

absl::Status PsClient::ShutdownEveryTask(const proto::ShutdownRequest& request,
                                         std::vector<int64_t>* end_bounds,
                                         const std::vector<int>& only) {
  // One call per ps task, whose service tells every stripe it serves (a
  // call to a later stripe could find the process gone already). Every task
  // must hear it, whatever another one answers (a ps that misses the chief's
  // goodbye waits for training to end), and at once: the tasks in parallel,
  // so that unreachable ones cost one timeout, not one each.
  std::vector<int> first_stripes;
  for (int k = 0; k < num_shards(); k += options_.ps_stripes) {
    const int task = k / options_.ps_stripes;
    if (only.empty() || std::find(only.begin(), only.end(), task) != only.end()) {
      first_stripes.push_back(k);
    }
  }
  std::vector<absl::Status> statuses(first_stripes.size());
  std::vector<proto::ShutdownResponse> responses(first_stripes.size());
  std::vector<std::thread> calls;
  for (size_t i = 0; i < first_stripes.size(); ++i) {
    calls.emplace_back([&, i] {
      statuses[i] = calls_->CallOne(
          *grpc_, first_stripes[i], PsMethod::kShutdown, absl::Seconds(10), {&request, {}},
          [&responses, i](int, ShardReply& reply) { return reply.ParseMeta(&responses[i]); });
    });
  }
  for (std::thread& call : calls) call.join();
  if (end_bounds != nullptr) {
    end_bounds->assign(first_stripes.size(), 0);
    for (size_t i = 0; i < first_stripes.size(); ++i) {
      if (statuses[i].ok()) (*end_bounds)[i] = responses[i].end_bound();
    }
  }
  std::vector<std::string> errors;
  absl::StatusCode code = absl::StatusCode::kOk;
  for (size_t i = 0; i < first_stripes.size(); ++i) {
    if (statuses[i].ok()) continue;
    if (code == absl::StatusCode::kOk) code = statuses[i].code();
    errors.push_back(absl::StrCat(EndpointName(first_stripes[i]), ": ", statuses[i].message()));
  }
  return errors.empty() ? absl::OkStatus() : absl::Status(code, absl::StrJoin(errors, "; "));
}

absl::Status PsClient::Save(int64_t step, int64_t version, int keep, int64_t keep_step) {
  proto::SaveRequest request;
  request.set_step(step);
  request.set_version(version);
  request.set_keep(keep);
  if (keep_step >= 0) request.set_keep_step(keep_step);
  // Writing a large shard to disk takes a while.
  return CallControl(PsMethod::kSave, options_.rpc_timeout + absl::Minutes(5), request, nullptr);
}

absl::StatusOr<int64_t> PsClient::SetMembers(const proto::MembersRequest& request) {
  std::vector<int64_t> versions(num_shards());
  RETURN_IF_ERROR(CallControl(PsMethod::kSetMembers, options_.rpc_timeout, request,
                              [&versions](int k, ShardReply& reply) {
                                proto::MembersResponse response;
                                RETURN_IF_ERROR(reply.ParseMeta(&response));
                                versions[k] = response.version();
                                return absl::OkStatus();
                              }));
  return *std::min_element(versions.begin(), versions.end());
}

absl::Status PsClient::Restore(int64_t step, int64_t recovery_epoch) {
  proto::RestoreRequest request;
  request.set_step(step);
  request.set_recovery_epoch(recovery_epoch);
  return CallControl(PsMethod::kRestore, options_.rpc_timeout + absl::Minutes(5), request,
                     nullptr);
}

}  // namespace psrt
