#include "worker/input/image_records.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/status_macros.h"
#include "common/tfrecord.h"
#include "glog/logging.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "proto/example.pb.h"

namespace psrt {
namespace {

using FeatureMap = google::protobuf::Map<std::string, tf::Feature>;

absl::Status Missing(const FeatureMap& features, absl::string_view name) {
  std::vector<std::string> present;
  for (const auto& [key, value] : features) present.push_back(key);
  std::sort(present.begin(), present.end());
  return absl::InvalidArgumentError(absl::StrCat(
      "missing feature \"", name, "\" (present: ",
      present.empty() ? "none" : absl::StrJoin(present, ", "), ")"));
}

// The single bytes value of `name`; `required` false: "" when absent.
absl::StatusOr<std::string> GetBytes(FeatureMap* features, absl::string_view name,
                                     bool required) {
  auto it = features->find(std::string(name));
  if (it == features->end()) {
    if (required) return Missing(*features, name);
    return std::string();
  }
  if (it->second.kind_case() != tf::Feature::kBytesList ||
      it->second.bytes_list().value_size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("feature \"", name, "\" is not a bytes_list of one value"));
  }
  // Moved out: the encoded image is the bulk of the record.
  return std::move(*it->second.mutable_bytes_list()->mutable_value(0));
}

absl::StatusOr<int64_t> GetInt64(const FeatureMap& features, absl::string_view name,
                                 bool required) {
  auto it = features.find(std::string(name));
  if (it == features.end()) {
    if (required) return Missing(features, name);
    return 0;
  }
  if (it->second.kind_case() != tf::Feature::kInt64List ||
      it->second.int64_list().value_size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("feature \"", name, "\" is not an int64_list of one value"));
  }
  return it->second.int64_list().value(0);
}

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
  FeatureMap* features = example.mutable_features()->mutable_feature();
  ImageRecord r;
  ASSIGN_OR_RETURN(r.encoded, GetBytes(features, kImageEncodedFeature, true));
  ASSIGN_OR_RETURN(r.label, GetInt64(*features, "image/class/label", true));
  ASSIGN_OR_RETURN(r.format, GetBytes(features, "image/format", false));
  ASSIGN_OR_RETURN(r.text, GetBytes(features, "image/class/text", false));
  ASSIGN_OR_RETURN(r.filename, GetBytes(features, "image/filename", false));
  ASSIGN_OR_RETURN(r.colorspace, GetBytes(features, "image/colorspace", false));
  ASSIGN_OR_RETURN(r.height, GetInt64(*features, "image/height", false));
  ASSIGN_OR_RETURN(r.width, GetInt64(*features, "image/width", false));
  ASSIGN_OR_RETURN(r.channels, GetInt64(*features, "image/channels", false));
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

ScopedFd& ScopedFd::operator=(ScopedFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) ::close(fd_);
}

std::string ImageShard::Where(int64_t i) const {
  return absl::StrCat(files[file_index[i]], ": record ", record[i]);
}

absl::Status ImageShard::Read(int64_t i, std::string* scratch, absl::string_view* bytes) const {
  const int32_t f = file_index[i];
  if (static_cast<size_t>(f) >= fds.size() || fds[f].get() < 0) {
    *bytes = encoded[i];
    return absl::OkStatus();
  }
  // The whole record: header, data and footer (common/tfrecord.h).
  const int64_t n = kTFRecordHeaderBytes + length[i] + kTFRecordFooterBytes;
  scratch->resize(n);
  int64_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fds[f].get(), scratch->data() + done, n - done, offset[i] + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::DataLossError(absl::StrCat(
          "reading ", n, " bytes at byte offset ", offset[i], ": ",
          got < 0 ? std::strerror(errno) : "the file is shorter than when it was indexed"));
    }
    done += got;
  }
  uint64_t stored_length;
  uint32_t stored_crc;
  std::memcpy(&stored_length, scratch->data(), 8);  // Little-endian hosts.
  std::memcpy(&stored_crc, scratch->data() + kTFRecordHeaderBytes + length[i], 4);
  const absl::string_view data(scratch->data() + kTFRecordHeaderBytes, length[i]);
  if (static_cast<int64_t>(stored_length) != length[i] ||
      crc32c::Unmask(stored_crc) != crc32c::Value(data)) {
    return absl::DataLossError(absl::StrCat(
        "the record at byte offset ", offset[i], " changed since it was indexed (its length "
        "or data checksum does not match)"));
  }
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
    shard.fds.emplace_back();
    struct stat st;
    if (!options.in_memory && ::stat(files[f].c_str(), &st) == 0 && st.st_size == offset) {
      ScopedFd fd(::open(files[f].c_str(), O_RDONLY | O_CLOEXEC));
      if (fd.get() >= 0) {
        shard.fds.back() = std::move(fd);
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
