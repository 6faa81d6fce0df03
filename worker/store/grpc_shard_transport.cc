#include "worker/store/grpc_shard_transport.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/rpc_util.h"
#include "common/tensor_frame.h"
#include "glog/logging.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/byte_buffer.h"

namespace psrt {
namespace {

struct MethodInfo {
  const char* name;
  bool request_is_frame;  // Else a plain message.
  bool reply_is_frame;
};

MethodInfo InfoOf(PsMethod method) {
  switch (method) {
    case PsMethod::kInit:
      return {"/psrt.proto.ParameterServer/Init", true, false};
    case PsMethod::kPull:
      return {"/psrt.proto.ParameterServer/Pull", false, true};
    case PsMethod::kPush:
      return {"/psrt.proto.ParameterServer/Push", true, false};
    case PsMethod::kGetStatus:
      return {"/psrt.proto.ParameterServer/GetStatus", false, false};
    case PsMethod::kShutdown:
      return {"/psrt.proto.ParameterServer/Shutdown", false, false};
    case PsMethod::kSave:
      return {"/psrt.proto.ParameterServer/Save", false, false};
    case PsMethod::kRestore:
      return {"/psrt.proto.ParameterServer/Restore", false, false};
    case PsMethod::kSetMembers:
      return {"/psrt.proto.ParameterServer/SetMembers", false, false};
  }
  LOG(FATAL) << "unknown method " << static_cast<int>(method);
}

uint64_t VarintBytes(uint64_t v) {
  uint64_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

// A received reply: a tensor frame (its header, then its data in the
// received slices) or a plain message.
class GrpcReply final : public ShardReply {
 public:
  GrpcReply(const grpc::ByteBuffer& response, bool is_frame)
      : response_(response), is_frame_(is_frame) {}

  absl::Status ParseMeta(google::protobuf::MessageLite* meta) override {
    if (!is_frame_) return ParseFromByteBuffer(response_, meta);
    absl::Status opened = reader_.Open(response_, meta);
    opened_ = opened.ok();
    return opened;
  }
  uint64_t data_size() const override { return opened_ ? reader_.size() : 0; }
  const ByteSource* in_memory() const override { return opened_ ? &reader_ : nullptr; }
  absl::Status ReadData(absl::Span<char> dst) override {
    if (read_ + dst.size() > data_size()) {
      return absl::InternalError(absl::StrCat("the reply carries ", data_size(),
                                              " bytes of data, fewer than read"));
    }
    reader_.ReadAt(read_, dst);
    read_ += dst.size();
    return absl::OkStatus();
  }
  uint64_t wire_bytes() const override { return response_.Length(); }

 private:
  const grpc::ByteBuffer& response_;
  const bool is_frame_;
  TensorFrameReader reader_;
  bool opened_ = false;
  uint64_t read_ = 0;
};

// One call. `done` runs when it completes; destroying the attempt waits
// until gRPC has released the request's memory, which it may hold until the
// call's context is gone.
class GrpcAttempt final : public ShardAttempt {
 public:
  explicit GrpcAttempt(ShardTransport::Done done)
      : context_(std::make_unique<grpc::ClientContext>()), done_(std::move(done)) {}
  ~GrpcAttempt() override {
    context_.reset();
    request_.Clear();
    released_->WaitForNotification();
  }
  void Cancel() override { context_->TryCancel(); }

  // The request as a frame whose release this attempt waits for.
  void SetFrame(const ShardRequest& request) {
    request_ = EncodeTensorFrame(*request.meta, request.data,
                                 [released = released_] { released->Notify(); });
  }
  // The request as a plain message (nothing to release).
  void SetMessage(const ShardRequest& request) {
    CHECK(request.data.empty()) << "a plain message carries no tensors";
    request_ = SerializeToByteBuffer(*request.meta);
    released_->Notify();
  }
  // Runs `done` from this thread's stack: it may wake the caller, which then
  // destroys the attempt while `done` is still returning.
  void Finish(absl::Status status) {
    const ShardTransport::Done done = std::move(done_);
    done(std::move(status));
  }

  grpc::ClientContext& context() { return *context_; }
  grpc::ByteBuffer* request() { return &request_; }
  grpc::ByteBuffer* response() { return &response_; }

 private:
  std::unique_ptr<grpc::ClientContext> context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  // Shared with the frame's release, which may run on gRPC's thread.
  const std::shared_ptr<absl::Notification> released_ = std::make_shared<absl::Notification>();
  ShardTransport::Done done_;
};

}  // namespace

void GrpcShardTransport::AddShard(std::shared_ptr<grpc::Channel> channel, int stripe) {
  stubs_.push_back(std::make_unique<grpc::GenericStub>(std::move(channel)));
  stripes_.push_back(std::to_string(stripe));
}

std::unique_ptr<ShardAttempt> GrpcShardTransport::Start(int shard, PsMethod method,
                                                        const ShardRequest& request,
                                                        absl::Time deadline,
                                                        const OnReply& on_reply, Done done) {
  const MethodInfo info = InfoOf(method);
  auto attempt = std::make_unique<GrpcAttempt>(std::move(done));
  GrpcAttempt* a = attempt.get();
  if (info.request_is_frame) {
    a->SetFrame(request);
  } else {
    a->SetMessage(request);
  }
  a->context().set_deadline(absl::ToChronoTime(deadline));
  a->context().AddMetadata(kStripeMetadata, stripes_[shard]);
  stubs_[shard]->UnaryCall(
      &a->context(), info.name, grpc::StubOptions(), a->request(), a->response(),
      [a, shard, &on_reply, reply_is_frame = info.reply_is_frame](grpc::Status status) {
        if (!status.ok()) return a->Finish(FromGrpcStatus(status));
        absl::Status replied;
        {
          GrpcReply reply(*a->response(), reply_is_frame);
          replied = on_reply(shard, reply);
        }
        a->Finish(std::move(replied));  // Last: the attempt may go now.
      });
  return attempt;
}

uint64_t GrpcShardTransport::WireBytes(const ShardRequest& request) const {
  const uint64_t meta = request.meta->ByteSizeLong();
  if (request.data.empty()) return meta;
  uint64_t data = 0;
  for (const absl::Span<const char>& piece : request.data) data += piece.size();
  return 1 + VarintBytes(meta) + meta + 1 + VarintBytes(data) + data;
}

}  // namespace psrt
