#include "worker/ring/ring_schedule.h"

#include "common/status_macros.h"
#include "common/timeline.h"
#include "glog/logging.h"

namespace psrt {
namespace {

// Segment i of W of n elements: [i n / W, (i + 1) n / W).
template <class T>
absl::Span<T> Segment(absl::Span<T> data, int i, int w) {
  const size_t begin = data.size() * i / w;
  const size_t end = data.size() * (i + 1) / w;
  return data.subspan(begin, end - begin);
}

int Mod(int a, int w) { return ((a % w) + w) % w; }

absl::Span<char> AsBytes(absl::Span<float> floats) {
  return {reinterpret_cast<char*>(floats.data()), floats.size() * sizeof(float)};
}

}  // namespace

RingSchedule::RingSchedule(int rank, int size, RingTransport* transport, Timeline* timeline)
    : rank_(rank), size_(size), transport_(transport), timeline_(timeline) {
  CHECK(rank >= 0 && rank < size) << rank << " of " << size;
  CHECK(transport != nullptr);
}

absl::Status RingSchedule::Fail(absl::Status status) {
  if (failed_.ok()) failed_ = status;
  return failed_;
}

absl::Status RingSchedule::Join() {
  if (op_ > 0) return failed_;
  float one = 1;
  return Reduce(absl::MakeSpan(&one, 1));
}

absl::Status RingSchedule::AllreduceSum(absl::Span<float> data) {
  RETURN_IF_ERROR(Join());
  return Reduce(data);
}

absl::Status RingSchedule::Reduce(absl::Span<float> data) {
  RETURN_IF_ERROR(failed_);
  const int w = size_;
  const int r = rank_;
  if (w == 1) return absl::OkStatus();
  const int64_t op = ++op_;
  // Reduce-scatter: afterwards this worker holds the sum of segment r + 1;
  // then all-gather passes the reduced segments around.
  absl::Time phase_start = absl::Now();
  for (int s = 0; s < 2 * (w - 1); ++s) {
    const bool reducing = s < w - 1;
    if (s == w - 1 && timeline_ != nullptr) {
      timeline_->Record("reduce_scatter", "allreduce", phase_start, absl::Now(), op);
      phase_start = absl::Now();
    }
    const int send = reducing ? r - s : r + 1 - (s - (w - 1));
    std::unique_ptr<RingTransport::Send> sending =
        transport_->StartSend(op, s, AsBytes(Segment(data, Mod(send, w), w)));
    const absl::Status received =
        transport_->Receive(op, s, AsBytes(Segment(data, Mod(send - 1, w), w)), reducing);
    const absl::Status sent = transport_->FinishSend(std::move(sending), !received.ok());
    RETURN_IF_ERROR(Fail(received));
    RETURN_IF_ERROR(Fail(sent));
  }
  if (timeline_ != nullptr) {
    timeline_->Record("all_gather", "allreduce", phase_start, absl::Now(), op);
  }
  return absl::OkStatus();
}

absl::Status RingSchedule::Broadcast(absl::Span<char> data, int root) {
  RETURN_IF_ERROR(Join());
  CHECK(root >= 0 && root < size_);
  const int64_t op = ++op_;
  if (size_ == 1) return absl::OkStatus();
  if (rank_ != root) RETURN_IF_ERROR(Fail(transport_->Receive(op, 0, data, /*add=*/false)));
  if (Mod(rank_ + 1, size_) == root) return absl::OkStatus();
  return Fail(transport_->FinishSend(transport_->StartSend(op, 0, data), /*op_failed=*/false));
}

}  // namespace psrt
