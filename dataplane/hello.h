// The hello that opens every data-plane connection: the client's first
// frame carries its credential (TransportSecurity::DataPlaneCredential),
// and the server answers with a hello reply, accepted (status 0) or why
// not, before it reads anything else from that peer.
//
// Thread safety: functions of one connection, from its one thread.
#ifndef PSRT_DATAPLANE_HELLO_H_
#define PSRT_DATAPLANE_HELLO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "dataplane/frame_connection.h"

namespace psrt {
namespace dataplane {

// Connects to the first of `addresses` that takes the connection
// (FrameConnection::Connect) and says hello with `credential`. Each address
// but the last is tried once (a server's Unix socket, absent from another
// host, refuses at once); the last is retried until `deadline`. A
// connection that cannot be made is Unavailable; a refused hello is the
// server's error. `accepted_text`, when given, gets the text of an accepted
// reply. REQUIRES: !addresses.empty().
absl::StatusOr<std::unique_ptr<FrameConnection>> ConnectWithHello(
    absl::Span<const std::string> addresses, const std::string& credential,
    uint64_t max_data_bytes, absl::Time deadline, std::string* accepted_text = nullptr);

// The server's side: reads the hello (its metadata limited to a few KiB
// until it is accepted), asks `check` about the credential, and answers
// (with `accepted_text` when it accepts). Returns check's verdict, or why
// the hello could not be read or answered.
absl::Status AnswerHello(FrameConnection* connection,
                         const std::function<absl::Status(absl::string_view credential)>& check,
                         absl::Time deadline, absl::string_view accepted_text = "");

}  // namespace dataplane
}  // namespace psrt

#endif  // PSRT_DATAPLANE_HELLO_H_
