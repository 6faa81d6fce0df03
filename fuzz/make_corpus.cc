// Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/), each
// a small valid input made by psrt's own writers, so that the seeds follow
// the formats as the code writes them:
//
//   build/bin/fuzz_make_corpus fuzz/corpus
//
// The output is committed; rerun this after a format changes. It is the
// same on every run up to the order of protobuf map entries (the TFRecord
// Examples). Each target's input layout is described in its *_fuzzer.cc.
#include <sys/stat.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "common/tensor_frame.h"
#include "common/training_config.h"
#include "dataplane/frame.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "proto/psrt.pb.h"
#include "ps/parameter_shard.h"
#include "worker/input/idx_dataset.h"
#include "worker/input/image_decoder.h"
#include "worker/input/image_records.h"
#include "worker/input/synthetic_images.h"
#include "worker/input/tfrecord_dataset.h"

namespace psrt {
namespace fuzz {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  CHECK(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class Corpus {
 public:
  explicit Corpus(std::string root) : root_(std::move(root)) {
    ::mkdir(root_.c_str(), 0755);
  }
  void Add(const std::string& target, const std::string& name,
           const std::string& bytes) {
    const std::string dir = absl::StrCat(root_, "/", target);
    ::mkdir(dir.c_str(), 0755);
    const std::string path = absl::StrCat(dir, "/", name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size());
    CHECK(out.good()) << path;
    std::printf("%s (%zu bytes)\n", path.c_str(), bytes.size());
  }

 private:
  const std::string root_;
};

// The same file without its psrt checksum (read as a third-party file), so
// that mutations of it reach past the checksum.
std::string WithoutChecksum(const std::string& safetensors) {
  return absl::StrReplaceAll(safetensors, {{"\"psrt_crc32\"", "\"psrt_crc00\""}});
}

std::string Gzip(const std::string& bytes) {
  z_stream zs{};
  CHECK_EQ(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, bytes.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  zs.avail_in = bytes.size();
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = out.size();
  CHECK_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string Frame(const google::protobuf::MessageLite& header,
                  const std::vector<float>& values) {
  grpc::ByteBuffer buffer = EncodeTensorFrame(
      header, {{reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)}});
  std::vector<grpc::Slice> slices;
  CHECK(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

void AddClusterSpecs(Corpus* corpus) {
  corpus->Add("cluster_spec", "spec.json",
              R"({"ps": ["10.0.0.1:2222", "10.0.0.2:2222"], "worker": ["host-a:2223"]})");
  corpus->Add("cluster_spec", "tf_config.json",
              R"({"cluster": {"chief": ["[::1]:2000"], "ps": ["localhost:2001"],)"
              R"( "worker": ["127.0.0.1:2002"], "evaluator": ["e:1"]},)"
              R"( "task": {"type": "worker", "index": 0}, "environment": "cloud"})");
}

// 3 images of 2 x 2 pixels and their labels.
Dataset SmallDataset() {
  Dataset data;
  data.rows = 2;
  data.cols = 2;
  data.labels = {0, 9, 3};
  data.images.Resize({3, 4});
  for (int i = 0; i < 12; ++i) data.images.data()[i] = (i * 20) / 255.0f;
  return data;
}

void AddIdx(Corpus* corpus) {
  std::string images("\x00\x00\x08\x03" "\x00\x00\x00\x03" "\x00\x00\x00\x02"
                     "\x00\x00\x00\x02", 16);
  for (int i = 0; i < 12; ++i) images.push_back(static_cast<char>(i * 20));
  std::string labels("\x00\x00\x08\x01" "\x00\x00\x00\x03", 8);
  labels += std::string("\x00\x09\x03", 3);
  const char num_classes = 8 + 10;
  std::string plain(1, num_classes);
  AppendChunk(images, &plain);
  corpus->Add("idx", "plain", plain + labels);
  std::string gzip(1, num_classes);
  AppendChunk(Gzip(images), &gzip);
  corpus->Add("idx", "gzip", gzip + Gzip(labels));
}

void AddTFRecords(Corpus* corpus) {
  const std::string path = ScratchDir() + "/seed.tfrecord";
  for (auto [name, compression] : {std::pair{"plain", TFRecordCompression::kNone},
                                   std::pair{"gzip", TFRecordCompression::kGzip}}) {
    TFRecordDatasetWriteOptions options;
    options.compression = compression;
    CHECK(WriteTFRecordDataset(SmallDataset(), path, options).ok());
    corpus->Add("tfrecord", name, ReadFile(path));
  }
}

// Small JPEGs (color and gray), a PNG and a build_image_data.py Example.
void AddImages(Corpus* corpus) {
  const Image color = SyntheticImage(1, 4, 12, 10, 1);
  Image gray = color;
  gray.channels = 1;
  gray.pixels.resize(size_t{12} * 10);
  corpus->Add("image", "color.jpg", *EncodeJpeg(color, 75));
  corpus->Add("image", "gray.jpg", *EncodeJpeg(gray, 75));
  corpus->Add("image", "color.png", *EncodePng(color));
  ImageRecord record;
  record.encoded = *EncodeJpeg(gray, 50);
  record.label = 3;
  record.format = "JPEG";
  record.text = "class_02";
  record.height = 12;
  record.width = 10;
  record.channels = 1;
  corpus->Add("image", "example", SerializeImageExample(record));
}

proto::TrainingConfig Config(proto::SyncMode mode, proto::OptimizerType optimizer) {
  proto::TrainingConfig config;
  config.set_mode(mode);
  config.set_num_replicas(2);
  config.set_replicas_to_aggregate(mode == proto::SYNC ? 2 : 0);
  config.set_optimizer(optimizer);
  config.set_learning_rate(0.1f);
  config.set_momentum(0.9f);
  config.set_moving_average_decay(mode == proto::ASYNC ? 0.99f : 0);
  return config;
}

proto::InitHeader Model(const proto::TrainingConfig& config) {
  proto::InitHeader init;
  *init.mutable_config() = config;
  for (auto [name, shape] : {std::pair{"fc/w", Shape{2, 3}}, std::pair{"fc/b", Shape{3}}}) {
    proto::VariableMeta* meta = init.add_variables();
    meta->set_name(name);
    meta->set_dtype(proto::DT_FLOAT);
    for (int64_t d : shape) meta->add_shape(d);
  }
  return init;
}

proto::PushHeader PushOf(const proto::InitHeader& init, int replica, int64_t version) {
  proto::PushHeader push;
  push.set_replica(replica);
  push.set_version(version);
  *push.mutable_variables() = init.variables();
  return push;
}

const std::vector<float> kValues = {1, 2, 3, 4, 5, 6, 0.5f, -0.5f, 0};
const std::vector<float> kGradient = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 1, 1, 1};

void AddSafetensorsAndCheckpoints(Corpus* corpus) {
  const std::string file = ScratchDir() + "/seed.safetensors";
  Tensor a({2, 2});
  Tensor b({3});
  for (int i = 0; i < 4; ++i) a.data()[i] = i - 1.5f;
  CHECK(WriteSafetensors(file, {{"layer/w", &a}, {"layer/b", &b}}, {{"step", "12"}}).ok());
  corpus->Add("safetensors", "two_tensors", ReadFile(file));
  corpus->Add("safetensors", "no_checksum", WithoutChecksum(ReadFile(file)));
  const std::vector<int64_t> ids = {5, -1};
  const std::vector<uint64_t> unsigned_ids = {7};
  CHECK(WriteSafetensors(file, {{"emb/ids", {2}, ids.data()},
                                {"emb/values", &a},
                                {"wide/ids", {1}, unsigned_ids.data()}})
            .ok());
  corpus->Add("safetensors", "integer_ids", ReadFile(file));

  // A shard checkpoint at step 7 (the name the checkpoint target writes),
  // with momentum slots and, in async mode, moving averages.
  for (auto [name, mode] : {std::pair{"sync_momentum", proto::SYNC},
                            std::pair{"async_average", proto::ASYNC}}) {
    ClearScratchDir();
    ParameterShard::Options options;
    options.threads = 1;
    options.checkpoint_dir = ScratchDir();
    ParameterShard shard(options);
    const proto::InitHeader init = Model(Config(mode, proto::MOMENTUM));
    SpanByteSource values({reinterpret_cast<const char*>(kValues.data()),
                           kValues.size() * sizeof(float)});
    CHECK(shard.Init(init, &values).ok());
    SpanByteSource gradient({reinterpret_cast<const char*>(kGradient.data()),
                             kGradient.size() * sizeof(float)});
    CHECK(shard.Push(PushOf(init, 0, 0), &gradient).ok());
    CHECK(shard.Push(PushOf(init, 1, 0), &gradient).ok());
    absl::StatusOr<std::string> path = shard.Save(7, -1, 1);
    CHECK(path.ok()) << path.status();
    std::string input;
    AppendChunk(ReadFile(ScratchDir() + "/checkpoint.ps-0-of-1"), &input);
    corpus->Add("checkpoint", name, input + ReadFile(*path));
    corpus->Add("checkpoint", absl::StrCat(name, "_no_checksum"),
                input + WithoutChecksum(ReadFile(*path)));
    if (mode == proto::SYNC) {
      // Regression: a negative dimension crashed the restore.
      corpus->Add("checkpoint", "regression_negative_shape",
                  input + absl::StrReplaceAll(WithoutChecksum(ReadFile(*path)),
                                              {{"shape: 2", "shape:-2"}}));
    }
  }
}

// A shard checkpoint at step 7 with an embedding table: Adagrad rows of
// ids pushed by two replicas (the table's ids, values and slot).
void AddTableCheckpoint(Corpus* corpus) {
  ClearScratchDir();
  ParameterShard::Options options;
  options.threads = 1;
  options.checkpoint_dir = ScratchDir();
  ParameterShard shard(options);
  proto::TrainingConfig config = Config(proto::SYNC, proto::ADAGRAD);
  SetOptimizerDefaults(&config);
  proto::InitHeader init = Model(config);
  proto::TableMeta* table = init.add_tables();
  table->set_name("emb");
  table->set_dim(2);
  table->set_seed(3);
  SpanByteSource values({reinterpret_cast<const char*>(kValues.data()),
                         kValues.size() * sizeof(float)});
  CHECK(shard.Init(init, &values).ok());
  for (int replica = 0; replica < 2; ++replica) {
    proto::PushHeader push = PushOf(init, replica, 0);
    proto::SparseSegment* segment = push.add_sparse();
    segment->set_table("emb");
    segment->set_num_ids(2);
    const uint64_t ids[2] = {static_cast<uint64_t>(5 + replica), uint64_t{1} << 63};
    const float rows[4] = {0.5f, -0.5f, 1, 2};
    std::string bytes(reinterpret_cast<const char*>(kGradient.data()),
                      kGradient.size() * sizeof(float));
    bytes.append(reinterpret_cast<const char*>(ids), sizeof(ids));
    bytes.append(reinterpret_cast<const char*>(rows), sizeof(rows));
    SpanByteSource data(absl::MakeConstSpan(bytes));
    CHECK(shard.Push(push, &data).ok());
  }
  absl::StatusOr<std::string> path = shard.Save(7, -1, 1);
  CHECK(path.ok()) << path.status();
  std::string input;
  AppendChunk(ReadFile(ScratchDir() + "/checkpoint.ps-0-of-1"), &input);
  corpus->Add("checkpoint", "sync_adagrad_table", input + ReadFile(*path));
}

void AddFrames(Corpus* corpus) {
  const proto::InitHeader init = Model(Config(proto::SYNC, proto::SGD));
  std::string push;
  push.push_back(0);  // One slice.
  push.push_back(0);  // A PushHeader.
  corpus->Add("tensor_frame", "push", push + Frame(PushOf(init, 1, 4), kGradient));
  std::string sliced_init;
  sliced_init.push_back(5);  // Slices of 5 bytes.
  sliced_init.push_back(1);  // An InitHeader.
  corpus->Add("tensor_frame", "init_sliced", sliced_init + Frame(init, kValues));
}

// One request of the ps_requests target.
// Data-plane streams: a push request with metadata and data, a pull reply,
// an error reply, then frames after one another.
std::string DataplaneFrame(const dataplane::FrameHeader& fields, const std::string& meta,
                           const std::string& data) {
  dataplane::FrameHeader header = fields;
  header.meta_size = meta.size();
  header.data_size = data.size();
  char encoded[dataplane::kFrameHeaderBytes];
  dataplane::EncodeFrameHeader(header, encoded);
  return std::string(encoded, sizeof(encoded)) + meta + data;
}

void AddDataplaneFrames(Corpus* corpus) {
  const std::string limit(1, static_cast<char>(20));  // 1 MiB of data at most.
  dataplane::FrameHeader push;
  push.kind = dataplane::FrameKind::kRequest;
  push.method = dataplane::FrameMethod::kPush;
  push.stripe = 1;
  push.request_id = 7;
  const std::string push_frame = DataplaneFrame(push, "push-header", std::string(4000, '\x3f'));
  dataplane::FrameHeader pull = push;
  pull.kind = dataplane::FrameKind::kReply;
  pull.method = dataplane::FrameMethod::kPull;
  const std::string pull_frame = DataplaneFrame(pull, "pull-header", std::string(2048, '\x01'));
  dataplane::FrameHeader error = pull;
  error.status = static_cast<uint32_t>(absl::StatusCode::kAborted);
  const std::string error_frame = DataplaneFrame(error, "the shard restarted", "");
  dataplane::FrameHeader hello;
  hello.kind = dataplane::FrameKind::kHello;
  const std::string hello_frame = DataplaneFrame(hello, "token", "");
  corpus->Add("dataplane_frame", "push", limit + push_frame);
  corpus->Add("dataplane_frame", "pull_reply", limit + pull_frame);
  corpus->Add("dataplane_frame", "session",
              limit + hello_frame + push_frame + error_frame + pull_frame);
}

void AddRequest(int method, int piece, const std::string& bytes, std::string* out) {
  out->push_back(static_cast<char>(piece * 8 + method));
  AppendChunk(bytes, out);
}

void AddSessions(Corpus* corpus) {
  enum { kInit, kPush, kPull, kSave, kRestore, kShutdown, kStatus, kRestoreLatest };
  for (auto [name, mode, optimizer] :
       {std::tuple{"sync_sgd", proto::SYNC, proto::SGD},
        std::tuple{"async_momentum_average", proto::ASYNC, proto::MOMENTUM}}) {
    const proto::InitHeader init = Model(Config(mode, optimizer));
    const int64_t next = mode == proto::SYNC ? 1 : 2;  // Version after 2 pushes.
    proto::PullRequest pull;
    pull.set_min_version(next);
    pull.set_moving_average(mode == proto::ASYNC);
    proto::SaveRequest save;
    save.set_step(10);
    save.set_version(next);
    save.set_keep(2);
    proto::RestoreRequest restore;
    restore.set_step(10);
    proto::ShutdownRequest shutdown;
    shutdown.set_replica(0);

    std::string session;
    AddRequest(kInit, 0, Frame(init, kValues), &session);
    AddRequest(kPush, 3, Frame(PushOf(init, 0, 0), kGradient), &session);
    AddRequest(kPush, 0, Frame(PushOf(init, 1, 0), kGradient), &session);
    AddRequest(kPull, 0, pull.SerializeAsString(), &session);
    AddRequest(kSave, 0, save.SerializeAsString(), &session);
    AddRequest(kPush, 0, Frame(PushOf(init, 1, next), kGradient), &session);
    AddRequest(kRestore, 0, restore.SerializeAsString(), &session);
    AddRequest(kStatus, 0, "", &session);
    AddRequest(kShutdown, 0, shutdown.SerializeAsString(), &session);
    AddRequest(kRestoreLatest, 0, "", &session);
    corpus->Add("ps_requests", name, session);
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace psrt

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT (e.g. fuzz/corpus)\n", argv[0]);
    return 2;
  }
  psrt::fuzz::InitOnce();
  psrt::fuzz::Corpus corpus(argv[1]);
  psrt::fuzz::AddClusterSpecs(&corpus);
  psrt::fuzz::AddIdx(&corpus);
  psrt::fuzz::AddTFRecords(&corpus);
  psrt::fuzz::AddImages(&corpus);
  psrt::fuzz::AddSafetensorsAndCheckpoints(&corpus);
  psrt::fuzz::AddTableCheckpoint(&corpus);
  psrt::fuzz::AddFrames(&corpus);
  psrt::fuzz::AddSessions(&corpus);
  psrt::fuzz::AddDataplaneFrames(&corpus);
  return 0;
}
