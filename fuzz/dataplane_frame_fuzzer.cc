// Fuzzes the data-plane receive path (dataplane/frame_connection.h) that a
// parameter server runs on whatever connects to its data port: the input is
// a byte stream written into one end of a socket pair, read back as frames
// by a FrameConnection on the other, each frame's data in odd-sized pieces,
// until the stream ends or is refused. Every header that decodes must
// re-encode to the very bytes it came from.
//
// Input: byte data-limit exponent (limit = 2^(byte % 24)), then the stream
// (at most 64 KiB, so that it fits the socket's buffer).
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "dataplane/frame.h"
#include "dataplane/frame_connection.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  psrt::fuzz::InitOnce();
  psrt::fuzz::InputReader in(data, size);
  const uint64_t limit = uint64_t{1} << (in.Byte() % 24);
  const absl::string_view stream = in.Rest().substr(0, 64 * 1024);

  int fds[2];
  CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  const int sndbuf = 256 * 1024;
  setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  CHECK_EQ(write(fds[1], stream.data(), stream.size()), static_cast<ssize_t>(stream.size()));
  close(fds[1]);  // The reader then sees the end of the stream.
  psrt::dataplane::FrameConnection connection(fds[0], "the fuzzer", limit);

  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  size_t offset = 0;  // Where the next header starts in the stream.
  std::vector<char> piece(977);
  while (true) {
    psrt::dataplane::FrameHeader header;
    std::string meta;
    if (!connection.ReceiveHeader(&header, &meta, deadline).ok()) break;
    CHECK_LE(offset + psrt::dataplane::kFrameHeaderBytes + meta.size(), stream.size());
    char encoded[psrt::dataplane::kFrameHeaderBytes];
    psrt::dataplane::EncodeFrameHeader(header, encoded);
    CHECK(std::memcmp(encoded, stream.data() + offset, sizeof(encoded)) == 0);
    CHECK_EQ(header.data_size, connection.data_left());
    CHECK_LE(header.data_size, limit);
    offset += sizeof(encoded);
    CHECK(meta == stream.substr(offset, meta.size()));
    offset += meta.size();
    bool whole = true;
    while (connection.data_left() > 0) {
      const size_t n = std::min<uint64_t>(connection.data_left(), piece.size());
      if (!connection.ReceiveData(absl::MakeSpan(piece.data(), n), deadline).ok()) {
        whole = false;
        break;
      }
      CHECK(absl::string_view(piece.data(), n) == stream.substr(offset, n));
      offset += n;
    }
    if (!whole) break;
  }
  return 0;
}
