// ParameterShard's 16-bit wire formats: a bfloat16 or float16 push applies
// its decoded values (and one that is not taken is not read at all), one
// holding NaN or Inf is refused, and a 16-bit pull's encoding is made once
// per version and kind, shared by every pull of that version, and equal to a
// fresh encoding.
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "tests/ps/shard_test_util.h"

namespace psrt {
namespace {

using shard_test::Config;
using shard_test::InitShard;
using shard_test::kSize;
using shard_test::Meta;
using shard_test::PullNow;
using shard_test::PushFrom;

// A ByteSource that counts the bytes read from it.
class CountingSource : public ByteSource {
 public:
  explicit CountingSource(const std::vector<uint16_t>& wire)
      : bytes_(absl::Span<const char>(reinterpret_cast<const char*>(wire.data()),
                                      wire.size() * sizeof(uint16_t))) {}
  size_t size() const override { return bytes_.size(); }
  void ReadAt(size_t offset, absl::Span<char> dst) const override {
    read_ += dst.size();
    bytes_.ReadAt(offset, dst);
  }
  size_t read() const { return read_.load(); }

 private:
  SpanByteSource bytes_;
  mutable std::atomic<size_t> read_{0};
};

proto::PushHeader WireHeader(int replica, int64_t version, proto::DataType dtype) {
  proto::PushHeader header;
  header.set_replica(replica);
  header.set_version(version);
  proto::VariableMeta meta = Meta("w", {kSize});
  meta.set_dtype(dtype);
  *header.add_variables() = meta;
  return header;
}

std::vector<uint16_t> Encoded(proto::DataType dtype, const std::vector<float>& values) {
  std::vector<uint16_t> wire(values.size());
  EncodeWire(dtype, values, absl::MakeSpan(wire));
  return wire;
}

TEST(ParameterShardWireTest, A16BitPushAppliesItsValuesAndAStaleOneIsNotRead) {
  for (proto::DataType dtype : {proto::DT_BFLOAT16, proto::DT_HALF}) {
    for (proto::SyncMode mode : {proto::ASYNC, proto::SYNC}) {
      ParameterShard shard{ParameterShard::Options()};
      InitShard(&shard, Config(mode, 2, 2), {1, 2, 3, 4});
      const std::vector<uint16_t> wire = Encoded(dtype, {1, 1, 1, 1});
      CountingSource data(wire);
      absl::StatusOr<proto::PushResponse> pushed = shard.Push(WireHeader(0, 0, dtype), &data);
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      EXPECT_TRUE(pushed->accepted());
      // Checked for NaN and Inf, then applied or summed, decoding as it
      // reads (in cache; cheaper than a stripe-sized decoded copy).
      EXPECT_EQ(data.read(), 2 * wire.size() * sizeof(uint16_t)) << dtype << " " << mode;
      CountingSource again(wire);
      ASSERT_TRUE(shard.Push(WireHeader(1, 0, dtype), &again).ok());
      const std::vector<float> want =
          mode == proto::SYNC ? std::vector<float>{0, 1, 2, 3} : std::vector<float>{-1, 0, 1, 2};
      EXPECT_EQ(PullNow(&shard, mode == proto::SYNC ? 1 : 2)->second, want);
      // A stale push is not decoded at all.
      if (mode == proto::SYNC) {
        CountingSource stale(wire);
        ASSERT_TRUE(shard.Push(WireHeader(0, 0, dtype), &stale).ok());
        EXPECT_EQ(stale.read(), 0u);
      }
    }
  }
}

TEST(ParameterShardWireTest, A16BitPushHoldingNaNOrInfIsStillRefused) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (proto::DataType dtype : {proto::DT_BFLOAT16, proto::DT_HALF}) {
    for (proto::SyncMode mode : {proto::ASYNC, proto::SYNC}) {
      ParameterShard shard{ParameterShard::Options()};
      InitShard(&shard, Config(mode, 2, 2), {1, 2, 3, 4});
      // A finite push first, so that the refused one would be summed in.
      const std::vector<uint16_t> fine = Encoded(dtype, {1, 1, 1, 1});
      SpanByteSource fine_bytes(absl::Span<const char>(
          reinterpret_cast<const char*>(fine.data()), fine.size() * sizeof(uint16_t)));
      ASSERT_TRUE(shard.Push(WireHeader(0, 0, dtype), &fine_bytes).ok());
      for (float bad : {nan, std::numeric_limits<float>::infinity()}) {
        const std::vector<uint16_t> wire = Encoded(dtype, {0, bad, 0, 0});
        SpanByteSource bytes(absl::Span<const char>(reinterpret_cast<const char*>(wire.data()),
                                                    wire.size() * sizeof(uint16_t)));
        absl::StatusOr<proto::PushResponse> refused = shard.Push(WireHeader(1, 0, dtype), &bytes);
        EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument)
            << dtype << " " << mode << " " << refused.status();
      }
      // Nothing of the refused pushes was applied (nor summed, in sync mode).
      ASSERT_TRUE(PushFrom(&shard, 1, mode == proto::SYNC ? 0 : 1, {3, 3, 3, 3}).ok());
      const std::vector<float> want = mode == proto::SYNC ? std::vector<float>{-1, 0, 1, 2}
                                                          : std::vector<float>{-3, -2, -1, 0};
      EXPECT_EQ(PullNow(&shard, mode == proto::SYNC ? 1 : 2)->second, want);
    }
  }
}

// A pull's reply, held.
ParameterShard::PullReply PullHeld(ParameterShard* shard, proto::DataType dtype,
                                   int64_t min_version, bool moving_average = false) {
  absl::Notification done;
  absl::StatusOr<ParameterShard::PullReply> reply;
  ParameterShard::PullOptions options;
  options.wire_dtype = dtype;
  options.min_version = min_version;
  options.moving_average = moving_average;
  options.deadline = absl::Now() + absl::Seconds(5);
  shard->Pull(options, [&](absl::StatusOr<ParameterShard::PullReply> r) {
    reply = std::move(r);
    done.Notify();
  });
  done.WaitForNotification();
  EXPECT_TRUE(reply.ok()) << reply.status();
  return reply.ok() ? *std::move(reply) : ParameterShard::PullReply();
}

// The reply's bytes, as 16-bit words.
std::vector<uint16_t> Words(const ParameterShard::PullReply& reply) {
  const auto* words = reinterpret_cast<const uint16_t*>(reply.snapshot->values.data());
  return std::vector<uint16_t>(words, words + reply.num_bytes / sizeof(uint16_t));
}

TEST(ParameterShardWireTest, PullsOfOneVersionShareOneEncodingEqualToAFreshOne) {
  ParameterShard shard{ParameterShard::Options()};
  proto::TrainingConfig config = Config(proto::SYNC, 1, 1);
  config.set_moving_average_decay(0.5f);
  const float fine = 1.0f + 1.0f / 1024;  // Not a bfloat16.
  InitShard(&shard, config, {fine, 2, 3, 4});
  for (proto::DataType dtype : {proto::DT_BFLOAT16, proto::DT_HALF}) {
    const ParameterShard::PullReply first = PullHeld(&shard, dtype, 0);
    const ParameterShard::PullReply second = PullHeld(&shard, dtype, 0);
    // Both held at once: one buffer, encoded once.
    EXPECT_EQ(first.snapshot, second.snapshot);
    EXPECT_EQ(first.num_bytes, kSize * sizeof(uint16_t));
    EXPECT_EQ(second.header.variables(0).dtype(), dtype);
    EXPECT_EQ(Words(first), Encoded(dtype, {fine, 2, 3, 4}));
  }
  // Each kind has its own: bfloat16 and float16, values and averages.
  const ParameterShard::PullReply bf16 = PullHeld(&shard, proto::DT_BFLOAT16, 0);
  const ParameterShard::PullReply fp16 = PullHeld(&shard, proto::DT_HALF, 0);
  const ParameterShard::PullReply average = PullHeld(&shard, proto::DT_BFLOAT16, 0, true);
  EXPECT_NE(bf16.snapshot, fp16.snapshot);
  EXPECT_NE(bf16.snapshot, average.snapshot);
  EXPECT_EQ(Words(fp16), Encoded(proto::DT_HALF, {fine, 2, 3, 4}));

  // A new version is encoded anew, and equals a fresh encoding of it; the
  // older pull's bytes stay as they were.
  ASSERT_TRUE(PushFrom(&shard, 0, 0, {1, 1, 1, 1}).ok());
  const ParameterShard::PullReply next = PullHeld(&shard, proto::DT_BFLOAT16, 1);
  EXPECT_NE(next.snapshot, bf16.snapshot);
  EXPECT_EQ(next.header.version(), 1);
  EXPECT_EQ(Words(next), Encoded(proto::DT_BFLOAT16, PullNow(&shard, 1)->second));
  EXPECT_EQ(Words(bf16), Encoded(proto::DT_BFLOAT16, {fine, 2, 3, 4}));
  const ParameterShard::PullReply next_average = PullHeld(&shard, proto::DT_BFLOAT16, 1, true);
  EXPECT_NE(Words(next_average), Words(average));
  // And the float32 pull still shares the shard's values, untouched.
  EXPECT_EQ(PullNow(&shard, 1)->second, (std::vector<float>{fine - 1, 1, 2, 3}));
}

}  // namespace
}  // namespace psrt
