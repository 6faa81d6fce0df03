#include "worker/input/image_records.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/tfrecord.h"
#include "glog/logging.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/example.pb.h"
#include "worker/input/example_features.h"

namespace psrt {
namespace {

absl::Status At(const std::string& file, int64_t record, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(file, ": record ", record, ": ", status.message()));
}

}  // namespace

absl::StatusOr<ImageRecord> ParseImageExample(absl::string_view serialized) {
  tf::Example example;
  if (!example.ParseFromArray(serialized.data(), static_cast<int>(serialized.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a tf.train.Example (", serialized.size(), " bytes)"));
  }
  ExampleFeatures features(&example);
  ImageRecord r;
  // Moved out: the encoded image is the bulk of the record.
  ASSIGN_OR_RETURN(r.encoded, features.TakeBytes(kImageEncodedFeature, true));
  ASSIGN_OR_RETURN(r.label, features.RequiredInt64("image/class/label"));
  ASSIGN_OR_RETURN(r.format, features.TakeBytes("image/format", false));
  ASSIGN_OR_RETURN(r.text, features.TakeBytes("image/class/text", false));
  ASSIGN_OR_RETURN(r.filename, features.TakeBytes("image/filename", false));
  ASSIGN_OR_RETURN(r.colorspace, features.TakeBytes("image/colorspace", false));
  ASSIGN_OR_RETURN(std::optional<int64_t> height, features.Int64("image/height"));
  ASSIGN_OR_RETURN(std::optional<int64_t> width, features.Int64("image/width"));
  ASSIGN_OR_RETURN(std::optional<int64_t> channels, features.Int64("image/channels"));
  r.height = height.value_or(0);
  r.width = width.value_or(0);
  r.channels = channels.value_or(0);
  return r;
}

std::string SerializeImageExample(const ImageRecord& r) {
  tf::Example example;
  auto& f = *example.mutable_features()->mutable_feature();
  f["image/height"].mutable_int64_list()->add_value(r.height);
  f["image/width"].mutable_int64_list()->add_value(r.width);
  f["image/colorspace"].mutable_bytes_list()->add_value(r.colorspace);
  f["image/channels"].mutable_int64_list()->add_value(r.channels);
  f["image/class/label"].mutable_int64_list()->add_value(r.label);
  f["image/class/text"].mutable_bytes_list()->add_value(r.text);
  f["image/format"].mutable_bytes_list()->add_value(r.format);
  f["image/filename"].mutable_bytes_list()->add_value(r.filename);
  f[kImageEncodedFeature].mutable_bytes_list()->add_value(r.encoded);
  // Map entries in key order, so that a converted folder is the same bytes
  // every time.
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    example.SerializeToCodedStream(&coded);
  }
  return out;
}

absl::StatusOr<bool> IsImageRecordFile(const std::string& file) {
  ASSIGN_OR_RETURN(std::unique_ptr<TFRecordReader> reader, TFRecordReader::Open(file));
  std::string record;
  ASSIGN_OR_RETURN(bool read, reader->ReadRecord(&record));
  if (!read) return absl::InvalidArgumentError(absl::StrCat(file, ": no record"));
  tf::Example example;
  if (!example.ParseFromString(record)) {
    return At(file, 0, absl::InvalidArgumentError("not a tf.train.Example"));
  }
  return example.features().feature().contains(kImageEncodedFeature);
}

std::string ImageShard::Where(int64_t i) const {
  return absl::StrCat(files[file_index[i]], ": record ", record[i]);
}

absl::Status ImageShard::Read(int64_t i, std::string* scratch, absl::string_view* bytes) const {
  const int32_t f = file_index[i];
  if (static_cast<size_t>(f) >= on_disk.size() || on_disk[f] == nullptr) {
    *bytes = encoded[i];
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const absl::string_view data,
                   ReadTFRecordAt(*on_disk[f], offset[i], length[i], scratch));
  ASSIGN_OR_RETURN(ImageRecord r, ParseImageExample(data));
  *scratch = std::move(r.encoded);
  *bytes = *scratch;
  return absl::OkStatus();
}

absl::StatusOr<ImageShard> ReadImageShard(const std::vector<std::string>& files,
                                          const ImageShardOptions& options) {
  CHECK(options.shard >= 0 && options.shard < options.num_shards);
  ImageShard shard;
  shard.sharded_by_file = static_cast<int>(files.size()) >= options.num_shards;
  if (!shard.sharded_by_file) {
    LOG(INFO) << "input: " << files.size() << " file(s) for " << options.num_shards
              << " workers: sharding by record (each worker reads every file and keeps "
                 "records i % "
              << options.num_shards << " == " << options.shard << ")";
  }
  std::string serialized;
  int64_t global = 0;  // Record number across the files.
  for (size_t f = 0; f < files.size(); ++f) {
    if (shard.sharded_by_file && static_cast<int>(f % options.num_shards) != options.shard) {
      continue;
    }
    const int32_t file_index = static_cast<int32_t>(shard.files.size());
    shard.files.push_back(files[f]);
    ASSIGN_OR_RETURN(std::unique_ptr<TFRecordReader> reader, TFRecordReader::Open(files[f]));
    const size_t first = shard.encoded.size();
    int64_t offset = 0;  // Of the record, in a plain file.
    for (int64_t k = 0;; ++k, ++global) {
      ASSIGN_OR_RETURN(bool read, reader->ReadRecord(&serialized));
      if (!read) break;
      const int64_t record_offset = offset;
      offset += kTFRecordHeaderBytes + static_cast<int64_t>(serialized.size()) +
                kTFRecordFooterBytes;
      if (!shard.sharded_by_file && global % options.num_shards != options.shard) continue;
      absl::StatusOr<ImageRecord> r = ParseImageExample(serialized);
      if (!r.ok()) return At(files[f], k, r.status());
      const int64_t label = r->label - options.label_offset;
      if (label < 0 || label >= options.num_classes) {
        return At(files[f], k, absl::InvalidArgumentError(absl::StrCat(
                                   "label ", r->label, " - label_offset ",
                                   options.label_offset, " = ", label, " is outside [0, ",
                                   options.num_classes, ")")));
      }
      shard.encoded.push_back(std::move(r->encoded));
      shard.labels.push_back(static_cast<int32_t>(label));
      shard.file_index.push_back(file_index);
      shard.record.push_back(k);
      shard.offset.push_back(record_offset);
      shard.length.push_back(static_cast<int64_t>(serialized.size()));
    }
    // A plain file (its records add up to its size; a gzip file's do not)
    // can keep its images: they are read back by offset.
    shard.on_disk.emplace_back();
    FileSystem* fs = FileSystem::Default();
    if (!options.in_memory) {
      absl::StatusOr<int64_t> size = fs->FileSize(files[f]);
      absl::StatusOr<std::unique_ptr<RandomAccessFile>> file =
          size.ok() && *size == offset ? fs->OpenRandomAccess(files[f])
                                       : absl::StatusOr<std::unique_ptr<RandomAccessFile>>(nullptr);
      if (file.ok() && *file != nullptr) {
        shard.on_disk.back() = *std::move(file);
        for (size_t i = first; i < shard.encoded.size(); ++i) std::string().swap(shard.encoded[i]);
      }
    }
  }
  if (shard.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", options.shard, " of ", options.num_shards, " holds no image record (",
        files.size(), " file(s): ", absl::StrJoin(files, ", "), ")"));
  }
  return shard;
}

}  // namespace psrt
