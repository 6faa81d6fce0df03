// Fuzzes a parameter server's restore from its checkpoint directory
// (ps/checkpoint.h: the index file and a safetensors shard file, read by
// ParameterShard::RestoreLatest as psrt_ps does at start). A checkpoint
// that restores must then serve pulls and pushes, save, and restore again
// to the same values.
//
// Input: U16 length of the index text, the index text
// ("checkpoint.ps-0-of-1"), the bytes of "model.ckpt-7.ps-0-of-1.safetensors"
// (the rest; written with a valid checksum when they parse as safetensors).
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/byte_source.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "google/protobuf/text_format.h"
#include "ps/checkpoint.h"
#include "ps/parameter_shard.h"

namespace {

// The values a pull returns right now (training is never waited for).
std::vector<float> PullNow(psrt::ParameterShard* shard) {
  std::vector<float> values;
  bool answered = false;
  shard->Pull({}, [&](absl::StatusOr<psrt::ParameterShard::PullReply> reply) {
    answered = true;
    CHECK(reply.ok()) << reply.status();
    int64_t elements = 0;
    for (const auto& meta : reply->header.variables()) {
      elements += psrt::NumElements({meta.shape().begin(), meta.shape().end()});
    }
    const psrt::Tensor& t = reply->snapshot->values;
    CHECK_EQ(t.num_elements(), elements);
    values.assign(t.data(), t.data() + t.num_elements());
  });
  CHECK(answered);  // min_version 0 is always ready.
  return values;
}

// Confirms a restored state, as the chief does with Init before training,
// naming the embedding tables `tables` (the restored file's).
void Confirm(psrt::ParameterShard* shard,
             const google::protobuf::RepeatedPtrField<psrt::proto::TableMeta>& tables) {
  const psrt::proto::StatusResponse status = shard->GetStatus();
  psrt::proto::InitHeader header;
  *header.mutable_config() = status.config();
  *header.mutable_variables() = status.variables();
  *header.mutable_tables() = tables;
  int64_t elements = 0;
  for (const auto& meta : status.variables()) {
    elements += psrt::NumElements({meta.shape().begin(), meta.shape().end()});
  }
  const std::vector<float> ignored(elements);
  psrt::SpanByteSource data(
      {reinterpret_cast<const char*>(ignored.data()), ignored.size() * sizeof(float)});
  absl::StatusOr<bool> confirmed = shard->Init(header, &data);
  CHECK(confirmed.ok()) << "a restored state is not confirmed: " << confirmed.status();
  CHECK(!*confirmed);  // The restored state is kept.
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  psrt::fuzz::InputReader in(data, size);
  psrt::fuzz::ClearScratchDir();
  psrt::fuzz::WriteScratchFile("checkpoint.ps-0-of-1", in.Bytes(in.U16()));
  // A restore demands psrt's checksum, which a mutation rarely keeps: a
  // file that parses is re-signed, so that the restore's own checks run.
  const std::string shard_file = "model.ckpt-7.ps-0-of-1.safetensors";
  const std::string bytes(in.Rest());
  absl::StatusOr<psrt::SafetensorsFile> parsed = psrt::ParseSafetensors(bytes, shard_file);
  psrt::proto::InitHeader saved;  // The file's header, for its tables.
  if (parsed.ok()) {
    google::protobuf::TextFormat::ParseFromString(parsed->metadata["header"], &saved);
    CHECK(psrt::WriteSafetensors(psrt::fuzz::ScratchDir() + "/" + shard_file,
                                 psrt::NamedTensorsOf(*parsed), parsed->metadata)
              .ok());
  } else {
    psrt::fuzz::WriteScratchFile(shard_file, bytes);
  }

  psrt::ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = psrt::fuzz::ScratchDir();
  psrt::ParameterShard shard(options);
  CHECK(shard.RestoreLatest().ok());
  const psrt::proto::StatusResponse status = shard.GetStatus();
  if (!status.initialized()) return 0;
  CHECK_EQ(status.restored_step(), 7);
  Confirm(&shard, saved.tables());

  PullNow(&shard);
  psrt::proto::PushHeader push;
  push.set_replica(0);
  push.set_version(status.version());
  *push.mutable_variables() = status.variables();
  const std::vector<float> zeros(PullNow(&shard).size());
  psrt::SpanByteSource gradients(
      {reinterpret_cast<const char*>(zeros.data()), zeros.size() * sizeof(float)});
  absl::StatusOr<psrt::proto::PushResponse> pushed = shard.Push(push, &gradients);
  CHECK(pushed.ok()) << pushed.status();

  const std::vector<float> before = PullNow(&shard);
  // Each table's name and rows.
  auto table_rows = [&shard] {
    const psrt::proto::StatusResponse status = shard.GetStatus();
    std::vector<std::pair<std::string, int64_t>> rows;
    for (const auto& table : status.tables()) rows.emplace_back(table.name(), table.rows());
    return rows;
  };
  const auto tables_before = table_rows();
  absl::StatusOr<std::string> resaved = shard.Save(8, -1, 2);
  CHECK(resaved.ok()) << resaved.status();
  const absl::Status restored = shard.Restore(8);
  CHECK(restored.ok()) << "a checkpoint psrt saved does not restore: " << restored;
  Confirm(&shard, saved.tables());
  const std::vector<float> after = PullNow(&shard);
  CHECK(before.size() == after.size() &&
        std::memcmp(before.data(), after.data(), before.size() * sizeof(float)) == 0)
      << "restored values differ from the saved ones";
  CHECK(table_rows() == tables_before)
      << "restored tables differ from the saved ones";
  return 0;
}
