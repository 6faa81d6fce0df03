#include "dataplane/hello.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace psrt {
namespace dataplane {
namespace {

// A hello's metadata (the credential) is at most this long.
constexpr uint32_t kMaxHelloBytes = 4096;

}  // namespace

absl::StatusOr<std::unique_ptr<FrameConnection>> ConnectWithHello(
    absl::Span<const std::string> addresses, const std::string& credential,
    uint64_t max_data_bytes, absl::Time deadline, std::string* accepted_text) {
  CHECK(!addresses.empty());
  absl::StatusOr<std::unique_ptr<FrameConnection>> opened;
  for (size_t i = 0; i < addresses.size(); ++i) {
    const bool last = i + 1 == addresses.size();
    opened = FrameConnection::Connect(addresses[i], max_data_bytes,
                                      last ? deadline : absl::InfinitePast());
    if (opened.ok()) break;
  }
  if (!opened.ok()) return absl::UnavailableError(opened.status().message());
  const std::string& address = (*opened)->peer();
  FrameHeader hello;
  hello.kind = FrameKind::kHello;
  if (absl::Status s = (*opened)->Send(hello, credential, {}, deadline); !s.ok()) return s;
  FrameHeader reply;
  std::string text;
  if (absl::Status s = (*opened)->ReceiveHeader(&reply, &text, deadline); !s.ok()) return s;
  if (reply.kind != FrameKind::kHelloReply || reply.data_size != 0) {
    return absl::DataLossError(
        absl::StrCat("data plane: ", address, " answered the hello with another frame"));
  }
  if (reply.status != 0) return absl::Status(static_cast<absl::StatusCode>(reply.status), text);
  if (accepted_text != nullptr) *accepted_text = std::move(text);
  return opened;
}

absl::Status AnswerHello(FrameConnection* connection,
                         const std::function<absl::Status(absl::string_view credential)>& check,
                         absl::Time deadline, absl::string_view accepted_text) {
  FrameHeader hello;
  std::string credential;
  connection->set_max_meta_bytes(kMaxHelloBytes);  // Little, before the token.
  if (absl::Status s = connection->ReceiveHeader(&hello, &credential, deadline); !s.ok()) {
    return s;
  }
  connection->set_max_meta_bytes(kMaxMetaBytes);
  absl::Status accepted = hello.kind == FrameKind::kHello && hello.data_size == 0
                              ? check(credential)
                              : absl::InvalidArgumentError(
                                    "the first frame of a data-plane connection must be a hello");
  FrameHeader reply;
  reply.kind = FrameKind::kHelloReply;
  reply.request_id = hello.request_id;
  reply.status = static_cast<uint32_t>(accepted.code());
  if (absl::Status s =
          connection->Send(reply, accepted.ok() ? accepted_text : accepted.message(), {}, deadline);
      !s.ok()) {
    return s;
  }
  return accepted;
}

}  // namespace dataplane
}  // namespace psrt
