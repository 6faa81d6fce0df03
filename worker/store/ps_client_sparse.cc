// PsClient's embedding rows (the class's contract is in ps_client.h): the
// batch's distinct ids split among the shards, the rows each shard sends
// back scattered into place, and each shard's gradient rows gathered for
// its push.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "ps/embedding_table.h"
#include "worker/store/ps_client.h"

namespace psrt {

absl::Status PsClient::LookupRows(SparseFeatures* features) {
  std::vector<proto::PullRequest> pulls(num_shards());
  for (int k = 0; k < num_shards(); ++k) {
    pulls[k].set_sparse_only(true);
    pulls[k].set_replica(options_.replica);
    pulls[k].set_incarnation(incarnations_[k]);
    pulls[k].set_timeout_ms(absl::ToInt64Milliseconds(options_.pull_timeout));
  }
  return CallPull(pulls, nullptr, proto::DT_FLOAT, nullptr, features,
                  /*record_versions=*/false)
      .status();
}

void PsClient::SplitIds(const SparseFeatures& features) {
  for (ShardIds& shard : shard_ids_) {
    shard.ids.clear();
    shard.positions.clear();
  }
  const std::vector<uint64_t>& unique = features.unique.unique;
  for (size_t u = 0; u < unique.size(); ++u) {
    ShardIds& shard = shard_ids_[TableShardOf(unique[u], num_shards())];
    shard.ids.push_back(unique[u]);
    shard.positions.push_back(static_cast<int32_t>(u));
  }
}

void PsClient::AddSparseIds(int k, proto::PullRequest* pull) const {
  const std::vector<uint64_t>& ids = shard_ids_[k].ids;
  if (ids.empty()) return;
  for (const proto::TableMeta& table : options_.tables) {
    proto::SparseIds* asked = pull->add_sparse();
    asked->set_table(table.name());
    asked->mutable_ids()->Add(ids.begin(), ids.end());
  }
}

absl::Status PsClient::ReadRows(int k, const proto::PullHeader& header, uint64_t dense_bytes,
                                ShardReply& reply, SparseFeatures* features) {
  ShardIds& shard = shard_ids_[k];
  const int64_t n = static_cast<int64_t>(shard.ids.size());
  const int expected_segments = n == 0 ? 0 : static_cast<int>(options_.tables.size());
  if (header.sparse_size() != expected_segments) {
    return absl::InternalError(absl::StrCat("pull reply carries ", header.sparse_size(),
                                            " tables' rows, want ", expected_segments));
  }
  uint64_t offset = dense_bytes;
  for (int t = 0; t < expected_segments; ++t) {
    const proto::TableMeta& table = options_.tables[t];
    if (header.sparse(t).table() != table.name() || header.sparse(t).num_ids() != n) {
      return absl::InternalError(absl::StrCat(
          "pull reply carries ", header.sparse(t).num_ids(), " rows of table \"",
          header.sparse(t).table(), "\", want ", n, " of \"", table.name(), "\""));
    }
    const size_t floats = static_cast<size_t>(n) * table.dim();
    shard.rows.resize(floats);
    const absl::Span<char> into(reinterpret_cast<char*>(shard.rows.data()),
                                floats * sizeof(float));
    if (const ByteSource* in_memory = reply.in_memory(); in_memory != nullptr) {
      in_memory->ReadAt(offset, into);
    } else {
      RETURN_IF_ERROR(reply.ReadData(into));
    }
    offset += into.size();
    Tensor& rows = features->rows[t];
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(shard.rows.data() + i * table.dim(), table.dim(),
                  rows.data() + int64_t{shard.positions[i]} * table.dim());
    }
  }
  return absl::OkStatus();
}

void PsClient::AddSparseGradients(int k, const SparseFeatures& features,
                                  proto::PushHeader* header,
                                  std::vector<absl::Span<const char>>* pieces) {
  ShardIds& shard = shard_ids_[k];
  const int64_t n = static_cast<int64_t>(shard.ids.size());
  if (n == 0) return;
  CHECK_EQ(features.grads.size(), options_.tables.size()) << "one gradient tensor per table";
  for (size_t t = 0; t < options_.tables.size(); ++t) {
    const int dim = options_.tables[t].dim();
    CHECK_EQ(features.grads[t].num_elements(),
             static_cast<int64_t>(features.unique.unique.size()) * dim)
        << "table " << options_.tables[t].name() << ": gradient rows of another shape";
    std::vector<float>& rows = shard.grads[t];
    rows.resize(static_cast<size_t>(n) * dim);
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(features.grads[t].data() + int64_t{shard.positions[i]} * dim, dim,
                  rows.data() + i * dim);
    }
    proto::SparseSegment* segment = header->add_sparse();
    segment->set_table(options_.tables[t].name());
    segment->set_num_ids(n);
    pieces->emplace_back(reinterpret_cast<const char*>(shard.ids.data()), n * sizeof(uint64_t));
    pieces->emplace_back(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(float));
  }
}

}  // namespace psrt
