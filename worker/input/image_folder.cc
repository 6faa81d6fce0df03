#include "worker/input/image_folder.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file_system.h"
#include "common/status_macros.h"
#include "common/tfrecord.h"
#include "worker/input/image_decoder.h"
#include "worker/input/image_preprocess.h"
#include "worker/input/image_records.h"

namespace psrt {
namespace {

namespace fs = std::filesystem;

struct Source {
  std::string path;
  int class_index = 0;
};

bool IsImageName(const fs::path& path) {
  const std::string ext = absl::AsciiStrToLower(path.extension().string());
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// One output file: sources [begin, end).
struct Shard {
  std::string path;
  size_t begin = 0, end = 0;
};

// Writes one shard as a TFRecord file; counts its PNGs in *png. A bad
// image fails it, or with `skipped` is left out and added there.
absl::Status WriteShard(const std::vector<Source>& sources, const Shard& shard,
                        const std::vector<std::string>& classes, int64_t* png,
                        std::vector<std::string>* skipped) {
  const size_t begin = shard.begin, end = shard.end;
  const std::string& path = shard.path;
  const std::string tmp = path + ".tmp";
  ASSIGN_OR_RETURN(std::unique_ptr<TFRecordWriter> writer, TFRecordWriter::Open(tmp));
  Image image;
  for (size_t i = begin; i < end; ++i) {
    const Source& source = sources[i];
    ImageRecord record;
    absl::StatusOr<std::string> bytes = FileSystem::Default()->ReadFile(source.path);
    absl::Status decoded = bytes.ok() ? DecodeImage(*bytes, 0, &image) : bytes.status();
    if (!decoded.ok()) {
      const std::string why = bytes.ok()
                                  ? absl::StrCat(source.path, ": ", decoded.message())
                                  : std::string(decoded.message());  // Names the file already.
      if (skipped == nullptr) return absl::InvalidArgumentError(why);
      skipped->push_back(why);
      continue;
    }
    record.encoded = *std::move(bytes);
    const ImageFormat format = DetectImageFormat(record.encoded);
    record.format = format == ImageFormat::kPng ? "PNG" : "JPEG";
    *png += format == ImageFormat::kPng;
    record.height = image.height;
    record.width = image.width;
    record.channels = image.channels;
    record.colorspace = image.channels == 3 ? "RGB" : "Grayscale";
    record.label = source.class_index + 1;
    record.text = classes[source.class_index];
    record.filename = fs::path(source.path).filename().string();
    RETURN_IF_ERROR(writer->Write(SerializeImageExample(record)));
  }
  RETURN_IF_ERROR(writer->Close());
  std::error_code error;
  fs::rename(tmp, path, error);
  if (error) return absl::InternalError(absl::StrCat("rename ", tmp, ": ", error.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImageFolderSummary> ConvertImageFolder(const ImageFolderOptions& options) {
  if (options.in_dir.empty() || options.out_dir.empty()) {
    return absl::InvalidArgumentError("both an input and an output folder are required");
  }
  if (options.train_shards < 1 || options.validation_shards < 1 || options.validation_percent < 0 ||
      options.validation_percent >= 100) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shards must be >= 1 and validation_percent in [0, 100) (got ", options.train_shards, ", ",
        options.validation_shards, ", ", options.validation_percent, ")"));
  }
  std::error_code error;
  if (!fs::is_directory(options.in_dir, error)) {
    return absl::NotFoundError(absl::StrCat(options.in_dir, " is not a folder"));
  }
  ImageFolderSummary summary;
  for (const fs::directory_entry& entry : fs::directory_iterator(options.in_dir, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && !name.empty() && name[0] != '.') summary.classes.push_back(name);
  }
  if (error) return absl::InternalError(absl::StrCat(options.in_dir, ": ", error.message()));
  std::sort(summary.classes.begin(), summary.classes.end());
  if (summary.classes.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        options.in_dir, " holds no class folder (expected one subfolder of images per class)"));
  }
  std::vector<Source> sources;
  for (size_t k = 0; k < summary.classes.size(); ++k) {
    const fs::path class_dir = fs::path(options.in_dir) / summary.classes[k];
    std::vector<std::string> files;
    for (const fs::directory_entry& entry : fs::directory_iterator(class_dir, error)) {
      if (entry.is_regular_file() && IsImageName(entry.path())) {
        files.push_back(entry.path().string());
      }
    }
    if (error) return absl::InternalError(absl::StrCat(class_dir.string(), ": ", error.message()));
    if (files.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(class_dir.string(), " holds no .jpg, .jpeg or .png image"));
    }
    std::sort(files.begin(), files.end());
    for (std::string& f : files) sources.push_back({std::move(f), static_cast<int>(k)});
  }
  // Fisher-Yates from the seed, so shards mix the classes and reruns agree.
  ExampleRng rng(options.seed, 0, 0);
  for (size_t i = sources.size() - 1; i > 0; --i) {
    std::swap(sources[i], sources[rng.UniformInt(static_cast<int64_t>(i) + 1)]);
  }
  const size_t validation = static_cast<size_t>(sources.size() * options.validation_percent / 100);
  const size_t train = sources.size() - validation;
  if (train < static_cast<size_t>(options.train_shards) ||
      (validation > 0 && validation < static_cast<size_t>(options.validation_shards))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "too few images (", train, " train, ", validation, " validation) for ",
        options.train_shards, " train and ", options.validation_shards, " validation shards"));
  }
  fs::create_directories(options.out_dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", options.out_dir, ": ", error.message()));
  }
  // [begin, begin + count) as `shards` consecutive files.
  std::vector<Shard> shards;
  auto split = [&](const std::string& name, size_t begin, size_t count, int n) {
    for (int s = 0; s < n; ++s) {
      shards.push_back({absl::StrFormat("%s/%s-%05d-of-%05d", options.out_dir, name, s, n),
                        begin + count * s / n, begin + count * (s + 1) / n});
    }
  };
  split("train", 0, train, options.train_shards);
  if (validation > 0) split("validation", train, validation, options.validation_shards);
  // Shards on `threads` threads, each taking the next shard; the first
  // failed shard's error is returned.
  std::vector<absl::Status> status(shards.size());
  std::vector<int64_t> png(shards.size(), 0);
  std::vector<std::vector<std::string>> skipped(shards.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t s; (s = next.fetch_add(1)) < shards.size();) {
      status[s] = WriteShard(sources, shards[s], summary.classes, &png[s],
                             options.skip_bad ? &skipped[s] : nullptr);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < std::min<int>(options.threads, static_cast<int>(shards.size())); ++t) {
    threads.emplace_back(work);
  }
  work();
  for (std::thread& t : threads) t.join();
  int64_t skipped_train = 0, skipped_validation = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    RETURN_IF_ERROR(status[s]);
    summary.files.push_back(shards[s].path);
    summary.png_examples += png[s];
    (shards[s].begin < train ? skipped_train : skipped_validation) +=
        static_cast<int64_t>(skipped[s].size());
    summary.skipped.insert(summary.skipped.end(), skipped[s].begin(), skipped[s].end());
  }
  summary.train_examples = static_cast<int64_t>(train) - skipped_train;
  summary.validation_examples = static_cast<int64_t>(validation) - skipped_validation;
  if (options.skip_bad) {
    const std::string list = options.out_dir + "/skipped.txt";
    std::ofstream out(list);
    for (const std::string& line : summary.skipped) out << line << "\n";
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", list));
  }
  const std::string labels = options.out_dir + "/labels.txt";
  std::ofstream out(labels);
  for (const std::string& c : summary.classes) out << c << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", labels));
  return summary;
}

}  // namespace psrt
