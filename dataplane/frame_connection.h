// FrameConnection: one stream socket (TCP, or an abstract Unix socket on one
// host) carrying data-plane frames (frame.h); FrameListener accepts them.
//
// Sending gathers the header, the metadata and the caller's tensor memory
// with sendmsg, without copying them into a buffer of ours; receiving reads
// a frame's data straight into the caller's memory (ReceiveData), in as
// many pieces as the caller has destinations. Nothing is allocated per
// frame but the metadata string.
//
// Every call takes a deadline (DeadlineExceeded past it). A peer that closes
// the connection, or resets it, mid-frame is Unavailable naming the peer and
// how far the frame had come; bytes that are not a frame are DataLoss. After
// any error the connection is broken: close it.
//
// Thread safety: one thread sends and one thread receives at a time (they
// may be two threads). Shutdown may be called from any thread: it wakes a
// blocked call, which then fails with Cancelled.
#ifndef PSRT_DATAPLANE_FRAME_CONNECTION_H_
#define PSRT_DATAPLANE_FRAME_CONNECTION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "dataplane/frame.h"

namespace psrt {
namespace dataplane {

// A new abstract Unix socket address for the data plane of a task (a ps,
// or an allreduce worker) whose gRPC port is `task_port`:
// "unix-abstract:psrt-data-PORT-RANDOM", a name no other process holds,
// which its peers learn from the task over gRPC and reach only from its
// host (its network namespace).
std::string NewLocalDataPlaneAddress(int task_port);

class FrameConnection {
 public:
  // Takes a connected stream socket; `peer` names the other end in errors.
  // Frames whose data exceed `max_data_bytes` are refused.
  FrameConnection(int fd, std::string peer, uint64_t max_data_bytes);
  ~FrameConnection();
  FrameConnection(const FrameConnection&) = delete;
  FrameConnection& operator=(const FrameConnection&) = delete;

  // Connects to "host:port" (TCP) or "unix-abstract:NAME", retrying a
  // refused connection until `deadline` (the server may still be starting).
  static absl::StatusOr<std::unique_ptr<FrameConnection>> Connect(const std::string& address,
                                                                  uint64_t max_data_bytes,
                                                                  absl::Time deadline);

  // Sends one frame: `header` with its meta_size and data_size set from
  // `meta` and `data`, then the metadata, then the data pieces in order.
  absl::Status Send(FrameHeader header, absl::string_view meta,
                    absl::Span<const absl::Span<const char>> data, absl::Time deadline);

  // Receives the next frame's header and metadata. Its data must then be
  // read (ReceiveData, SkipData) before the next ReceiveHeader.
  absl::Status ReceiveHeader(FrameHeader* header, std::string* meta, absl::Time deadline);
  // Waits until the next frame begins to arrive (or the peer closes: the
  // next ReceiveHeader then says so). Past `deadline` DeadlineExceeded, and
  // unlike every other call the connection is not broken by it.
  // REQUIRES: the current frame's data is read.
  absl::Status WaitForFrame(absl::Time deadline);
  // The next into.size() bytes of the current frame's data.
  // REQUIRES: into.size() <= data_left().
  absl::Status ReceiveData(absl::Span<char> into, absl::Time deadline);
  // Reads and drops the next n bytes of the current frame's data.
  absl::Status SkipData(uint64_t n, absl::Time deadline);
  // The current frame's data not read yet.
  uint64_t data_left() const { return data_left_; }
  // A send or receive failed: the stream may be out of step; close it.
  bool broken() const { return broken_; }
  // Metadata longer than this is refused (DataLoss) by ReceiveHeader; at
  // most kMaxMetaBytes (the default). A server lowers it until the peer has
  // said hello.
  void set_max_meta_bytes(uint32_t n) { max_meta_bytes_ = n; }

  // Wakes a blocked call (it fails with Cancelled); later calls fail too.
  void Shutdown();

  // Blocks until `wake_fd` is readable (true), or the peer closes or resets
  // the connection or Shutdown is called (false). Data that arrives does not
  // wake it: it is for a server whose request waits while nothing is read
  // (`wake_fd`: an eventfd that the request's answer writes).
  bool WaitForCloseOr(int wake_fd) const;

  const std::string& peer() const { return peer_; }

 private:
  // Waits until the socket is readable (POLLIN) or writable (POLLOUT).
  absl::Status Wait(short events, absl::Time deadline, absl::string_view what);
  // Reads exactly into.size() bytes; `what` names them in errors.
  absl::Status ReadFully(absl::Span<char> into, absl::Time deadline, absl::string_view what);
  // Unavailable naming the peer and `what` (Cancelled after Shutdown); marks
  // the connection broken.
  absl::Status Broken(absl::string_view what, int error);

  const int fd_;
  const std::string peer_;
  const uint64_t max_data_bytes_;
  std::atomic<bool> shut_down_{false};
  uint64_t data_left_ = 0;
  bool broken_ = false;
  uint32_t max_meta_bytes_ = kMaxMetaBytes;
};

class FrameListener {
 public:
  // Listens on "host:port" (port 0: any free one) or "unix-abstract:NAME".
  static absl::StatusOr<std::unique_ptr<FrameListener>> Listen(const std::string& address);
  ~FrameListener();
  FrameListener(const FrameListener&) = delete;
  FrameListener& operator=(const FrameListener&) = delete;

  // The address it listens on, with the port chosen.
  const std::string& address() const { return address_; }

  // Blocks until a peer connects (its connection, with max_data_bytes as in
  // FrameConnection), or Shutdown (Cancelled).
  absl::StatusOr<std::unique_ptr<FrameConnection>> Accept(uint64_t max_data_bytes);

  // Wakes a blocked Accept; later ones fail too.
  void Shutdown();

 private:
  FrameListener(int fd, int wake_fd, std::string address)
      : fd_(fd), wake_fd_(wake_fd), address_(std::move(address)) {}

  const int fd_;
  const int wake_fd_;  // An eventfd that Shutdown writes (shutdown() wakes no
                       // poll on a listening socket).
  const std::string address_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace dataplane
}  // namespace psrt

#endif  // PSRT_DATAPLANE_FRAME_CONNECTION_H_
