#include "worker/input/tfrecord_dataset.h"

#include <dirent.h>
#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "proto/example.pb.h"
#include "worker/input/example_features.h"

namespace psrt {
namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    const int err = errno;
    return absl::Status(absl::ErrnoToStatusCode(err),
                        absl::StrCat(dir, ": cannot list: ", std::strerror(err)));
  }
  std::vector<std::string> files;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name[0] == '.' || absl::EndsWith(name, ".tmp")) continue;
    const std::string path = JoinPath(dir, name);
    if (IsRegularFile(path)) files.push_back(path);
  }
  ::closedir(d);
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern) {
  glob_t g;
  const int ret = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> files;
  if (ret == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      if (IsRegularFile(g.gl_pathv[i])) files.push_back(g.gl_pathv[i]);
    }
  }
  ::globfree(&g);
  if (ret != 0 && ret != GLOB_NOMATCH) {
    return absl::InternalError(absl::StrCat("glob ", pattern, " failed"));
  }
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrCat("data pattern ", pattern, " matches no file"));
  }
  return files;  // glob(3) sorts.
}

// Reads Examples into one growing pixel buffer and label list, checking
// each record against the first one's shape.
class ExampleDecoder {
 public:
  explicit ExampleDecoder(int num_classes) : num_classes_(num_classes) {}

  absl::Status Decode(const std::string& file, int64_t index,
                      const std::string& record);
  Dataset Finish();
  int64_t size() const { return static_cast<int64_t>(labels_.size()); }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(file_, ": record ", index_, ": ", what));
  }
  // A feature reader's error, with the file and record.
  absl::Status Error(const absl::Status& status) const { return Error(status.message()); }
  absl::StatusOr<std::pair<int64_t, int64_t>> Shape(size_t num_bytes) const;

  const int num_classes_;
  tf::Example example_;
  ExampleFeatures features_{&example_};
  std::string file_;  // Of the record being decoded, for messages.
  int64_t index_ = 0;
  int64_t rows_ = 0, cols_ = 0;  // Fixed by the first record.
  std::string first_;  // Where rows_ x cols_ came from.
  std::string pixels_;
  std::vector<int32_t> labels_;
};

// Raw pixels are needed; say so when image_raw holds an encoded image.
std::string EncodedImageHint(const std::string& raw) {
  if (absl::StartsWith(raw, "\x89PNG") || absl::StartsWith(raw, "\xff\xd8\xff")) {
    return " (image_raw looks like an encoded PNG/JPEG image; psrt reads raw "
           "uint8 pixels)";
  }
  return "";
}

// rows x cols of this record's image of `num_bytes` pixels.
absl::StatusOr<std::pair<int64_t, int64_t>> ExampleDecoder::Shape(
    size_t num_bytes) const {
  auto get = [this](absl::string_view name) -> absl::StatusOr<std::optional<int64_t>> {
    absl::StatusOr<std::optional<int64_t>> value = features_.Int64(name);
    if (!value.ok()) return Error(value.status());
    return value;
  };
  ASSIGN_OR_RETURN(const std::optional<int64_t> height, get("height"));
  ASSIGN_OR_RETURN(const std::optional<int64_t> width, get("width"));
  ASSIGN_OR_RETURN(const std::optional<int64_t> depth, get("depth"));
  ASSIGN_OR_RETURN(const std::optional<int64_t> pixels, get("pixels"));
  if (depth.has_value() && *depth != 1) {
    return Error(absl::StrCat("depth ", *depth,
                              ": only single-channel images are supported"));
  }
  if (height.has_value() != width.has_value()) {
    return Error(features_.Missing(height.has_value() ? "width" : "height"));
  }
  const int64_t n = static_cast<int64_t>(num_bytes);
  if (height.has_value()) {
    if (*height <= 0 || *width <= 0 || *height > INT_MAX || *width > INT_MAX) {
      return Error(absl::StrCat("bad image size ", *height, " x ", *width));
    }
    return std::make_pair(*height, *width);
  }
  const int64_t count = pixels.value_or(n);
  if (count <= 0 || count > INT_MAX) {
    return Error(absl::StrCat("bad image size: ", count, " pixels"));
  }
  const int64_t side = std::llround(std::sqrt(static_cast<double>(count)));
  if (side * side == count) return std::make_pair(side, side);
  return std::make_pair(int64_t{1}, count);
}

absl::Status ExampleDecoder::Decode(const std::string& file, int64_t index,
                                    const std::string& record) {
  file_ = file;
  index_ = index;
  example_.Clear();
  if (!example_.ParseFromString(record)) {
    return Error(absl::StrCat("not a tf.train.Example (", record.size(),
                              " bytes that do not parse)"));
  }
  absl::StatusOr<const std::string*> image = features_.Bytes("image_raw");
  if (!image.ok()) return Error(image.status());
  if (*image == nullptr) return Error(features_.Missing("image_raw"));
  const std::string& raw = **image;
  ASSIGN_OR_RETURN(const auto shape, Shape(raw.size()));
  if (rows_ == 0) {
    rows_ = shape.first;
    cols_ = shape.second;
    first_ = absl::StrCat(file, " record ", index);
  } else if (shape.first != rows_ || shape.second != cols_) {
    return Error(absl::StrCat("image shape ", shape.first, " x ", shape.second,
                              " differs from ", rows_, " x ", cols_, " of ",
                              first_, EncodedImageHint(raw)));
  }
  if (static_cast<int64_t>(raw.size()) != rows_ * cols_) {
    return Error(absl::StrCat("image_raw has ", raw.size(), " bytes, expected ",
                              rows_ * cols_, " (", rows_, " x ", cols_, ")",
                              EncodedImageHint(raw)));
  }
  absl::StatusOr<int64_t> label = features_.RequiredInt64("label");
  if (!label.ok()) return Error(label.status());
  if (*label < 0 || *label >= num_classes_) {
    return Error(absl::StrCat("label ", *label, " is out of range for ",
                              num_classes_, " classes (must be 0..",
                              num_classes_ - 1, ")"));
  }
  pixels_.append(raw);
  labels_.push_back(static_cast<int32_t>(*label));
  return absl::OkStatus();
}

Dataset ExampleDecoder::Finish() {
  Dataset data;
  data.rows = static_cast<int>(rows_);
  data.cols = static_cast<int>(cols_);
  data.labels = std::move(labels_);
  data.images.Resize({data.size(), rows_ * cols_});
  float scale[256];
  for (int v = 0; v < 256; ++v) scale[v] = v / 255.0f;
  const auto* in = reinterpret_cast<const unsigned char*>(pixels_.data());
  float* out = data.images.data();
  for (size_t i = 0; i < pixels_.size(); ++i) out[i] = scale[in[i]];
  pixels_.clear();
  pixels_.shrink_to_fit();
  return data;
}

// One file of `data`'s examples [begin, end).
absl::Status WriteExamples(const Dataset& data, int64_t begin, int64_t end,
                           const std::string& path,
                           TFRecordCompression compression) {
  const std::string tmp = path + ".tmp";
  TFRecordWriterOptions file_options;
  file_options.compression = compression;
  ASSIGN_OR_RETURN(std::unique_ptr<TFRecordWriter> writer,
                   TFRecordWriter::Open(tmp, file_options));
  const int64_t pixels = int64_t{data.rows} * data.cols;
  tf::Example example;
  auto& features = *example.mutable_features()->mutable_feature();
  features["height"].mutable_int64_list()->add_value(data.rows);
  features["width"].mutable_int64_list()->add_value(data.cols);
  features["depth"].mutable_int64_list()->add_value(1);
  features["label"].mutable_int64_list()->add_value(0);
  std::string* raw = features["image_raw"].mutable_bytes_list()->add_value();
  raw->resize(pixels);
  std::string record;
  for (int64_t i = begin; i < end; ++i) {
    const float* image = data.images.data() + i * pixels;
    for (int64_t j = 0; j < pixels; ++j) {
      const float v = image[j] * 255.0f;
      const float rounded = std::nearbyint(v);
      if (!(rounded >= 0 && rounded <= 255 && std::fabs(v - rounded) < 1e-3f)) {
        std::remove(tmp.c_str());
        return absl::InvalidArgumentError(absl::StrFormat(
            "example %d pixel %d is %g, not a multiple of 1/255 in [0, 1]: "
            "cannot store it as a uint8 pixel",
            i, j, image[j]));
      }
      (*raw)[j] = static_cast<char>(static_cast<unsigned char>(rounded));
    }
    features["label"].mutable_int64_list()->set_value(0, data.labels[i]);
    example.SerializeToString(&record);
    absl::Status s = writer->Write(record);
    if (!s.ok()) {
      std::remove(tmp.c_str());
      return s;
    }
  }
  absl::Status s = writer->Close();
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    s = absl::Status(absl::ErrnoToStatusCode(err),
                     absl::StrCat("rename ", tmp, " to ", path, ": ",
                                  std::strerror(err)));
  }
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandDataFiles(
    const std::string& spec) {
  std::vector<std::string> files;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    const std::string path(absl::StripAsciiWhitespace(item));
    std::vector<std::string> matched;
    if (IsDirectory(path)) {
      ASSIGN_OR_RETURN(matched, ListDirectory(path));
      if (matched.empty()) {
        return absl::NotFoundError(
            absl::StrCat("data directory ", path, " holds no file"));
      }
    } else if (path.find_first_of("*?[") != std::string::npos) {
      ASSIGN_OR_RETURN(matched, Glob(path));
    } else if (IsRegularFile(path)) {
      matched = {path};
    } else {
      return absl::NotFoundError(absl::StrCat("data file ", path,
                                              ": no such file or directory"));
    }
    files.insert(files.end(), matched.begin(), matched.end());
  }
  if (files.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no data files given: \"", spec, "\""));
  }
  return files;
}

absl::StatusOr<Dataset> ReadTFRecordDataset(const std::string& spec,
                                            int num_classes) {
  if (num_classes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes must be positive, got ", num_classes));
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> files, ExpandDataFiles(spec));
  ExampleDecoder decoder(num_classes);
  std::string record;
  for (const std::string& file : files) {
    ASSIGN_OR_RETURN(std::unique_ptr<TFRecordReader> reader,
                     TFRecordReader::Open(file));
    for (;;) {
      const int64_t index = reader->records_read();
      ASSIGN_OR_RETURN(const bool more, reader->ReadRecord(&record));
      if (!more) break;
      RETURN_IF_ERROR(decoder.Decode(file, index, record));
    }
  }
  if (decoder.size() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no records in ", absl::StrJoin(files, ", "), " (from \"", spec, "\")"));
  }
  return decoder.Finish();
}

absl::Status WriteTFRecordDataset(const Dataset& data, const std::string& path,
                                  const TFRecordDatasetWriteOptions& options) {
  if (options.num_files < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_files must be at least 1, got ", options.num_files));
  }
  if (data.images.shape() != psrt::Shape{data.size(), int64_t{data.rows} * data.cols}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dataset images have shape ", ShapeToString(data.images.shape()),
        ", expected [", data.size(), ",", int64_t{data.rows} * data.cols, "]"));
  }
  if (options.num_files == 1) {
    return WriteExamples(data, 0, data.size(), path, options.compression);
  }
  const int n = options.num_files;
  for (int k = 0; k < n; ++k) {
    const std::string file = absl::StrFormat("%s-%05d-of-%05d", path, k, n);
    RETURN_IF_ERROR(WriteExamples(data, data.size() * k / n,
                                  data.size() * (k + 1) / n, file,
                                  options.compression));
  }
  return absl::OkStatus();
}

}  // namespace psrt
