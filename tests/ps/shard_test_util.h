// Helpers of the ParameterShard tests: a one-variable model "w" of kSize
// floats, and pushes and pulls made in place.
#ifndef PSRT_TESTS_PS_SHARD_TEST_UTIL_H_
#define PSRT_TESTS_PS_SHARD_TEST_UTIL_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/strings/str_cat.h"
#include "common/byte_source.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "ps/parameter_shard.h"

namespace psrt {
namespace shard_test {

inline constexpr int kSize = 4;

inline proto::VariableMeta Meta(const std::string& name, Shape shape) {
  proto::VariableMeta meta;
  meta.set_name(name);
  meta.set_dtype(proto::DT_FLOAT);
  for (int64_t d : shape) meta.add_shape(d);
  return meta;
}

// The bytes of `v`, as the shard reads them off the wire; lives until the
// end of the full expression.
inline std::unique_ptr<ByteSource> Bytes(const std::vector<float>& v) {
  return std::make_unique<SpanByteSource>(absl::Span<const char>(
      reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
}

inline proto::TrainingConfig Config(proto::SyncMode mode, int replicas, int aggregate,
                             float learning_rate = 1.0f) {
  proto::TrainingConfig config;
  config.set_mode(mode);
  config.set_num_replicas(replicas);
  config.set_replicas_to_aggregate(aggregate);
  config.set_optimizer(proto::SGD);
  config.set_learning_rate(learning_rate);
  return config;
}

inline void InitShard(ParameterShard* shard, const proto::TrainingConfig& config,
               std::vector<float> initial = std::vector<float>(kSize, 0.0f)) {
  proto::InitHeader header;
  *header.mutable_config() = config;
  *header.add_variables() = Meta("w", {kSize});
  auto initialized = shard->Init(header, Bytes(initial).get());
  ASSERT_TRUE(initialized.ok()) << initialized.status();
  ASSERT_TRUE(*initialized);
}

inline absl::StatusOr<proto::PushResponse> PushFrom(ParameterShard* shard, int replica,
                                             int64_t version,
                                             const std::vector<float>& grad,
                                             int64_t worker_incarnation = 0,
                                             int64_t step = 0) {
  proto::PushHeader header;
  header.set_replica(replica);
  header.set_version(version);
  header.set_worker_incarnation(worker_incarnation);
  header.set_step(step);
  *header.add_variables() = Meta("w", {kSize});
  return shard->Push(header, Bytes(grad).get());
}

// Pulls synchronously; returns the values (empty on error).
inline absl::StatusOr<std::pair<int64_t, std::vector<float>>> PullNow(
    ParameterShard* shard, int64_t min_version,
    absl::Duration timeout = absl::Seconds(5)) {
  absl::Notification done;
  absl::StatusOr<ParameterShard::PullReply> result;
  ParameterShard::PullOptions options;
  options.min_version = min_version;
  options.deadline = absl::Now() + timeout;
  shard->Pull(options,
              [&](absl::StatusOr<ParameterShard::PullReply> reply) {
                result = std::move(reply);
                done.Notify();
              });
  done.WaitForNotification();
  if (!result.ok()) return result.status();
  const Tensor& values = result->snapshot->values;
  return std::make_pair(result->header.version(),
                        std::vector<float>(values.data(), values.data() + kSize));
}

// Pulls version >= 0 encoded as `dtype` (DT_BFLOAT16 or DT_HALF) and decodes
// it; an error when the reply is not in that format.
inline absl::StatusOr<std::vector<float>> PullOnTheWire(ParameterShard* shard,
                                                        proto::DataType dtype) {
  absl::Notification done;
  absl::StatusOr<ParameterShard::PullReply> reply;
  ParameterShard::PullOptions options;
  options.wire_dtype = dtype;
  shard->Pull(options, [&](absl::StatusOr<ParameterShard::PullReply> r) {
    reply = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  if (!reply.ok()) return reply.status();
  if (reply->num_bytes != kSize * sizeof(uint16_t) ||
      reply->header.variables(0).dtype() != dtype) {
    return absl::InternalError(absl::StrCat("reply of ", reply->num_bytes, " bytes of ",
                                            proto::DataType_Name(reply->header.variables(0).dtype())));
  }
  std::vector<float> decoded(kSize);
  DecodeWire(dtype, {reinterpret_cast<const uint16_t*>(reply->snapshot->values.data()), kSize},
             absl::MakeSpan(decoded));
  return decoded;
}

}  // namespace shard_test
}  // namespace psrt

#endif  // PSRT_TESTS_PS_SHARD_TEST_UTIL_H_
